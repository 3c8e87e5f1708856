"""Workloads of every kind as the overview, a workspace's dashboard and the console list them: one
row type for all kinds, built from the kind registry (apps/workloads/listing.py), so that a new
kind shows on those pages once it is registered and has its pages (``web:<kind>`` and
``web:<kind>s``, as every kind's are named).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import Case, F, IntegerField, QuerySet, Value, When
from django.urls import NoReverseMatch, reverse

from apps.web.templatetags.portal import gpus_of
from apps.workloads import listing
from apps.workloads.kinds import KINDS, KindInfo
from apps.workloads.models import Workload


@dataclass(frozen=True)
class WorkRow:
    """One workload on a page: the row, its kind's label, its page (none for a kind without one),
    its state as its kind names it, what it holds, and its progress where its kind reports one."""

    workload: Workload
    kind: str
    kind_label: str
    url: str
    state_label: str
    resources: str
    progress: float | None

    @property
    def starting(self) -> bool:
        """Admitted, and its processes not yet running."""
        info = KINDS.get(self.kind)
        return info is not None and self.workload.state in listing.admitted(info)

    @property
    def preempted(self) -> bool:
        return bool(self.workload.state == listing.PREEMPTED)


@dataclass(frozen=True)
class KindPanel:
    """One kind on a page: its name and label, how many it has in the states counted, its rows, and
    the names of its list and create pages (a workspace's name their one argument; "" for none)."""

    name: str
    label: str
    count: int
    rows: list[WorkRow]
    list_view: str
    new_view: str


def _exists(view: str, *args: Any) -> bool:
    try:
        reverse(view, args=args)
    except NoReverseMatch:
        return False
    return True


def has_pages(kind: str) -> dict[str, str]:
    """The names of a kind's list and create pages, where it has them."""
    views = {"list_view": f"web:{kind}s", "new_view": f"web:{kind}-new"}
    return {key: view if _exists(view, "workspace") else "" for key, view in views.items()}


def page_of(workload: Workload) -> str:
    """A workload's page ("" for a kind without pages)."""
    try:
        return reverse(f"web:{workload.kind}", args=[workload.workspace.name, workload.pk])
    except NoReverseMatch:
        return ""


def resources(workload: Workload) -> str:
    """What its pod sets hold in all: "2 × H100", "0.5 × H100"; "no GPU" without any (``with_gpus``)."""
    total = getattr(workload, "held_gpus", None)
    if not total:
        return "no GPU"
    return gpus_of(total, getattr(workload, "held_gpu_type", ""))


def work_rows(queryset: QuerySet[Workload], limit: int) -> list[WorkRow]:
    """The first `limit` rows of a query of workloads, with what a page shows of each: one query,
    whatever their number and kinds."""
    out = []
    for workload in listing.with_details(listing.with_gpus(queryset))[:limit]:
        info: KindInfo | None = KINDS.get(workload.kind)
        progress = getattr(listing.detail(workload), "progress", None)
        out.append(
            WorkRow(
                workload=workload,
                kind=workload.kind,
                kind_label=(info.label if info is not None else "") or workload.kind,
                url=page_of(workload),
                state_label=listing.state_label(workload),
                resources=resources(workload),
                progress=float(progress) if isinstance(progress, (int, float, Decimal)) else None,
            )
        )
    return out


def queue_order(kinds: list[KindInfo]) -> list[Any]:
    """The order of a queue of several kinds: admitted ones first (they are starting), then by
    place in the cluster's queue (those without one last), then the oldest first."""
    admitted = listing.in_states(listing.admitted, kinds)
    starting = Case(When(admitted, then=Value(0)), default=Value(1), output_field=IntegerField())
    return [starting, F("cluster_queue_position").asc(nulls_last=True), "created_at", "id"]
