"""Running admitted jobs on their cluster's backend, and converging jobs to the backend's truth.

The worker calls `do_start_job` when a job is admitted and `do_sync_job` from the periodic
reconcile. The backend's state blob lives in `job.backend_state["run"]`, so a restarted worker
reattaches to processes that kept running.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.accounts.tokens import workload_env
from apps.audit.actions import do_log_event
from apps.audit.events import JOB_ENDS, Event
from apps.inventory.models import Allocation
from apps.jobs.actions import do_requeue_job, do_requeue_unready_job, unready_backoff_s
from apps.jobs.models import Artifact, Job, JobAttempt
from apps.scheduling.backoff import RECONCILE
from apps.scheduling.trigger import request_cycle
from apps.workloads import claims
from apps.workspaces.live import notify
from apps.workspaces.unix import run_as_for
from workers.backends.base import Backend, BackendError, JobSpec, PolicyRefusal
from workers.backends.files import open_inside
from workers.backends.registry import backend_for

logger = logging.getLogger(__name__)

STOP_GRACE_S = 10.0


def work_dir() -> Path:
    return Path(settings.PORTAL_WORK_DIR)


def _spec(job: Job) -> JobSpec:
    devices: dict[int, list[str]] = defaultdict(list)
    for replica, index in (
        Allocation.objects.filter(job=job).order_by("replica", "gpu__index").values_list("replica", "gpu__index")
    ):
        devices[replica].append(str(index))
    return JobSpec(
        key=f"job-{job.pk}",
        workspace=job.workspace.name,
        name=job.name,
        command=job.command,
        work_dir=str(work_dir() / job.workspace.name),
        image=job.image or None,
        env=dict(job.env),
        replicas=job.replicas,
        devices=[devices.get(r, []) for r in range(job.replicas)] if job.gpus_per_replica else [],
        cpu_cores=float(job.cpu_cores),
        memory_gb=float(job.memory_gb),
        max_runtime_s=float(job.max_runtime_s) if job.max_runtime_s else None,
        artifact_paths=list(job.artifact_paths),
        run_as=run_as_for(job.workspace, job.cluster),
        portal_env=workload_env(job),  # the SDK and CLI work in the job, acting for its submitter
    )


def _backend(job: Job) -> Backend:
    return backend_for(job.cluster, job.backend_state.get("run", {}))


def _end(job: Job, state: str, *, exit_code: int | None, reason: str) -> None:
    """Record a job's end: its outcome, its attempt, its GPUs back, a cycle for what waits."""
    now = timezone.now()
    Allocation.objects.filter(job=job).delete()
    job.state = state
    job.exit_code = exit_code
    job.finished_at = now
    job.failure_reason = reason[:2000] if state == Job.State.FAILED else ""
    if state == Job.State.SUCCEEDED:
        job.progress = 1.0  # done is all of it, whatever the job last printed
    job.attempt_set.filter(finished_at__isnull=True).update(
        finished_at=now, exit_code=exit_code, outcome=state.lower(), reason=reason[:2000]
    )
    job.save()
    do_log_event(JOB_ENDS[state], job, workspace=job.workspace, data={"exit_code": exit_code, "reason": reason})
    live = {"id": job.pk, "state": job.state, "exit_code": exit_code, "progress": job.progress}
    notify(job.workspace_id, "job", live)
    request_cycle()


def do_start_job(job_id: int) -> Job | None:
    """Start an admitted job on its cluster; returns once its processes run.

    The job is claimed, not locked, while its backend starts it (apps/workloads/claims.py): a
    cancel, a preemption or a scheduling cycle never waits on a backend. A start that does not
    return within ``PORTAL_GANG_READY_TIMEOUT_S`` is stopped and the job requeued with backoff, as
    a gang that did not become ready is; a refusal or a permanent backend error is stopped, cleared
    and fails the job with the message; a transient one is stopped, cleared and raised for the
    task to retry.
    """
    timeout_s = float(settings.PORTAL_GANG_READY_TIMEOUT_S)
    token = claims.claim(Job, job_id, (Job.State.ADMITTED,), timeout_s)
    if token is None:
        return Job.objects.filter(pk=job_id).first()  # cancelled, preempted, started or being started
    job = Job.objects.select_related("workspace", "cluster").get(pk=job_id)
    backend = backend_for(job.cluster)
    try:
        endpoint = claims.start_within(backend, _spec(job), timeout_s)
    except (PolicyRefusal, BackendError, claims.StartTimedOut) as exc:
        claims.stop_and_clear(backend, f"job {job_id}", STOP_GRACE_S)
        if isinstance(exc, claims.StartTimedOut):
            claims.release(Job, job_id, token)
            return requeue_unready(job_id)
        if isinstance(exc, BackendError) and not exc.permanent:
            claims.release(Job, job_id, token)
            raise
        reason = str(exc) if isinstance(exc, PolicyRefusal) else f"could not start: {exc}"
        return _fail_start(job_id, token, reason)
    with transaction.atomic():
        job = Job.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=job_id)
        if not claims.holds(job, token) or job.state != Job.State.ADMITTED:
            # cancelled, preempted or requeued while it started: what started is stopped
            claims.stop_and_clear(backend, f"job {job_id}", STOP_GRACE_S)
            return job
        now = timezone.now()
        job.state = Job.State.RUNNING
        job.started_at = now
        job.attempts += 1
        job.wait_reason = ""
        job.backend_state = {**claims.without(job.backend_state, "starting"), "run": backend.get_state()}
        job.save()
        JobAttempt.objects.create(job=job, number=job.attempts, started_at=now)
        do_log_event(
            Event.JOB_START,
            job,
            workspace=job.workspace,
            data={"attempt": job.attempts, "endpoint": f"{endpoint.host}:{endpoint.port}"},
        )
        notify(job.workspace_id, "job", {"id": job.pk, "state": job.state})
    return job


def _fail_start(job_id: int, token: str, reason: str) -> Job:
    with transaction.atomic():
        job = Job.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=job_id)
        if claims.holds(job, token) and job.state == Job.State.ADMITTED:
            job.backend_state = claims.without(job.backend_state, "starting")
            _end(job, Job.State.FAILED, exit_code=None, reason=reason)
    return job


def requeue_unready(job_id: int) -> Job | None:
    """Requeue an admitted job that is not running in time, with backoff doubling per requeue
    (the scheduler loop's check, and a start that overran its timeout)."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return None
    timeout_s = settings.PORTAL_GANG_READY_TIMEOUT_S
    return do_requeue_unready_job(job, timeout_s=timeout_s, backoff_s=unready_backoff_s(job))


def _record_artifacts(job: Job, backend: Backend) -> None:
    for artifact in backend.artifacts():
        Artifact.objects.update_or_create(
            job=job, path=artifact.path, defaults={"size_bytes": artifact.size, "sha256": artifact.sha256}
        )


def do_sync_job(job_id: int) -> Job | None:
    """Converge one job with its backend: record an exit, stop a cancelled or preempted one.

    The backend is asked (a poll, a stop that waits out a grace period) with no row locked; what it
    said is recorded in a short transaction, if the job is still as it was."""
    job = Job.objects.select_related("workspace", "cluster").filter(pk=job_id).first()
    if job is None or not job.backend_state.get("run") or job.backend_state.get("stopped"):
        return job
    run = job.backend_state["run"]
    backend = _backend(job)
    if job.state in (Job.State.CANCELLED, Job.State.PREEMPTED):
        grace = float(job.backend_state.get("preempt", {}).get("grace_s", 0.0)) or STOP_GRACE_S
        backend.stop(grace)
        with transaction.atomic():
            job = Job.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=job_id)
            if job.backend_state.get("run") != run or job.backend_state.get("stopped"):
                return job
            _record_artifacts(job, backend)
            job.backend_state = {**job.backend_state, "run": backend.get_state(), "stopped": True}
            job.save(update_fields=["backend_state"])
            if job.state == Job.State.PREEMPTED:
                return do_requeue_job(job, reason=job.wait_reason or "preempted", outcome="preempted")
            notify(job.workspace_id, "job", {"id": job.pk, "state": job.state})
        return job
    if job.state != Job.State.RUNNING:
        return job
    status = backend.poll()
    progress = backend.progress()
    with transaction.atomic():
        job = Job.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=job_id)
        if job.state != Job.State.RUNNING or job.backend_state.get("run") != run:
            return job  # cancelled or preempted meanwhile: the next sync stops it
        if status.running:
            if progress is not None and progress.fraction is not None and progress.fraction != job.progress:
                job.progress = progress.fraction
                job.save(update_fields=["progress"])
                notify(job.workspace_id, "job", {"id": job.pk, "state": job.state, "progress": job.progress})
            return job
        _record_artifacts(job, backend)
        job.backend_state = {**job.backend_state, "run": backend.get_state(), "stopped": True}
        if progress is not None and progress.fraction is not None:
            job.progress = progress.fraction
        outcome = Job.State.SUCCEEDED if status.exit_code == 0 else Job.State.FAILED
        _end(job, outcome, exit_code=status.exit_code, reason=status.message)
    return job


def reconcile_jobs() -> dict[str, int]:
    """Poll every job a backend may hold, and start admitted jobs whose start was lost (a worker
    that died, a broker message dropped). One that fails is logged and retried next time."""
    counts = {"started": 0, "synced": 0, "failed": 0}
    lost = timezone.now() - timedelta(seconds=settings.PORTAL_START_LOST_AFTER_S)
    unstarted = Job.objects.filter(state=Job.State.ADMITTED, admitted_at__lt=lost).exclude(backend_state__has_key="run")
    live = Job.objects.filter(state__in=[Job.State.RUNNING, Job.State.PREEMPTED, Job.State.CANCELLED])
    live = live.filter(backend_state__has_key="run").exclude(
        backend_state__has_key="stopped"
    )  # not a value test: SQLite drops rows without the key
    for action, name, ids in (
        (do_start_job, "started", unstarted.values_list("pk", flat=True)),
        (do_sync_job, "synced", live.values_list("pk", flat=True)),
    ):
        for job_id in ids:
            if not RECONCILE.due("job", job_id):
                continue
            try:
                action(job_id)
                counts[name] += 1
                RECONCILE.succeeded("job", job_id)
            except Exception:  # per object, with backoff: one broken job must not wedge the loop
                counts["failed"] += 1
                delay = RECONCILE.failed("job", job_id)
                logger.exception("reconcile of job %s failed; retrying in %.0f s", job_id, delay)
    return counts


def job_logs(job: Job, replica: int = 0, offset: int = 0) -> tuple[bytes, int]:
    """A job's log from `offset` on, while it runs and after it ended."""
    if not job.backend_state.get("run"):
        return b"", offset
    return _backend(job).logs(replica, offset)


def artifact_file(job: Job, path: str) -> BinaryIO | None:
    """One recorded artifact, opened for reading (only a regular file really inside the job's
    directory: never what a link planted there points to), or None."""
    run: dict[str, Any] = job.backend_state.get("run", {})
    if not run.get("job_dir") or not job.artifacts.filter(path=path).exists():
        return None
    return open_inside(run["job_dir"], path)


def stop_local_jobs(reason: str = "the portal stopped") -> int:
    """Stop every job running on this machine and put it back in line (the embedded portal's
    shutdown: it leaves no process behind, and the jobs run again at the next start)."""
    stopped = 0
    running = Job.objects.filter(state=Job.State.RUNNING, cluster__kind="local", backend_state__has_key="run")
    for job in running.select_related("cluster"):
        _backend(job).stop(STOP_GRACE_S)
        do_requeue_job(job, reason=reason)
        stopped += 1
    return stopped
