"""Celery tasks: ids in, one action or engine call, safe to run twice."""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task
from django.db import connection

from workers.backends.base import BackendError


@shared_task(name="portal.ping")
def ping() -> dict[str, Any]:
    """A round-trip check: the worker answers with the database it reaches."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {"pong": True, "database": str(connection.settings_dict["NAME"])}


# When this process last began a cycle (wall clock, as `requested_at` is).
_cycle_began_at = 0.0


@shared_task(name="portal.schedule_cycle", ignore_result=True)
def schedule_cycle(requested_at: float | None = None) -> dict[str, Any]:
    """Run one scheduling cycle, unless this process began one after the request was made: that
    cycle's snapshot already held the change behind it. A burst of submissions queues one request
    each; they cost one cycle per cycle's length, not one each. Cycles serialise on a lock."""
    global _cycle_began_at
    from apps.scheduling.adapter import run_cycle

    if requested_at is not None and requested_at < _cycle_began_at:
        return {"coalesced": True}
    _cycle_began_at = time.time()
    result = run_cycle()
    return {"admitted": result.admitted, "pending": result.pending}


@shared_task(
    name="portal.start_job",
    ignore_result=True,
    autoretry_for=(BackendError,),  # do_start_job raises only transient ones
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=5,
)
def start_job(job_id: int) -> None:
    """Start an admitted job on its backend (transient backend errors are retried with backoff)."""
    from apps.jobs.running import do_start_job

    do_start_job(job_id)


@shared_task(name="portal.sync_job", ignore_result=True)
def sync_job(job_id: int) -> None:
    """Converge one job with its backend (stop a cancelled or preempted one, record an exit)."""
    from apps.jobs.running import do_sync_job

    do_sync_job(job_id)


@shared_task(
    name="portal.converge_instance",
    ignore_result=True,
    autoretry_for=(BackendError,),  # only transient ones reach here
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=5,
)
def converge_instance(instance_id: int) -> None:
    """Start, check or tear down an instance, as its state asks."""
    from apps.compute.running import converge_instance

    converge_instance(instance_id)


@shared_task(
    name="portal.converge_notebook",
    ignore_result=True,
    autoretry_for=(BackendError,),
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=5,
)
def converge_notebook(notebook_id: int) -> None:
    """Start, check or stop a notebook server, as its state asks."""
    from apps.compute.running import converge_notebook

    converge_notebook(notebook_id)


@shared_task(name="portal.reconcile", ignore_result=True)
def reconcile() -> dict[str, int]:
    """Converge every job, instance and notebook with its backend, and start what was lost."""
    from apps.compute.running import reconcile_compute
    from apps.jobs.running import reconcile_jobs

    return {**reconcile_jobs(), **reconcile_compute()}
