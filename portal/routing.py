from django.urls import path

from apps.workspaces.consumers import ConsoleConsumer, InstanceConsumer, WorkspaceConsumer

websocket_urlpatterns = [
    path("ws/workspaces/<str:name>/", WorkspaceConsumer.as_asgi()),
    path("ws/instances/<int:pk>/", InstanceConsumer.as_asgi()),
    path("ws/console/", ConsoleConsumer.as_asgi()),
]
