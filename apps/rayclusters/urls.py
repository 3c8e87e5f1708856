"""The Ray dashboard sign-in handoff: the browser's side, on the portal's own origin."""

from django.urls import path

from apps.rayclusters import views_auth

app_name = "rayclusters"

urlpatterns = [
    path("ray-clusters/authorize/<str:label>/", views_auth.authorize, name="authorize"),
]
