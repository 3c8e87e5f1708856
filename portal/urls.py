from django.contrib import admin
from django.http import HttpRequest, HttpResponseRedirect
from django.templatetags.static import static
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from apps.monitoring import views as metrics
from portal import views


def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """Browsers ask for /favicon.ico whatever the page links: send them to the icon every page links."""
    return HttpResponseRedirect(static("web/favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon, name="favicon"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("console/", include("apps.console.urls")),
    path("api/v1/", include("apps.api.urls")),
    path("", include("apps.compute.urls")),
    path("", include("apps.rayclusters.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    path("", include("apps.web.urls")),
]

handler404 = views.not_found
handler500 = views.server_error
