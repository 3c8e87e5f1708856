"""Recording what an ended job left: its artifacts, then its end.

Reading a job's output may take long (hashing up to the limits, `PORTAL_ARTIFACTS_MAX_FILES` and
`PORTAL_ARTIFACTS_MAX_BYTES`), so it is never done inside a database transaction, nor by the
scheduler loop or a request. A job whose processes ended is marked (`artifacts_pending_since`,
apps/jobs/actions.py); with workers (`PORTAL_WORKLOAD_TRIGGER=task`) a task on the provision queue
collects (workers/tasks.py), and without them the process that recorded the end does, once its
transaction committed (`JobKind.ended`).

A collection claims the job with a conditional update, lists and hashes with no transaction open
(files past the limits are counted by their apparent size and never read), and writes the rows,
then the end of a job that exited, in one short transaction. One lost with its worker is asked for
again by the reconcile loop's upkeep once `LOST_AFTER_S` passed; were two to run, the one that
claimed last writes.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from apps.jobs import actions
from apps.jobs.models import Job
from apps.scheduling.trigger import request_artifacts
from workers.backends.base import ArtifactLimits, Artifacts, BackendError
from workers.backends.registry import backend_for

logger = logging.getLogger(__name__)

LOST_AFTER_S = 600.0  # a collection claimed this long ago and not recorded was lost with its worker
RESUMED_PER_PASS = 100


def limits() -> ArtifactLimits:
    return ArtifactLimits(max_files=settings.PORTAL_ARTIFACTS_MAX_FILES, max_bytes=settings.PORTAL_ARTIFACTS_MAX_BYTES)


def collect(job_id: int) -> Job | None:
    """Record the artifacts of a job that waits for them (and then its end, if its processes
    exited): safe to run twice, or concurrently. Returns the job, or None if it waited for none."""
    claim = _claim(job_id)
    if claim is None:
        return None
    job = Job.objects.select_related("workspace", "cluster").get(pk=job_id)
    found, problem = _gather(job)
    files = found.files if found is not None else []
    note = problem or (found.note() if found is not None else "")
    return actions.record_job_artifacts(job, files, note=note, claim=claim)


def _claim(job_id: int) -> datetime | None:
    """Take the job's waiting artifacts (a conditional update, committed at once): the claim's time."""
    since = Job.objects.filter(pk=job_id).values_list("artifacts_pending_since", flat=True).first()
    if since is None:
        return None
    now = timezone.now()
    taken = Job.objects.filter(pk=job_id, artifacts_pending_since=since).update(artifacts_pending_since=now)
    return now if taken else None


def _gather(job: Job) -> tuple[Artifacts | None, str]:
    """List and hash the job's artifacts through its backend (no transaction open); or why not."""
    if job.backend_state is None or job.cluster is None:
        return None, ""
    try:
        return backend_for(job.cluster, job.backend_state).artifacts(limits()), ""
    except (BackendError, OSError) as exc:
        logger.warning("could not read the artifacts of job %s", job.pk, exc_info=True)
        return None, f"artifacts not collected: they could not be read ({exc})"


def resume_lost() -> int:
    """Ask again for the collections claimed (or asked for) more than `LOST_AFTER_S` ago: to a
    worker where there are workers, else here. How many."""
    before = timezone.now() - timedelta(seconds=LOST_AFTER_S)
    rows = Job.objects.filter(artifacts_pending_since__lt=before).order_by("artifacts_pending_since")
    resumed = 0
    for pk, since in rows.values_list("pk", "artifacts_pending_since")[:RESUMED_PER_PASS]:
        if settings.PORTAL_WORKLOAD_TRIGGER != "task":
            collect(pk)
        elif Job.objects.filter(pk=pk, artifacts_pending_since=since).update(artifacts_pending_since=timezone.now()):
            request_artifacts(pk)  # asked once per LOST_AFTER_S, however often this loop runs
        resumed += 1
    return resumed
