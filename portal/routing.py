from django.urls import path

from apps.workspaces.consumers import WorkspaceConsumer

websocket_urlpatterns = [
    path("ws/workspaces/<str:name>/", WorkspaceConsumer.as_asgi()),
]
