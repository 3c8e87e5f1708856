"""Celery tasks: ids in, one action or engine call, safe to run twice."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import connection


@shared_task(name="portal.ping")
def ping() -> dict[str, Any]:
    """A round-trip check: the worker answers with the database it reaches."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {"pong": True, "database": str(connection.settings_dict["NAME"])}


@shared_task(name="portal.schedule_cycle", ignore_result=True)
def schedule_cycle() -> dict[str, Any]:
    """Run one scheduling cycle. Cycles serialise on a lock, so duplicates are harmless."""
    from apps.scheduling.adapter import run_cycle

    result = run_cycle()
    return {"admitted": result.admitted, "pending": result.pending}
