"""Live updates for someone an instance is shared with: their page's socket hears that instance and
its notebooks, nothing else of the workspace, and closes (4403) with the first message after they
are removed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from apps.compute.actions import do_delete_notebook
from apps.compute.collaborators import do_remove_collaborator
from apps.jobs.actions import check_submit_job
from apps.workspaces.live import heartbeat
from portal.routing import websocket_urlpatterns
from tests.api.test_collaborators import Shared
from tests.personas import World


async def _open(user: Any, path: str) -> tuple[WebsocketCommunicator, bool]:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    return communicator, connected


def test_a_collaborator_hears_the_shared_instance_alone_until_removed(tx_world: World) -> None:
    world = tx_world
    shared = Shared(world)
    other = shared.instance.__class__.objects.create(workspace=world.team_a, name="other", profile=world.cpu_small)

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        refused = []
        for path in ("/ws/workspaces/team-a/", f"/ws/instances/{other.pk}/", "/ws/console/"):
            communicator, connected = await _open(shared.wendy, path)
            await communicator.disconnect()
            refused.append(connected)
        seen["refused"] = refused
        page, connected = await _open(shared.wendy, f"/ws/instances/{shared.instance.pk}/")
        assert connected
        # Work elsewhere in the workspace: not a word of it.
        await database_sync_to_async(check_submit_job)(
            world.team_a, name="private", command="true", acting_user=world.alice
        )
        seen["elsewhere"] = await page.receive_nothing(timeout=1)
        # Its notebook stopped: heard.
        await database_sync_to_async(do_delete_notebook)(shared.notebook, acting_user=world.alice)
        seen["notebook"] = await page.receive_json_from(timeout=10)
        # Removed: the next message after the consumer's one-second memory closes the socket.
        await database_sync_to_async(do_remove_collaborator)(shared.write, acting_user=world.alice)
        await asyncio.sleep(1.1)
        await database_sync_to_async(heartbeat)()
        outputs = []
        while True:
            output = await page.receive_output(timeout=10)
            outputs.append(output)
            if output["type"] == "websocket.close":
                break
        seen["after"] = outputs
        await page.disconnect()
        return seen

    seen = async_to_sync(scenario)()
    assert seen["refused"] == [False, False, False]
    assert seen["elsewhere"] is True
    assert (seen["notebook"]["kind"], seen["notebook"]["id"]) == ("notebook", shared.notebook.pk)
    assert seen["after"][-1] == {"type": "websocket.close", "code": 4403}
    heard = [json.loads(o["text"])["kind"] for o in seen["after"][:-1]]
    assert set(heard) <= {"collaborator", "notebook"}, heard  # nothing after the removal but its own news
