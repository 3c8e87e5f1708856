"""`GET /metrics`: the portal's metrics in Prometheus' text format, for a scraper that presents
`Authorization: Bearer <PORTAL_METRICS_TOKEN>`. Without a token configured, the route is off (404);
a wrong or missing token gets a 401 and nothing else."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from apps.monitoring.metrics import registry


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.PORTAL_METRICS_TOKEN
    if not token:
        return HttpResponse("Metrics are off: set PORTAL_METRICS_TOKEN.\n", status=404, content_type="text/plain")
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not constant_time_compare(presented.strip(), token):
        response = HttpResponse("A bearer token is needed.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
