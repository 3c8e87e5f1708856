"""Celery tasks: ids in, one action or engine call, safe to run twice.

Tasks are thin: each calls what runs the work, and nothing below imports them; actions ask for
them by name (apps/scheduling/trigger.py).

Tasks go to one of two queues (``route``, named by ``CELERY_TASK_ROUTES``), each with workers of
its own, so that something slow never holds up something quick:

- ``celery``, the default: scheduling cycles and starts of jobs on this machine, a fraction of a
  second each. Its worker must never wait on anything that can take seconds.
- ``provision``: whatever can wait seconds to minutes on something else. A notebook profile's
  environment build (pip), instance and notebook starts (waiting for the server to answer, for
  Slurm to run a batch job, for Kubernetes pods), job starts on Slurm and Kubernetes (they return
  once the job runs), and stops (they wait out a workload's grace period).
"""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import connection

from apps.compute import running as compute
from apps.jobs import running as jobs
from apps.jobs.models import Job
from apps.scheduling.adapter import run_cycle
from workers.backends.base import BackendError

_PROVISION_TASKS = frozenset(
    {
        "portal.sync_job",
        "portal.converge_instance",
        "portal.converge_notebook",
        "portal.build_notebook_environment",
    }
)


def route(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any], **_: Any
) -> dict[str, str] | None:
    """The queue of a task about to be sent (a Celery router): see the module's docstring. A job's
    start goes to the quick queue if its cluster is this machine, to ``provision`` otherwise."""
    if name in _PROVISION_TASKS:
        return {"queue": settings.PROVISION_QUEUE}
    if name == "portal.start_job" and args:
        kind = Job.objects.filter(pk=args[0]).values_list("cluster__kind", flat=True).first()
        if kind is not None and kind != "local":
            return {"queue": settings.PROVISION_QUEUE}
    return None  # the default queue


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
    jobs.do_start_job(job_id)


@shared_task(name="portal.sync_job", ignore_result=True)
def sync_job(job_id: int) -> None:
    """Converge one job with its backend (stop a cancelled or preempted one, record an exit)."""
    jobs.do_sync_job(job_id)


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
    compute.converge_instance(instance_id)


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
    compute.converge_notebook(notebook_id)


@shared_task(
    name="portal.build_notebook_environment",
    ignore_result=True,
    autoretry_for=(BackendError,),  # pip failed or timed out: transient
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=5,
)
def build_notebook_environment(notebook_id: int) -> None:
    """Build the Python environment a notebook waits for; its start follows as a task of its own."""
    compute.build_notebook_environment(notebook_id)
