"""The job kind as the portal's shared parts see it (apps/workloads/kinds.py)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.utils import timezone

from apps.audit.events import Event
from apps.jobs.models import Job
from apps.workloads.kinds import KindInfo, Scheduling


def _preempt(pk: int, reason: str, grace_s: float) -> None:
    from apps.jobs.actions import do_preempt_job

    job = Job.objects.select_related("workspace").filter(pk=pk).first()
    if job is not None:
        do_preempt_job(job, reason=reason, grace_s=grace_s)


def _details(pks: Iterable[int]) -> dict[int, tuple[bool, float | None]]:
    rows = Job.objects.filter(pk__in=list(pks)).values_list("pk", "checkpointable", "max_runtime_s")
    return {pk: (checkpointable, float(limit) if limit else None) for pk, checkpointable, limit in rows}


def _requeue_unready(timeout_s: float) -> list[int]:
    from apps.jobs.actions import do_requeue_unready_job, unready_backoff_s

    late = Job.objects.filter(state=Job.State.ADMITTED, admitted_at__lt=timezone.now() - timedelta(seconds=timeout_s))
    requeued = []
    for job in late:
        do_requeue_unready_job(job, timeout_s=int(timeout_s), backoff_s=unready_backoff_s(job))
        requeued.append(job.pk)
    return requeued


JOB = KindInfo(
    name="job",
    model=Job,
    label="Job",
    token_states=(Job.State.ADMITTED, Job.State.RUNNING),
    submit_event=Event.JOB_SUBMIT,
    fail_event=Event.JOB_FAILED,
    scheduling=Scheduling(
        queued=Job.State.QUEUED,
        admitted=Job.State.ADMITTED,
        holding=(Job.State.ADMITTED, Job.State.RUNNING),
        admit_event=Event.JOB_ADMIT,
        succeeded=Job.State.SUCCEEDED,
        preempt=_preempt,
        details=_details,
        requeue_unready=_requeue_unready,
    ),
)
