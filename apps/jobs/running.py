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
from apps.inventory.models import Allocation
from apps.jobs.models import Artifact, Job, JobAttempt
from apps.scheduling.backoff import RECONCILE
from apps.scheduling.trigger import request_cycle
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
    backend = backend_for(job.cluster)
    backend.load_state(job.backend_state.get("run", {}))
    return backend


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
    do_log_event(f"job.{state.lower()}", job, workspace=job.workspace, data={"exit_code": exit_code, "reason": reason})
    live = {"id": job.pk, "state": job.state, "exit_code": exit_code, "progress": job.progress}
    notify(job.workspace_id, "job", live)
    request_cycle()


def do_start_job(job_id: int) -> Job | None:
    """Start an admitted job on its cluster; returns once its processes run.

    A refusal or a permanent backend error fails the job with the message; a transient one is
    raised for the task to retry.
    """
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(of=("self",)).select_related("workspace", "cluster").filter(pk=job_id).first()
        )
        if job is None or job.state != Job.State.ADMITTED:
            return job  # cancelled, preempted or started meanwhile: nothing to do
        try:
            backend = backend_for(job.cluster)
            endpoint = backend.start(_spec(job))
        except PolicyRefusal as exc:
            _end(job, Job.State.FAILED, exit_code=None, reason=str(exc))
            return job
        except BackendError as exc:
            if not exc.permanent:
                raise
            _end(job, Job.State.FAILED, exit_code=None, reason=f"could not start: {exc}")
            return job
        now = timezone.now()
        job.state = Job.State.RUNNING
        job.started_at = now
        job.attempts += 1
        job.wait_reason = ""
        job.backend_state = {**job.backend_state, "run": backend.get_state()}
        job.save()
        JobAttempt.objects.create(job=job, number=job.attempts, started_at=now)
        do_log_event(
            "job.start",
            job,
            workspace=job.workspace,
            data={"attempt": job.attempts, "endpoint": f"{endpoint.host}:{endpoint.port}"},
        )
        notify(job.workspace_id, "job", {"id": job.pk, "state": job.state})
    return job


def _record_artifacts(job: Job, backend: Backend) -> None:
    for artifact in backend.artifacts():
        Artifact.objects.update_or_create(
            job=job, path=artifact.path, defaults={"size_bytes": artifact.size, "sha256": artifact.sha256}
        )


def do_sync_job(job_id: int) -> Job | None:
    """Converge one job with its backend: record an exit, stop a cancelled or preempted one."""
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(of=("self",)).select_related("workspace", "cluster").filter(pk=job_id).first()
        )
        if job is None or not job.backend_state.get("run") or job.backend_state.get("stopped"):
            return job
        backend = _backend(job)
        if job.state in (Job.State.CANCELLED, Job.State.PREEMPTED):
            grace = float(job.backend_state.get("preempt", {}).get("grace_s", 0.0)) or STOP_GRACE_S
            backend.stop(grace)
            _record_artifacts(job, backend)
            job.backend_state = {**job.backend_state, "run": backend.get_state(), "stopped": True}
            if job.state == Job.State.PREEMPTED:
                job.state = Job.State.QUEUED  # back in line, keeping its place
                job.admitted_at = job.started_at = None
                job.cluster = None
                job.backend_state = {k: v for k, v in job.backend_state.items() if k not in ("run", "stopped")}
                request_cycle()
            job.save()
            notify(job.workspace_id, "job", {"id": job.pk, "state": job.state})
            return job
        if job.state != Job.State.RUNNING:
            return job
        status = backend.poll()
        progress = backend.progress()
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
    for job_id in running.values_list("pk", flat=True):
        with transaction.atomic():
            job = Job.objects.select_for_update(of=("self",)).select_related("cluster").get(pk=job_id)
            _backend(job).stop(STOP_GRACE_S)
            Allocation.objects.filter(job=job).delete()
            job.attempt_set.filter(finished_at__isnull=True).update(
                finished_at=timezone.now(), outcome="interrupted", reason=reason
            )
            job.state = Job.State.QUEUED
            job.admitted_at = job.started_at = None
            job.cluster = None
            job.wait_reason = f"requeued: {reason}"
            job.backend_state = {k: v for k, v in job.backend_state.items() if k not in ("run", "stopped")}
            job.save()
            do_log_event("job.requeue", job, workspace=job.workspace, data={"reason": reason})
            stopped += 1
    return stopped
