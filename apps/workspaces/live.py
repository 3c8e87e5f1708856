"""Pushing state changes to browsers over Channels, once the change is committed."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)


def group_name(workspace_id: int) -> str:
    return f"workspace.{workspace_id}"


def notify(workspace_id: int, kind: str, payload: dict[str, Any]) -> None:
    """Send {"kind": ..., **payload} to every socket watching the workspace, after commit."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(
                group_name(workspace_id), {"type": "state.changed", "kind": kind, "payload": payload}
            )
        except Exception:  # a live update is best effort; the page's next load is the truth
            logger.warning("could not push a live update for workspace %s", workspace_id, exc_info=True)

    transaction.on_commit(send)
