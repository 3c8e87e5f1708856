from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from apps.monitoring import views as metrics
from portal import views

urlpatterns = [
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
