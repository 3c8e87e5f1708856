"""Asking the worker for work once the current transaction commits: a scheduling cycle, a
workload's convergence with its backend (a start, a stop, a check), a notebook environment's build.

Tasks are named here, never imported: this module sits below everything that runs them
(workers/tasks.py), so that the flow runs one way. Each request goes the way its setting says:

- ``task`` (production): sent to the broker, for a worker;
- ``inline`` (the test switch): the same task run in this process (Celery's eager ``apply``), so
  that tests run the code production runs;
- ``off``: nothing is sent; the scheduler loop's periodic cycle and reconcile pick the change up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)

# The tasks' names (workers/tasks.py defines them).
SCHEDULE_CYCLE = "portal.schedule_cycle"
CONVERGE = "portal.converge"
BUILD_NOTEBOOK_ENVIRONMENT = "portal.build_notebook_environment"
COLLECT_ARTIFACTS = "portal.collect_artifacts"
PREBUILD_ENVIRONMENTS = "portal.prebuild_environments"


def request_cycle() -> None:
    """Called by every action that changes demand or supply (submit, finish, quota change)."""
    # When the request was sent: a cycle that began later already saw the change (coalescing).
    _on_commit(settings.PORTAL_SCHEDULER_TRIGGER, SCHEDULE_CYCLE, lambda: (time.time(),))


def request_workload(kind: str, pk: int) -> None:
    """Once committed, have the worker converge a workload of `kind` ("job", "instance",
    "notebook") with its backend: start it, stop it, or record what became of it."""
    _on_commit(settings.PORTAL_WORKLOAD_TRIGGER, CONVERGE, lambda: (kind, pk))


def request_environment_build(notebook_id: int) -> None:
    """Once committed, have a worker build a starting notebook's environment (a task of its own,
    on the provision queue, which asks for the notebook's start again once built)."""
    _on_commit(settings.PORTAL_WORKLOAD_TRIGGER, BUILD_NOTEBOOK_ENVIRONMENT, lambda: (notebook_id,))


def request_prebuild(profile_ids: list[int] | None = None) -> None:
    """Once committed, have a provisioning worker build the shared environments ahead of any start
    (the SDK's and the published notebook profiles'; ``profile_ids``: only these profiles')."""
    _on_commit(settings.PORTAL_WORKLOAD_TRIGGER, PREBUILD_ENVIRONMENTS, lambda: (profile_ids,))


def request_artifacts(job_id: int) -> None:
    """Once committed, have a worker record what an ended job left (its artifacts, then its end:
    apps/jobs/artifacts.py), on the provision queue."""
    _on_commit(settings.PORTAL_WORKLOAD_TRIGGER, COLLECT_ARTIFACTS, lambda: (job_id,))


def _on_commit(mode: str, name: str, args: Callable[[], tuple[Any, ...]]) -> None:
    if mode == "off":
        return

    def send() -> None:
        if mode == "inline":
            run_here(name, *args())
            return
        try:
            current_app.send_task(name, args=args())  # routed by workers.tasks.route
        except Exception:  # the scheduler loop catches up if the broker is briefly away
            logger.warning("could not queue %s%s; the scheduler loop will catch up", name, args(), exc_info=True)

    transaction.on_commit(send)


def run_here(name: str, *args: Any) -> Any:
    """Run a task by name in this process, as a worker would run it (retries included); its
    exception, if any, is raised here."""
    if name not in current_app.tasks:
        current_app.loader.import_default_modules()  # CELERY_IMPORTS: the tasks module
    return current_app.tasks[name].apply(args=args, throw=True).get()
