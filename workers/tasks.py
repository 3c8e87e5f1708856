"""Celery tasks: ids in, one action or engine call, safe to run twice.

Tasks are thin: each calls what runs the work, and nothing below imports them; actions ask for
them by name (apps/scheduling/trigger.py).

Tasks go to one of two queues (``route``, named by ``CELERY_TASK_ROUTES``), each with workers of
its own, so that something slow never holds up something quick:

- ``celery``, the default: scheduling cycles and starts of jobs on this machine, a fraction of a
  second each. Its worker must never wait on anything that can take seconds.
- ``provision``: whatever can wait seconds to minutes on something else. A notebook profile's
  environment build (pip), the shared environments built ahead of any start, instance and notebook
  starts (waiting for the server to answer, for Slurm to run a batch job, for Kubernetes pods), job
  starts on Slurm and Kubernetes (they return once the job runs), stops (they wait out a workload's
  grace period), an ended job's artifacts (read and hashed, up to the limits), and an admin's
  what-if replay (seconds to minutes of simulation).
"""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from celery.utils.log import get_task_logger
from django.conf import settings
from django.db import connection

from apps.compute.hosting import build_notebook_environment as build_environment
from apps.compute.hosting import prebuild_environments as prebuild
from apps.jobs import artifacts
from apps.jobs.models import Job
from apps.monitoring.cycles import timed_cycle
from apps.scheduling import whatif
from apps.scheduling.trigger import request_prebuild
from apps.workloads import host
from workers.backends.base import BackendError

logger = get_task_logger(__name__)


#: The tasks that always go to the ``provision`` queue.
PROVISIONING = frozenset(
    {
        "portal.build_notebook_environment",
        "portal.prebuild_environments",
        "portal.collect_artifacts",
        "portal.whatif_replay",
    }
)


def route(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any], **_: Any
) -> dict[str, str] | None:
    """The queue of a task about to be sent (a Celery router): see the module's docstring. A
    workload's convergence goes to ``provision``, but for the start of a job on this machine."""
    if name in PROVISIONING:
        return {"queue": settings.PROVISION_QUEUE}
    if name == "portal.converge" and len(args) == 2:
        if args[0] == "job":
            quick = Job.objects.filter(pk=args[1], state=Job.State.ADMITTED, cluster__kind="local").exists()
            if quick:
                return None
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
    result = timed_cycle()
    return {"admitted": result.admitted, "pending": result.pending}


@shared_task(
    name="portal.converge",
    ignore_result=True,
    autoretry_for=(BackendError,),  # only transient ones reach here
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=5,
)
def converge(kind: str, pk: int) -> None:
    """Do what a workload's state asks of its backend: start it, stop it, or record what became
    of it (apps/workloads/host.py)."""
    logger.info("converging %s %s", kind, pk)
    host.converge(kind, pk)


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
    build_environment(notebook_id)


@shared_task(name="portal.prebuild_environments", ignore_result=True)
def prebuild_environments(profile_ids: list[int] | None = None) -> list[str]:
    """Build the shared environments before anyone waits for them (apps/compute/hosting.py): when
    a provisioning worker starts, and when a notebook profile is published."""
    return prebuild(profile_ids)


@worker_ready.connect
def _prebuild_when_ready(sender: Any = None, **_: Any) -> None:
    """A worker that takes the ``provision`` queue asks for the shared environments as it starts
    (a portal's first start, or one after its SDK or profiles changed): the first job or notebook
    then finds them built, or being built, rather than building them itself."""
    consumer = getattr(sender, "task_consumer", None)
    queues = {queue.name for queue in getattr(consumer, "queues", None) or []}
    if settings.PROVISION_QUEUE in queues and settings.PORTAL_PREBUILD_ENVIRONMENTS:
        request_prebuild()


@shared_task(name="portal.collect_artifacts", ignore_result=True)
def collect_artifacts(job_id: int) -> None:
    """Record what an ended job left, within the limits, and then its end (apps/jobs/artifacts.py)."""
    artifacts.collect(job_id)


@shared_task(name="portal.whatif_replay", ignore_result=True)
def whatif_replay(replay_id: int) -> None:
    """Run an admin's what-if replay of the portal's history (apps/scheduling/whatif.py): it reads
    history and settings and writes only its own row."""
    whatif.run_replay(replay_id)
