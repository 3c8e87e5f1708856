from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness and database reachability, for process supervisors and load balancers."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        return JsonResponse({"status": "error", "database": "unreachable"}, status=503)
    return JsonResponse({"status": "ok"})


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404 in the API's error shape under /api/ (a path no route matches, such as an id that is not
    a number), else the portal's page (templates/404.html)."""
    if request.path.startswith("/api/"):
        body = {"error": {"status": 404, "code": "not_found", "message": "No such resource."}}
        return JsonResponse(body, status=404)
    return defaults.page_not_found(request, exception or Exception())


def server_error(request: HttpRequest) -> HttpResponse:
    """500 in the API's error shape under /api/, else the portal's page (templates/500.html),
    rendered without the request's context: whatever failed may be what the context needs."""
    if request.path.startswith("/api/"):
        body = {"error": {"status": 500, "code": "server_error", "message": "The portal hit an error; it is logged."}}
        return JsonResponse(body, status=500)
    return defaults.server_error(request)
