"""State changes reach the workspace's WebSocket through the real channel layer."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from apps.jobs.actions import check_submit_job
from portal.routing import websocket_urlpatterns
from tests.personas import World


async def _connect(user: Any, workspace: str) -> tuple[WebsocketCommunicator, bool]:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/workspaces/{workspace}/")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    return communicator, connected


def test_it_pushes_a_submitted_job_to_members(tx_world: World) -> None:
    async def scenario() -> dict[str, Any]:
        communicator, connected = await _connect(tx_world.bob, "team-a")
        assert connected
        job = await database_sync_to_async(check_submit_job)(
            tx_world.team_a, name="hello", command="true", acting_user=tx_world.bob
        )
        message = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return {"message": message, "job": job.pk}

    result = async_to_sync(scenario)()
    assert result["message"]["kind"] == "job"
    assert result["message"]["id"] == result["job"]


def test_it_refuses_another_tenants_workspace_like_a_missing_one(tx_world: World) -> None:
    async def scenario() -> tuple[bool, bool]:
        _, other = await _connect(tx_world.charlie, "team-a")
        _, missing = await _connect(tx_world.charlie, "no-such-workspace")
        return other, missing

    assert async_to_sync(scenario)() == (False, False)
