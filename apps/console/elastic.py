"""Elastic node pools for admins: each pool's limits (a form), its nodes with their power state and
since when, the month's GPU-hours against its budget, the autoscaler's last decisions, and a chart of
how many of its nodes were up over the last day against its minimum and maximum. A pool that is not
elastic has a form to make it so (apps/elastic/actions.py does the change, the API's serializer
checks the form as it checks a request)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.db.models import Count, Prefetch
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from apps.console.forms import form_data, save
from apps.elastic import actions
from apps.elastic.api import PoolScalingSerializer, month_used
from apps.elastic.models import PoolScaling, ScalingDecision
from apps.errors import ActionError
from apps.inventory.models import Cluster, Node, NodePool
from apps.web.common import Errors, action_kwargs, admin_only, page

SHOWN = 50  # decisions listed per pool
WINDOW = timedelta(hours=24)  # the chart's span
UP = (Node.State.READY, Node.State.POWERING_UP)  # what counts against the maximum, as the autoscaler counts
TEXT = ("provider", "command", "min_nodes", "max_nodes", "scale_down_delay_s", "start_timeout_s", "budget_gpu_hours")
FIELDS = {*TEXT, "enabled", "pool"}
# The chart's drawing box: time across, nodes up; the SVG stretches it to the page's width.
WIDTH, HEIGHT, PAD = 1000, 100, 6
# Badges: a node's state, and a decision's action.
STATE_TONES = {"ready": "ok", "powered_down": "off", "powering_up": "busy", "powering_down": "busy", "failed": "bad",
               "drained": "warn", "down": "bad"}  # fmt: skip
ACTION_TONES = {"up": "ok", "down": "off", "failed": "bad", "refused": "warn"}


@dataclass(frozen=True)
class Chart:
    """A pool's size over the window as an SVG step line, with its minimum and maximum as lines."""

    line: str  # the path of the size
    area: str  # the same, closed to the axis
    min_y: float
    max_y: float
    grid: list[float]  # a line per whole node, where few enough to read
    top: int  # the axis' top value
    summary: str  # the same in words, for screen readers


@dataclass
class PoolRow:
    pool: NodePool
    scaling: PoolScaling | None
    nodes: list[Node]
    values: dict[str, Any]
    errors: Errors = field(default_factory=dict)
    decisions: list[ScalingDecision] = field(default_factory=list)
    chart: Chart | None = None
    used: float = 0.0

    @property
    def over_budget(self) -> bool:
        budget = self.scaling.budget_gpu_hours if self.scaling else None
        return budget is not None and self.used >= budget


def size_history(
    size_now: int, decisions: list[ScalingDecision], since: datetime, nodes: int
) -> list[tuple[datetime, int]]:
    """How many nodes were up (ready or starting) from `since` to now, as steps: the size now, walked
    back through the decisions taken since (newest first). A start counts up, a stop or a failed start
    down; a stop whose provider failed left its nodes up. Changes no decision records (a node the
    cluster brought back by itself) are not known: the steps stay within 0 and the pool's nodes."""
    steps = []
    after = size_now
    for decision in decisions:
        steps.append((decision.at, after))
        count = len(decision.nodes)
        if decision.action == ScalingDecision.Action.UP:
            after -= count
        elif decision.action == ScalingDecision.Action.FAILED or (
            decision.action == ScalingDecision.Action.DOWN and not decision.error
        ):
            after += count
        after = max(0, min(nodes, after))
    steps.append((since, after))
    return list(reversed(steps))


def chart_of(steps: list[tuple[datetime, int]], scaling: PoolScaling, nodes: int) -> Chart:
    """The steps drawn over the window (from the first step's time), the axis up to the pool's nodes
    or its maximum, whichever is more."""
    since = steps[0][0]
    top = max(nodes, scaling.max_nodes, 1)

    def x(at: datetime) -> float:
        return round((at - since).total_seconds() / WINDOW.total_seconds() * WIDTH, 1)

    def y(size: int) -> float:
        return round(HEIGHT - PAD - size / top * (HEIGHT - 2 * PAD), 1)

    path = f"M0 {y(steps[0][1])}"
    for at, size in steps[1:]:
        path += f" H{x(at)} V{y(size)}"
    path += f" H{WIDTH}"
    sizes = [size for _, size in steps]
    summary = (
        f"Nodes up over the last 24 hours: {min(sizes)} to {max(sizes)}, {steps[-1][1]} now; "
        f"the minimum is {scaling.min_nodes}, the maximum {scaling.max_nodes}, of {nodes} nodes."
    )
    return Chart(
        line=path, area=f"{path} V{HEIGHT} H0 Z", min_y=y(scaling.min_nodes), max_y=y(scaling.max_nodes),
        grid=[y(n) for n in range(top + 1)] if top <= 12 else [], top=top, summary=summary,
    )  # fmt: skip


def _values(pool: NodePool, scaling: PoolScaling | None, nodes: int) -> dict[str, Any]:
    """The form's values: the pool's limits, or what a new elastic pool starts from (Slurm's power
    saving on a Slurm cluster, the cluster autoscaler on Kubernetes, else the operator's command)."""
    provider = {
        Cluster.Kind.SLURM: PoolScaling.Provider.SLURM,
        Cluster.Kind.KUBERNETES: PoolScaling.Provider.KUBERNETES,
    }.get(pool.cluster.kind, PoolScaling.Provider.COMMAND)
    limits = actions.Limits.of(scaling) if scaling else actions.Limits(max_nodes=max(1, nodes), provider=provider)
    values = asdict(limits)
    values["budget_gpu_hours"] = "" if limits.budget_gpu_hours is None else limits.budget_gpu_hours
    return values


def _rows(now: datetime) -> list[PoolRow]:
    nodes = Node.objects.select_related("power").annotate(devices=Count("gpus")).order_by("name")
    pools = NodePool.objects.select_related("cluster", "scaling").prefetch_related(Prefetch("nodes", queryset=nodes))
    rows = []
    for pool in pools.order_by("cluster__name", "name"):
        scaling = getattr(pool, "scaling", None)
        members = list(pool.nodes.all())
        row = PoolRow(pool, scaling, members, _values(pool, scaling, len(members)))
        if scaling is not None:
            recent = list(ScalingDecision.objects.filter(pool=pool, at__gte=now - WINDOW).order_by("-at", "-id"))
            row.decisions = list(ScalingDecision.objects.filter(pool=pool).order_by("-at", "-id")[:SHOWN])
            size_now = sum(1 for n in members if n.state in UP)
            row.chart = chart_of(size_history(size_now, recent, now - WINDOW, len(members)), scaling, len(members))
            row.used = month_used(scaling, now)
        rows.append(row)
    return rows


def _render(request: HttpRequest, *, refused: tuple[int, dict[str, Any], Errors] | None = None) -> HttpResponse:
    """The page; `refused`: a pool whose form was just refused, with the values sent and the messages."""
    rows = _rows(timezone.now())
    for row in rows:
        if refused is not None and row.pool.pk == refused[0]:
            row.values, row.errors = {**row.values, **refused[1]}, refused[2]
    context = {"rows": rows, "state_tones": STATE_TONES, "action_tones": ACTION_TONES, "width": WIDTH,
               "height": HEIGHT, "providers": PoolScaling.Provider.choices, "live_workspaces": []}  # fmt: skip
    return page(request, "console/elastic.html", context, status=400 if refused else 200)


@admin_only
def elastic_pools(request: HttpRequest) -> HttpResponse:
    return _render(request)


@admin_only
@require_POST
def elastic_set(request: HttpRequest, pk: int) -> HttpResponse:
    """Make the pool elastic, or change its limits (the same form)."""
    pool = get_object_or_404(NodePool.objects.select_related("cluster"), pk=pk)
    scaling = PoolScaling.objects.filter(pool=pool).first()
    data = form_data(request, TEXT, flags=("enabled",), nullable=("budget_gpu_hours",))
    data.setdefault("command", "")  # an emptied field clears the command
    data["pool"] = pool.pk

    def perform(checked: dict[str, Any]) -> PoolScaling:
        checked.pop("pool", None)
        current = asdict(actions.Limits.of(scaling)) if scaling else {}
        return actions.do_set_pool_scaling(pool, actions.Limits(**{**current, **checked}), **action_kwargs(request))

    saved, errors = save(request, PoolScalingSerializer, data, perform, instance=scaling, fields=FIELDS)
    if saved is None:
        sent = {**{name: request.POST.get(name, "") for name in TEXT}, "enabled": data["enabled"]}
        return _render(request, refused=(pool.pk, sent, errors))
    messages.success(request, f"Pool {pool} {'saved' if scaling else 'is elastic now'}.")
    return HttpResponseRedirect(f"{reverse('console:elastic')}#pool-{pool.pk}")


@admin_only
@require_POST
def elastic_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """Make the pool static again (refused while a node is not up: the message says which)."""
    scaling = get_object_or_404(PoolScaling.objects.select_related("pool__cluster"), pool_id=pk)
    pool = scaling.pool  # the scaling's key is the pool's: gone once it is deleted
    try:
        actions.do_disable(scaling, **action_kwargs(request))
        messages.success(request, f"Pool {pool} is not elastic any more.")
    except ActionError as exc:
        messages.error(request, exc.message)
    return HttpResponseRedirect(f"{reverse('console:elastic')}#pool-{pk}")
