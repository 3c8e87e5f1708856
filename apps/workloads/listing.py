"""Every kind's workloads in one list, for what shows a workspace's or the whole portal's work: the
overview, a workspace's dashboard, the console's queue and ``/api/v1/workloads/``.

What a user may see, and which of a kind's states are live, wait for admission or run, come from
the kind registry (apps/workloads/kinds.py), so a newly registered kind is listed with the others;
nothing here names a kind. The rows are ``Workload`` rows (one table for every kind); a kind's own
columns are its detail row, one join away (``workload.as_raycluster``), loaded with
``with_details()``; what its pod sets hold in all comes with ``with_gpus()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.db.models import DecimalField, ExpressionWrapper, F, OuterRef, Q, QuerySet, Subquery, Sum

from apps.workloads.kinds import KINDS, KindInfo
from apps.workloads.models import PodSet, Workload
from apps.workspaces.access import VIEW, restrict

#: The states in which a workload of any kind has ended (each kind has some of them).
ENDED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "STOPPED", "DELETED"})
#: Stopped for other work, and going back in line (for the kinds that may be preempted).
PREEMPTED = "PREEMPTED"

States = Callable[[KindInfo], tuple[str, ...]]


def live(info: KindInfo) -> tuple[str, ...]:
    """Its states from submission until it ended."""
    return tuple(state for state in info.states if state not in ENDED)


def queued(info: KindInfo) -> tuple[str, ...]:
    """Its state while it waits for admission (none for a kind the scheduler does not admit)."""
    return (info.scheduling.queued,) if info.scheduling is not None else ()


def admitted(info: KindInfo) -> tuple[str, ...]:
    """Its state once admitted, before its processes run."""
    return (info.scheduling.admitted,) if info.scheduling is not None else ()


def waiting(info: KindInfo) -> tuple[str, ...]:
    """Its states between submission and its processes' start: queued, admitted and starting, or
    preempted and going back in line."""
    if info.scheduling is None:
        return ()
    states = (info.scheduling.queued, info.scheduling.admitted, PREEMPTED)
    return tuple(state for state in dict.fromkeys(states) if state in info.states)


def running(info: KindInfo) -> tuple[str, ...]:
    """Its states while its processes run (those in which its workload token works), once admitted."""
    return tuple(state for state in info.token_states if state not in waiting(info))


def scheduled_kinds() -> list[KindInfo]:
    """The kinds the scheduler admits, in the registry's order."""
    return [info for info in KINDS.values() if info.scheduling is not None]


def in_states(states: States, kinds: Iterable[KindInfo] | None = None) -> Q:
    """Workload rows of `kinds` (default: every kind) in the states `states` gives for their kind."""
    condition = Q(pk__in=[])
    for info in KINDS.values() if kinds is None else kinds:
        if chosen := states(info):
            condition |= Q(kind=info.name, state__in=chosen)
    return condition


def visible(user: Any, role: str = VIEW) -> QuerySet[Workload]:
    """The workload rows `user` may see: of each kind, those the access layer finds of its model
    (restrict(): its workspace's role, or a collaborator's access to what is shared), so that this
    list shows what each kind's own list shows, and nothing of another tenant."""
    condition = Q(pk__in=[])
    for info in KINDS.values():
        condition |= Q(kind=info.name, pk__in=restrict(info.model.objects.all(), user, role).values("pk"))
    return Workload.objects.filter(condition)


def detail_link(info: KindInfo) -> str:
    """The name by which a workload row reaches its kind's detail row (``as_raycluster``)."""
    link = info.model._meta.get_ancestor_link(Workload)
    assert link is not None, f"{info.model.__name__} is no Workload"
    return str(link.remote_field.get_accessor_name())


def with_details(queryset: QuerySet[Workload]) -> QuerySet[Workload]:
    """The rows with their workspace, cluster and each one's detail row, in the same query; and
    the instance a detail row runs on (a notebook's), which its start's progress names."""
    links = [detail_link(info) for info in KINDS.values()]
    hosts = [f"{detail_link(info)}__instance" for info in KINDS.values() if _runs_on_instance(info.model)]
    return queryset.select_related("workspace", "cluster", *links, *hosts)


def _runs_on_instance(model: type[Any]) -> bool:
    return any(field.name == "instance" and field.is_relation for field in model._meta.fields)


def with_gpus(queryset: QuerySet[Workload]) -> QuerySet[Workload]:
    """The rows with the GPUs their pod sets hold in all (``held_gpus``, None for none) and of
    which type (``held_gpu_type``), in the same query."""
    held = PodSet.objects.filter(workload=OuterRef("pk"), gpus__gt=0).order_by()
    each = ExpressionWrapper(F("gpus") * F("replicas"), output_field=DecimalField(max_digits=12, decimal_places=3))
    total = held.values("workload").annotate(total=Sum(each))
    return queryset.annotate(
        held_gpus=Subquery(total.values("total")[:1]),
        held_gpu_type=Subquery(held.order_by("position").values("gpu_type")[:1]),
    )


def detail(workload: Workload) -> Workload:
    """A row's kind's own row (a ``RayCluster`` for a Ray cluster's), loaded by ``with_details``; the
    row itself where it is one already, or where its kind is no longer registered."""
    info = KINDS.get(workload.kind)
    if info is None or isinstance(workload, info.model):
        return workload
    return getattr(workload, detail_link(info))  # type: ignore[no-any-return]


def state_label(workload: Workload) -> str:
    """Its state as its kind names it (a Ray cluster's ADMITTED is "Starting")."""
    info = KINDS.get(workload.kind)
    labels = dict(info.model.State.choices) if info is not None else {}
    return str(labels.get(workload.state, workload.state.title()))
