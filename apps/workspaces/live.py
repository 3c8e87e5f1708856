"""Pushing state changes to browsers over Channels, once the change is committed."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)


# Every live socket listens here too: the scheduler loop, another process, beats every
# HEARTBEAT_S through the channel layer, so a page shows "Live" only while updates made outside
# the web process actually reach it.
HEARTBEAT_GROUP = "live.heartbeat"
# The admin console hears every workspace's changes.
CONSOLE_GROUP = "live.console"
HEARTBEAT_S = 5.0


def group_name(workspace_id: int) -> str:
    return f"workspace.{workspace_id}"


def instance_group_name(instance_id: int) -> str:
    """One instance's changes (its own and its notebooks'), for those it is shared with."""
    return f"instance.{instance_id}"


def heartbeat() -> None:
    """One beat to every open page (from the scheduler loop)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(HEARTBEAT_GROUP, {"type": "state.changed", "kind": "heartbeat", "payload": {}})
    except Exception:  # best effort: pages then say they are not live
        logger.warning("could not send the live heartbeat", exc_info=True)


def notify(workspace_id: int, kind: str, payload: dict[str, Any], *, instance_id: int | None = None) -> None:
    """Send {"kind": ..., **payload} to every socket watching the workspace, after commit; and to
    those watching the instance, for a change of an instance (``kind`` "instance") or of something
    on one (``instance_id``)."""
    if instance_id is None and kind == "instance":
        instance_id = payload["id"]

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        message = {"type": "state.changed", "kind": kind, "payload": payload}
        try:
            async_to_sync(layer.group_send)(group_name(workspace_id), message)
            if instance_id is not None:
                async_to_sync(layer.group_send)(instance_group_name(instance_id), message)
            console = {**message, "payload": {**payload, "workspace_id": workspace_id}}
            async_to_sync(layer.group_send)(CONSOLE_GROUP, console)
        except Exception:  # a live update is best effort; the page's next load is the truth
            logger.warning("could not push a live update for workspace %s", workspace_id, exc_info=True)

    transaction.on_commit(send)
