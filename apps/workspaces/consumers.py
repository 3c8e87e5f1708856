"""Live state changes of one workspace's instances, notebooks and jobs, over a WebSocket."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.workspaces.access import restrict
from apps.workspaces.live import CONSOLE_GROUP, HEARTBEAT_GROUP, group_name
from apps.workspaces.models import Workspace


class WorkspaceConsumer(AsyncJsonWebsocketConsumer):
    group: str | None = None

    @database_sync_to_async
    def _visible_workspace_id(self, name: str) -> int | None:
        user = self.scope.get("user")
        return restrict(Workspace.objects.filter(name=name), user).values_list("pk", flat=True).first()

    async def connect(self) -> None:
        workspace_id = await self._visible_workspace_id(self.scope["url_route"]["kwargs"]["name"])
        if workspace_id is None:
            await self.close(code=4404)  # unknown, or another tenant's: the same to the client
            return
        self.group = group_name(workspace_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.channel_layer.group_add(HEARTBEAT_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            await self.channel_layer.group_discard(HEARTBEAT_GROUP, self.channel_name)

    async def state_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": event["kind"], **event["payload"]})


class ConsoleConsumer(AsyncJsonWebsocketConsumer):
    """Every workspace's state changes, for the admin console: platform admins only."""

    joined = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if not (user is not None and user.is_authenticated and user.is_staff and user.is_active):
            await self.close(code=4403)
            return
        for group in (CONSOLE_GROUP, HEARTBEAT_GROUP):
            await self.channel_layer.group_add(group, self.channel_name)
        self.joined = True
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.joined:
            for group in (CONSOLE_GROUP, HEARTBEAT_GROUP):
                await self.channel_layer.group_discard(group, self.channel_name)

    async def state_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": event["kind"], **event["payload"]})
