"""The notebook sign-in handoff: the browser's side on the portal's origin, the servers' side internal."""

from django.urls import path

from apps.compute import views

app_name = "compute"

urlpatterns = [
    path("notebooks/authorize/<str:label>/", views.authorize, name="notebook-authorize"),
    path("internal/notebooks/<int:pk>/", views.server_config, name="notebook-server-config"),
    path("internal/notebooks/<int:pk>/code/", views.redeem_code, name="notebook-redeem-code"),
    path("internal/notebooks/<int:pk>/users/<str:username>/", views.check_user, name="notebook-check-user"),
]
