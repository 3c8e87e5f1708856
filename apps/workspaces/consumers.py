"""Live state changes of one workspace's instances, notebooks and jobs, over a WebSocket; and of
one instance and its notebooks, for whom it is shared with (its collaborators).

Access is checked when the socket opens and again before each message it would send (the answer
kept for at most `RECHECK_S`): a member removed, a user deactivated or whose password changed, an
admin no longer one, gets no further message: the socket is closed (4403) instead."""

from __future__ import annotations

import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import HASH_SESSION_KEY, get_user_model
from django.utils.crypto import constant_time_compare

from apps.workspaces.access import restrict
from apps.workspaces.live import CONSOLE_GROUP, HEARTBEAT_GROUP, group_name, instance_group_name
from apps.workspaces.models import Workspace

RECHECK_S = 1.0


def _active_user(scope: dict[str, Any]) -> Any:
    """The socket's user as the database has them now: None once deactivated, or once their password
    changed since the session began (which ends their sessions, as Django's pages do)."""
    user = scope.get("user")
    if user is None or not user.is_authenticated:
        return None
    now = get_user_model().objects.filter(pk=user.pk, is_active=True).first()
    session = scope.get("session")
    if now is not None and session is not None:
        held = session.get(HASH_SESSION_KEY) or ""
        if not constant_time_compare(held, now.get_session_auth_hash()):
            return None
    return now


class _Rechecked(AsyncJsonWebsocketConsumer):
    """A consumer that asks `allowed()` again before it sends, at most every `RECHECK_S`."""

    checked_until = 0.0
    refused = False
    # The groups joined, left at the end or on refusal (not Channels' own `groups`, which it joins
    # and leaves by itself: these are known only once access was checked).
    joined: tuple[str, ...] = ()

    def allowed(self) -> bool:
        """Whether the socket's user may still hear it; each consumer says, and no one may by default."""
        return False

    async def join(self, *groups: str) -> None:
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self.joined = groups

    async def leave(self) -> None:
        groups, self.joined = self.joined, ()
        for group in groups:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        await self.leave()

    async def state_changed(self, event: dict[str, Any]) -> None:
        if self.refused:
            return
        now = time.monotonic()
        if now >= self.checked_until:
            if not await database_sync_to_async(self.allowed)():
                self.refused = True
                await self.leave()  # no more messages for this socket, whether or not the client goes
                await self.close(code=4403)
                return
            self.checked_until = now + RECHECK_S
        await self.send_json({"kind": event["kind"], **event["payload"]})


class WorkspaceConsumer(_Rechecked):
    workspace_id: int | None = None

    @database_sync_to_async
    def _visible_workspace_id(self, name: str) -> int | None:
        user = self.scope.get("user")
        return restrict(Workspace.objects.filter(name=name), user).values_list("pk", flat=True).first()

    async def connect(self) -> None:
        workspace_id = await self._visible_workspace_id(self.scope["url_route"]["kwargs"]["name"])
        if workspace_id is None:
            await self.close(code=4404)  # unknown, or another tenant's: the same to the client
            return
        self.workspace_id = workspace_id
        await self.join(group_name(workspace_id), HEARTBEAT_GROUP)
        await self.accept()

    def allowed(self) -> bool:
        user = _active_user(self.scope)
        return user is not None and restrict(Workspace.objects.filter(pk=self.workspace_id), user).exists()


class InstanceConsumer(_Rechecked):
    """One instance's changes and its notebooks': for anyone who may see the instance, a
    collaborator it is shared with included (who hears nothing else of its workspace)."""

    instance_id: int | None = None

    def _visible(self, user: Any) -> bool:
        from apps.compute.models import Instance  # the compute app builds on this one

        return user is not None and restrict(Instance.objects.filter(pk=self.instance_id), user).exists()

    async def connect(self) -> None:
        self.instance_id = self.scope["url_route"]["kwargs"]["pk"]
        if not await database_sync_to_async(self._visible)(self.scope.get("user")):
            await self.close(code=4404)
            return
        await self.join(instance_group_name(self.instance_id), HEARTBEAT_GROUP)
        await self.accept()

    def allowed(self) -> bool:
        return self._visible(_active_user(self.scope))


class ConsoleConsumer(_Rechecked):
    """Every workspace's state changes, for the admin console: platform admins only."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if not (user is not None and user.is_authenticated and user.is_staff and user.is_active):
            await self.close(code=4403)
            return
        await self.join(CONSOLE_GROUP, HEARTBEAT_GROUP)
        await self.accept()

    def allowed(self) -> bool:
        user = _active_user(self.scope)
        return user is not None and user.is_staff
