"""Reading the real broker's queues in tests."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from portal.celery import app


def broker_key(queue: str) -> str:
    """The Redis list that holds `queue`'s messages: its name after this process's key prefix
    (PORTAL_REDIS_PREFIX; kombu prefixes the commands it sends itself, not a test's LRANGE)."""
    return str(app.conf.broker_transport_options.get("global_keyprefix", "")) + queue


def queued(*queues: str) -> list[dict[str, Any]]:
    """The messages waiting in `queues`, in order, each as the broker holds it (headers, body)."""
    with app.connection_for_read() as connection:
        client = connection.default_channel.client
        return [json.loads(m) for queue in queues for m in client.lrange(broker_key(queue), 0, -1)]


@contextmanager
def own_queues(settings: Any) -> Iterator[tuple[str, str]]:
    """Quick and provision queues of the caller's own on the real broker, which no worker reads;
    emptied and given back afterwards (`settings`: pytest-django's fixture)."""
    quick, provision = f"test-quick-{uuid.uuid4().hex[:8]}", f"test-provision-{uuid.uuid4().hex[:8]}"
    default = app.conf.task_default_queue
    app.conf.task_default_queue, settings.PROVISION_QUEUE = quick, provision
    try:
        yield quick, provision
    finally:
        app.conf.task_default_queue = default
        with app.connection_for_write() as connection:
            connection.default_channel.client.delete(quick, provision)
