"""Endpoints and their replicas as the portal's shared parts see them (apps/workloads/kinds.py).

The scheduler admits replicas, never endpoints: an endpoint holds nothing itself."""

from __future__ import annotations

from collections.abc import Iterable

from django.utils import timezone

from apps.audit.events import Event
from apps.inference.models import Endpoint, Replica
from apps.workloads.kinds import KindInfo, Scheduling


def _preempt(pk: int, reason: str, grace_s: float) -> None:
    from apps.inference.replicas import do_preempt_replica

    replica = Replica.objects.select_related("endpoint__workspace").filter(pk=pk).first()
    if replica is not None:
        do_preempt_replica(replica, reason=reason)


def _make_way(pks: list[int], reason: str) -> None:
    """A drain of their node: each is replaced elsewhere before it stops (see scaling._retire); the
    scheduler loop's next round asks for the replacements."""
    Replica.objects.filter(pk__in=pks, retiring_at__isnull=True).update(
        retiring_at=timezone.now(), retire_reason=reason[:500]
    )


def _stay(pks: list[int]) -> None:
    Replica.objects.filter(pk__in=pks).update(retiring_at=None, retire_reason="")


def _details(pks: Iterable[int]) -> dict[int, tuple[bool, float | None]]:
    return {pk: (False, None) for pk in pks}


ENDPOINT = KindInfo(
    name="endpoint",
    model=Endpoint,
    label="Inference endpoint",
    token_states=(),
    submit_event=Event.ENDPOINT_CREATE,
    fail_event=Event.ENDPOINT_FAILED,
)

REPLICA = KindInfo(
    name="replica",
    model=Replica,
    label="Endpoint replica",
    token_states=(),
    submit_event=Event.ENDPOINT_SCALE,
    fail_event=Event.ENDPOINT_REPLICA_FAILED,
    scheduling=Scheduling(
        queued=Replica.State.QUEUED,
        admitted=Replica.State.ADMITTED,
        holding=Replica.HOLDING_STATES,
        admit_event=Event.ENDPOINT_ADMIT,
        preempt=_preempt,
        details=_details,
        make_way=_make_way,
        stay=_stay,
    ),
)
