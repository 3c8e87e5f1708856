"""Asking for a scheduling cycle once the current transaction commits."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)


def request_cycle() -> None:
    """Called by every action that changes demand or supply (submit, finish, quota change)."""
    mode = settings.PORTAL_SCHEDULER_TRIGGER
    if mode == "off":
        return
    if mode == "inline":
        from apps.scheduling.adapter import run_cycle

        transaction.on_commit(run_cycle)
        return

    def enqueue() -> None:
        from workers.tasks import schedule_cycle

        try:
            schedule_cycle.delay(time.time())
        except Exception:  # the periodic loop catches up if the broker is briefly away
            logger.warning("could not queue a scheduling cycle; the scheduler loop will run it", exc_info=True)

    transaction.on_commit(enqueue)


def request_job_sync(job_id: int, *, start: bool) -> None:
    """Once committed, have the worker start an admitted job (`start`) or converge it with its backend."""
    mode = settings.PORTAL_WORKLOAD_TRIGGER
    if mode == "off":
        return
    if mode == "inline":
        from apps.jobs.running import do_start_job, do_sync_job

        transaction.on_commit(lambda: (do_start_job if start else do_sync_job)(job_id))
        return

    def enqueue() -> None:
        from workers.tasks import start_job, sync_job

        try:
            (start_job if start else sync_job).delay(job_id)
        except Exception:  # the reconcile loop catches up if the broker is briefly away
            logger.warning("could not queue job %s for the worker; reconcile will", job_id, exc_info=True)

    transaction.on_commit(enqueue)


def request_workload(kind: str, pk: int) -> None:
    """Once committed, have the worker converge an instance or a notebook (`kind`) with its backend."""
    mode = settings.PORTAL_WORKLOAD_TRIGGER
    if mode == "off":
        return
    if mode == "inline":
        from apps.compute.running import converge_instance, converge_notebook

        converge = converge_instance if kind == "instance" else converge_notebook
        transaction.on_commit(lambda: converge(pk))
        return

    def enqueue() -> None:
        from workers.tasks import converge_instance, converge_notebook

        try:
            (converge_instance if kind == "instance" else converge_notebook).delay(pk)
        except Exception:  # the reconcile loop catches up if the broker is briefly away
            logger.warning("could not queue %s %s for the worker; reconcile will", kind, pk, exc_info=True)

    transaction.on_commit(enqueue)
