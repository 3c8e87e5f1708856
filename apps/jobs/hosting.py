"""Jobs as a kind of workload of the host (apps/workloads/host.py).

An admitted job is started; a running one is watched until it exits (its progress recorded on
the way), and its end is recorded once its artifacts are (apps/jobs/artifacts.py); a cancelled or
preempted one is stopped, and a preempted one then goes back in line. Its backend state is kept
once it stopped, so that its logs and artifacts stay readable.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.db.models import Q

from apps.accounts.tokens import workload_env
from apps.inventory.models import Allocation
from apps.jobs import actions, artifacts
from apps.jobs.models import Job
from apps.provisioning.models import backend_reservation
from apps.workloads.host import STOP_GRACE_S, Kind, Phase
from apps.workspaces.disks import disk_for
from apps.workspaces.unix import run_as_for
from workers.backends.base import Endpoint, JobSpec, Progress, Status
from workers.backends.files import open_inside


def work_dir() -> Path:
    return Path(settings.PORTAL_WORK_DIR)


class JobKind(Kind):
    name = "job"
    model = Job
    start_states = (Job.State.ADMITTED,)
    live_states = Job.ACTIVE_STATES
    keeps_state_after_stop = True

    def phase(self, row: Job) -> Phase | None:
        if row.state == Job.State.ADMITTED:
            return Phase.START
        if row.backend_state is None or row.backend_stopped:
            return None
        if row.state == Job.State.RUNNING:
            return Phase.WATCH
        if row.state in (Job.State.CANCELLED, Job.State.PREEMPTED):
            return Phase.STOP
        return None

    def due(self, lost_before: datetime) -> Iterable[int]:
        live = Q(state__in=[Job.State.RUNNING, Job.State.PREEMPTED, Job.State.CANCELLED], backend_stopped=False)
        lost = Q(state=Job.State.ADMITTED, admitted_at__lt=lost_before)
        rows = Job.objects.filter((live & Q(backend_state__isnull=False)) | lost)
        return rows.values_list("pk", flat=True)

    def start_timeout_s(self) -> float:
        # Past it a gang did not become ready: it goes back in line, with backoff.
        return float(settings.PORTAL_GANG_READY_TIMEOUT_S)

    def grace_s(self, row: Job) -> float:
        return float(row.stop_grace_s or 0.0) or STOP_GRACE_S

    def spec(self, job: Job) -> JobSpec:
        devices: dict[int, list[str]] = defaultdict(list)
        allocations = Allocation.objects.filter(workload=job).order_by("replica", "gpu__index")
        for replica, index in allocations.values_list("replica", "gpu__index"):
            devices[replica].append(str(index))
        return JobSpec(
            key=self.key(job.pk),
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
            disk=disk_for(job.workspace, job.cluster),
            reservation=backend_reservation(job),
            portal_env=workload_env(job),  # the SDK and CLI work in the job, acting for its submitter
        )

    def record_start(self, row: Job, endpoint: Endpoint, *, restarted: bool) -> None:
        actions.record_job_start(row, endpoint=f"{endpoint.host}:{endpoint.port}")

    def record_start_failure(self, row: Job, reason: str, *, timed_out: bool) -> None:
        if timed_out:  # a gang not ready in time: back in line, with doubling backoff
            row.save(update_fields=["start_claim"])
            actions.do_requeue_unready_job(
                row, timeout_s=settings.PORTAL_GANG_READY_TIMEOUT_S, backoff_s=actions.unready_backoff_s(row)
            )
        else:
            actions.record_job_end(row, Job.State.FAILED, exit_code=None, reason=reason)

    def record_progress(self, row: Job, progress: Progress | None) -> None:
        if progress is not None and progress.fraction is not None:
            actions.record_job_progress(row, progress.fraction)

    def changes(self, row: Job, progress: Progress | None, observed: Any) -> bool:
        """Only progress that moved is written while a job runs (``record_job_progress``)."""
        return progress is not None and progress.fraction is not None and progress.fraction != row.progress

    def record_exit(self, row: Job, status: Status, progress: Progress | None) -> None:
        # Its end is recorded with its artifacts, read once this transaction committed (`ended`).
        if progress is not None and progress.fraction is not None:
            row.progress = progress.fraction
        actions.record_job_exit(row, exit_code=status.exit_code, reason=status.message)

    def record_stop(self, row: Job, ran: bool) -> None:
        actions.record_job_stop(row, ran=ran)

    def ended(self, row: Job) -> None:
        """Without workers, this process records the artifacts it marked waiting (with them, a
        task does: apps/jobs/artifacts.py)."""
        if row.artifacts_pending_since is not None and settings.PORTAL_WORKLOAD_TRIGGER != "task":
            artifacts.collect(row.pk)

    def upkeep(self) -> dict[str, int]:
        """Ask again for artifacts whose collection was lost (a worker that died meanwhile)."""
        return {"artifacts_resumed": artifacts.resume_lost()}

    def record_host_stop(self, row: Job) -> None:
        row.save()
        if not row.is_final:  # a running or preempted job runs again at the next start
            actions.do_requeue_job(row, reason="the portal stopped")


def artifact_file(job: Job, path: str) -> BinaryIO | None:
    """One recorded artifact, opened for reading (only a regular file really inside the job's
    directory: never what a link planted there points to), or None."""
    state: dict[str, Any] = job.backend_state or {}
    if not state.get("job_dir") or not job.artifacts.filter(path=path).exists():
        return None
    return open_inside(state["job_dir"], path)
