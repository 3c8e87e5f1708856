"""Ray clusters as the portal's shared parts see them (apps/workloads/kinds.py)."""

from __future__ import annotations

from collections.abc import Iterable

from apps.audit.events import Event
from apps.rayclusters.models import RayCluster
from apps.workloads.kinds import KindInfo, Scheduling


def _preempt(pk: int, reason: str, grace_s: float) -> None:
    from apps.rayclusters.actions import do_preempt_cluster

    cluster = RayCluster.objects.filter(pk=pk).first()
    if cluster is not None:
        do_preempt_cluster(cluster, reason=reason)


def _details(pks: Iterable[int]) -> dict[int, tuple[bool, float | None]]:
    rows = RayCluster.objects.filter(pk__in=list(pks)).values_list("pk", "max_runtime_s")
    return {pk: (False, float(limit) if limit else None) for pk, limit in rows}


RAY_CLUSTER = KindInfo(
    name="raycluster",
    model=RayCluster,
    label="Ray cluster",
    token_states=(RayCluster.State.ADMITTED, RayCluster.State.RUNNING, RayCluster.State.DEGRADED),
    submit_event=Event.RAY_CREATE,
    fail_event=Event.RAY_FAILED,
    scheduling=Scheduling(
        queued=RayCluster.State.QUEUED,
        admitted=RayCluster.State.ADMITTED,
        holding=(RayCluster.State.ADMITTED, RayCluster.State.RUNNING, RayCluster.State.DEGRADED),
        admit_event=Event.RAY_ADMIT,
        preempt=_preempt,
        details=_details,
    ),
)
