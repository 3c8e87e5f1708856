"""State changes of jobs.

The ``record_*`` actions record what a job's backend did; the workload host
(apps/workloads/host.py, through apps/jobs/hosting.py) calls them on the row it locked, inside
its transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from apps.audit.actions import SYSTEM, Origin, do_log_event
from apps.audit.events import JOB_ENDS, Event
from apps.errors import ActionError, Conflict, LimitExceeded
from apps.inventory.models import Allocation, Cluster, Node
from apps.jobs.models import Artifact, Job, JobAttempt
from apps.scheduling.limits import check_request_size, check_runtime_limit, gpus_per_node, replica_slots
from apps.scheduling.trigger import request_artifacts, request_cycle, request_workload
from apps.workspaces.live import notify
from apps.workspaces.models import Workspace


def check_submit_job(
    workspace: Workspace,
    *,
    name: str,
    acting_user: Any,
    origin: Origin = SYSTEM,
    command: str = "",
    image: str = "",
    env: dict[str, str] | None = None,
    gpu_type: str = "",
    gpus_per_replica: Decimal = Decimal("0"),
    replicas: int = 1,
    cpu_cores: int = 1,
    memory_gb: int = 4,
    priority: int = 0,
    preemptible: bool = True,
    checkpointable: bool = False,
    max_runtime_s: int | None = None,
    artifact_paths: list[str] | None = None,
    description: str = "",
    requested_cluster: Cluster | None = None,
) -> Job:
    """Validate a job against the workspace's policies and hard limits, and queue it.

    The job waits in QUEUED until the scheduler admits the whole gang under the GPU quota, on
    `requested_cluster` (an enabled cluster whose nodes could hold it) or, without one, on any.
    """
    if not command and not image:
        raise ActionError("Give the job a command, an image, or both.", field="command")
    with transaction.atomic():
        workspace = read_policies(workspace)
        max_runtime_s = check_runtime_limit(workspace, max_runtime_s)
        check_request_size(
            workspace,
            gpu_type=gpu_type,
            gpus_per_replica=gpus_per_replica,
            replicas=replicas,
            cpu_cores=cpu_cores,
            memory_gb=memory_gb,
        )
        if requested_cluster is not None:
            check_cluster_fits(
                requested_cluster,
                gpu_type=gpu_type,
                gpus_per_replica=gpus_per_replica,
                replicas=replicas,
                cpu_cores=cpu_cores,
                memory_gb=memory_gb,
            )
        job = Job.objects.create(
            workspace=workspace,
            name=name,
            description=description,
            command=command,
            image=image,
            env=env or {},
            gpu_type=gpu_type if gpus_per_replica else "",
            gpus_per_replica=gpus_per_replica,
            replicas=replicas,
            cpu_cores=cpu_cores,
            memory_gb=memory_gb,
            priority=priority,
            preemptible=preemptible,
            checkpointable=checkpointable,
            max_runtime_s=max_runtime_s,
            artifact_paths=artifact_paths or [],
            requested_cluster=requested_cluster,
            created_by=acting_user if acting_user.is_authenticated else None,
        )
        do_log_event(
            Event.JOB_SUBMIT,
            job,
            acting_user=acting_user,
            origin=origin,
            workspace=workspace,
            data={
                "gpus": f"{replicas} x {gpus_per_replica} {gpu_type}".strip(),
                **({"cluster": requested_cluster.name} if requested_cluster is not None else {}),
            },
        )
        notify(workspace.pk, "job", {"id": job.pk, "state": job.state})
        request_cycle()
    return job


def read_policies(workspace: Workspace) -> Workspace:
    """The workspace's policies as of now, held (PostgreSQL's FOR SHARE) until the submission commits:
    an admin's change to them waits for the submission or is seen by it, while submissions to one
    workspace go on side by side (nothing in a submission counts other jobs)."""
    if connection.vendor != "postgresql":
        return Workspace.objects.get(pk=workspace.pk)  # SQLite: one writer at a time anyway
    table = Workspace._meta.db_table
    return Workspace.objects.raw(f'SELECT * FROM "{table}" WHERE id = %s FOR SHARE', [workspace.pk])[0]


def check_cluster_fits(
    cluster: Cluster, *, gpu_type: str, gpus_per_replica: Decimal, replicas: int, cpu_cores: int, memory_gb: int
) -> None:
    """Refuse a request for a cluster that is disabled, or whose nodes could never hold it: a replica
    larger than its largest node (GPUs; CPU cores and memory where the cluster reported them), a gang
    larger than all its nodes together, or on Slurm more replicas than nodes (one replica per node)."""
    if not Cluster.objects.filter(pk=cluster.pk, enabled=True).exists():
        raise ActionError(f"Cluster {cluster.name} is disabled.", field="cluster")
    nodes = Node.objects.filter(pool__cluster=cluster)
    for field, asked, unit in (("cpu_cores", cpu_cores, "CPU cores"), ("memory_gb", memory_gb, "GB of memory")):
        largest = max(nodes.filter(**{f"{field}__gt": 0}).values_list(field, flat=True), default=None)
        if largest is not None and asked > largest:
            raise LimitExceeded(
                f"One replica asks for {asked} {unit}, but the largest node of cluster {cluster.name} has {largest}.",
                field=field,
            )
    if gpus_per_replica:
        _check_gpu_room(cluster, gpu_type=gpu_type, gpus_per_replica=gpus_per_replica, replicas=replicas)
    if cluster.kind == Cluster.Kind.SLURM:  # sbatch -N REPLICAS --ntasks-per-node=1
        if gpus_per_replica:
            nodes = nodes.filter(gpus__gpu_type=gpu_type).annotate(n=Count("gpus")).filter(n__gte=gpus_per_replica)
        able = nodes.count()
        if replicas > able:
            raise LimitExceeded(
                f"On cluster {cluster.name} each replica takes a node of its own, and {able} of its nodes could "
                f"hold one; ask for at most {able} replicas.",
                field="replicas",
            )


def _check_gpu_room(cluster: Cluster, *, gpu_type: str, gpus_per_replica: Decimal, replicas: int) -> None:
    sizes = gpus_per_node(gpu_type).get(cluster.pk, [])
    if not sizes:
        raise LimitExceeded(f"Cluster {cluster.name} has no {gpu_type} GPUs.", field="gpu_type")
    asked = f"{gpus_per_replica.normalize():f} {gpu_type} GPUs"
    if gpus_per_replica > max(sizes):
        raise LimitExceeded(
            f"One replica asks for {asked}, but the largest node of cluster {cluster.name} has {max(sizes)}.",
            field="gpus_per_replica",
        )
    room = replica_slots(sizes, gpus_per_replica)
    if replicas > room:
        raise LimitExceeded(
            f"This gang asks for {replicas} replicas of {asked} at once, but cluster {cluster.name} can hold "
            f"at most {room} of them.",
            field="replicas",
        )


def do_cancel_job(job: Job, *, acting_user: Any, origin: Origin = SYSTEM) -> Job:
    """Cancel a job that has not finished, releasing its GPUs."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.is_final:
            raise Conflict(f"Job {job.name} has already finished ({job.get_state_display().lower()}).")
        previous = job.state
        Allocation.objects.filter(workload=job).delete()
        job.state = Job.State.CANCELLED
        job.finished_at = timezone.now()
        job.attempt_set.filter(finished_at__isnull=True).update(
            finished_at=job.finished_at, outcome="cancelled", reason="cancelled on request"
        )
        job.wait_reason = ""
        job.workspace_queue_position = job.cluster_queue_position = None
        job.estimated_start_at = None
        job.save()
        do_log_event(
            Event.JOB_CANCEL,
            job,
            acting_user=acting_user,
            origin=origin,
            workspace=job.workspace,
            data={"previous_state": previous},
        )
        notify(job.workspace_id, "job", {"id": job.pk, "state": job.state})
        request_cycle()
        if previous == Job.State.RUNNING:
            request_workload("job", job.pk)  # the worker stops its processes
    return job


def do_preempt_job(
    job: Job, *, reason: str, grace_s: float = 0.0, acting_user: Any = None, origin: Origin = SYSTEM
) -> Job:
    """Evict an admitted or running job to make room for another (the scheduler's decision).

    Its GPUs go back at once. A job that never started is requeued at once, keeping its place;
    a running one stays PREEMPTED, with `grace_s` to checkpoint, until its backend has stopped it
    and the worker requeues it.
    """
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.state not in (Job.State.ADMITTED, Job.State.RUNNING):
            return job
        previous = job.state
        Allocation.objects.filter(workload=job).delete()
        _close_attempt(job, "preempted", reason)
        if job.started_at is None:
            back_in_line(job, f"requeued after preemption: {reason}")
        else:
            job.state = Job.State.PREEMPTED
            job.wait_reason = reason[:500]
            job.stop_grace_s = grace_s
        job.save()
        do_log_event(
            Event.JOB_PREEMPT,
            job,
            acting_user=acting_user,
            origin=origin,
            workspace=job.workspace,
            data={"reason": reason, "previous_state": previous, "grace_s": grace_s},
        )
        notify(job.workspace_id, "job", {"id": job.pk, "state": job.state, "wait_reason": job.wait_reason})
        if job.state == Job.State.PREEMPTED:
            request_workload("job", job.pk)  # the worker stops it, then requeues it
    return job


def unready_backoff_s(job: Job) -> float:
    """How long a gang that did not become ready waits before its next admission: doubling with
    each such requeue, up to PORTAL_GANG_BACKOFF_MAX_S."""
    requeues = job.unready_requeues
    return float(min(settings.PORTAL_GANG_BACKOFF_S * 2**requeues, settings.PORTAL_GANG_BACKOFF_MAX_S))


def do_requeue_unready_job(job: Job, *, timeout_s: int, backoff_s: float) -> Job:
    """Requeue an admitted gang that did not become ready (RUNNING) within `timeout_s`.

    Its GPUs go back; it keeps its place in the queue but is not admitted again before
    `backoff_s` has passed, so one broken gang cannot hold devices in a loop.
    """
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.state != Job.State.ADMITTED:
            return job
        requeues = job.unready_requeues + 1
        back_in_line(
            job,
            f"requeued: its {job.replicas} replica(s) were not all running {timeout_s} s after admission; "
            f"eligible again in {int(backoff_s)} s",
            backoff_s=backoff_s,
        )
        job.unready_requeues = requeues
        job.save()
        do_log_event(
            Event.JOB_REQUEUE,
            job,
            workspace=job.workspace,
            data={"reason": "not ready in time", "requeues": requeues, "backoff_s": backoff_s},
        )
        notify(job.workspace_id, "job", {"id": job.pk, "state": job.state, "wait_reason": job.wait_reason})
        request_cycle()
    return job


def do_requeue_job(job: Job, *, reason: str, outcome: str = "interrupted") -> Job:
    """Put a job whose run ended before its work did back in line, keeping its place: a preempted
    job once its backend stopped it, or a job the embedded portal stopped on its way down."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.is_final or job.state == Job.State.QUEUED:
            return job
        _close_attempt(job, outcome, reason)
        back_in_line(job, f"requeued: {reason}"[:500])
        job.save()
        do_log_event(Event.JOB_REQUEUE, job, workspace=job.workspace, data={"reason": reason})
        notify(job.workspace_id, "job", {"id": job.pk, "state": job.state, "wait_reason": job.wait_reason})
        request_cycle()
    return job


def back_in_line(job: Job, wait_reason: str, *, backoff_s: float = 0.0) -> None:
    """The one way a job goes back to QUEUED (the caller saves it): its GPUs and cluster given up,
    its run and any start under way forgotten, its place in the queue kept (its `seq`), and not
    admitted again before `backoff_s` has passed."""
    Allocation.objects.filter(workload=job).delete()
    job.state = Job.State.QUEUED
    job.admitted_at = job.started_at = None
    job.cluster = None
    job.wait_reason = wait_reason[:500]
    if backoff_s:
        job.eligible_at = timezone.now() + timedelta(seconds=backoff_s)
    job.backend_state = job.start_claim = job.stop_grace_s = None
    job.backend_stopped = False


def _close_attempt(job: Job, outcome: str, reason: str) -> None:
    job.attempt_set.filter(finished_at__isnull=True).update(
        finished_at=timezone.now(), outcome=outcome, reason=reason[:2000]
    )


def record_job_start(job: Job, *, endpoint: str) -> None:
    """Its processes run (the host set its backend state): a new attempt begins."""
    now = timezone.now()
    job.state = Job.State.RUNNING
    job.started_at = now
    job.attempts += 1
    job.wait_reason = ""
    job.save()
    JobAttempt.objects.create(job=job, number=job.attempts, started_at=now)
    do_log_event(Event.JOB_START, job, workspace=job.workspace, data={"attempt": job.attempts, "endpoint": endpoint})
    notify(job.workspace_id, "job", {"id": job.pk, "state": job.state})


def record_job_progress(job: Job, fraction: float) -> None:
    if fraction != job.progress:
        job.progress = fraction
        job.save(update_fields=["progress"])
        notify(job.workspace_id, "job", {"id": job.pk, "state": job.state, "progress": job.progress})


def record_job_end(job: Job, state: str, *, exit_code: int | None, reason: str) -> None:
    """Record a job's end: its outcome, its attempt, its GPUs back, a cycle for what waits."""
    now = timezone.now()
    Allocation.objects.filter(workload=job).delete()
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


def record_job_stop(job: Job, *, ran: bool) -> None:
    """Its backend stopped a cancelled or preempted job: a preempted one goes back in line (what it
    left stays in its directory, for its next run's artifacts); the artifacts of a cancelled one
    whose processes `ran` until now are recorded next, off this transaction."""
    if job.state == Job.State.PREEMPTED:
        job.save()
        do_requeue_job(job, reason=job.wait_reason or "preempted", outcome="preempted")
        return
    if ran:
        _artifacts_wait(job)
    job.save()
    notify(job.workspace_id, "job", {"id": job.pk, "state": job.state})


def record_job_exit(job: Job, *, exit_code: int | None, reason: str) -> None:
    """Its processes exited (the host recorded its backend stopped). Its end is recorded once its
    artifacts are, which are read off this transaction (apps/jobs/artifacts.py): until then it
    stays RUNNING, its exit code and reason kept on it and on its attempt."""
    job.exit_code = exit_code
    _artifacts_wait(job)
    job.save()
    job.attempt_set.filter(finished_at__isnull=True).update(exit_code=exit_code, reason=reason[:2000])


def _artifacts_wait(job: Job) -> None:
    """Mark the job's artifacts as waiting to be recorded; with workers, ask one to, on commit."""
    job.artifacts_pending_since = timezone.now()
    if settings.PORTAL_WORKLOAD_TRIGGER == "task":
        request_artifacts(job.pk)


def record_job_artifacts(job: Job, files: Sequence[tuple[str, int, str]], *, note: str, claim: datetime) -> Job | None:
    """Record the files, ``(path, size, sha256)``, the collection that claimed the job at `claim`
    found, and `note`, what it left out and why ("" if nothing), in one short transaction; then
    the end of a job that waits for it. A note is also an audit event. Nothing is written if
    another collection has claimed the job since."""
    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("workspace").filter(pk=job.pk).first()
        if job is None or job.artifacts_pending_since != claim:
            return job
        Artifact.objects.bulk_create(
            [Artifact(job=job, path=path, size_bytes=size, sha256=sha256) for path, size, sha256 in files],
            batch_size=1000,
            update_conflicts=True,
            unique_fields=["job", "path"],
            update_fields=["size_bytes", "sha256"],
        )
        job.artifacts_note = note[:500]
        job.artifacts_pending_since = None
        if note:
            do_log_event(Event.JOB_ARTIFACTS_LEFT_OUT, job, workspace=job.workspace, data={"note": note})
        if job.awaits_end:
            attempt = job.attempt_set.order_by("-number").first()
            outcome = Job.State.SUCCEEDED if job.exit_code == 0 else Job.State.FAILED
            record_job_end(job, outcome, exit_code=job.exit_code, reason=attempt.reason if attempt else "")
            return job
        job.save(update_fields=["artifacts_note", "artifacts_pending_since"])
        notify(job.workspace_id, "job", {"id": job.pk, "state": job.state, "artifacts_note": job.artifacts_note})
    return job
