"""The autoscaler of elastic node pools, run from the scheduler's loop after each cycle.

Each run: read each elastic node's power state from its provider (a node starting for longer than
the pool's timeout is marked failed, and reported), note since when up nodes have been empty, count
the month's GPU-hours against the budget, then ask the pure decision (apps/scheduling/autoscale.py)
what to start and stop, over the scheduler's own snapshot, and do it: every decision is recorded
with its reason (``ScalingDecision``), shown in the console and counted in /metrics. A node chosen
to stop is first kept from new work, and stopped only if nothing runs on it then. Each run ends with
a sample of each pool's size (``PoolSizeSample``), for the cluster dashboard.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from apps.elastic import providers
from apps.elastic.models import NodePower, PoolScaling, PoolSizeSample, ScalingDecision
from apps.inventory.models import GPU, Allocation, Node
from apps.scheduling import adapter, autoscale
from apps.scheduling.trigger import request_cycle
from apps.telemetry.record import TIERS
from workers.backends.base import BackendError

logger = logging.getLogger(__name__)

State = Node.State
POWER_OF = {State.READY: "up", State.POWERED_DOWN: "down", State.POWERING_UP: "powering_up",
            State.POWERING_DOWN: "powering_down", State.FAILED: "failed"}  # fmt: skip
STATE_OF = {power: state for state, power in POWER_OF.items()}


def upkeep(now: datetime | None = None) -> list[autoscale.Change]:
    now = now or timezone.now()
    pools = list(PoolScaling.objects.filter(enabled=True).select_related("pool__cluster"))
    if not pools:
        return []
    for scaling in pools:
        _observe(scaling, now)
        _count_budget(scaling, now)
    with transaction.atomic():
        snapshot = adapter.load_snapshot(now).snapshot
    elastic = [_as_pool(scaling, now) for scaling in pools]
    changes = autoscale.decide(snapshot, [p for p in elastic if p is not None], now.timestamp())
    by_key = {str(s.pool_id): s for s in pools}
    for change in changes:
        _apply(by_key[change.pool], change, now)
    for scaling in pools:
        record_size(scaling, now)
    prune_sizes(now)
    return changes


# --- the pools' size over time ----------------------------------------------------------------------


SAMPLE_EVERY = timedelta(minutes=1)
# As long as the telemetry keeps its coarsest samples (apps/telemetry/record.py).
SIZE_RETENTION = TIERS[-1][1]
PRUNE_EVERY = timedelta(hours=1)
_pruned_at: datetime | None = None


def size_counts(pool_id: int) -> tuple[int, int, int, int, int]:
    """A pool's nodes that are ready, starting, stopping, powered down and failed."""
    states = Counter(Node.objects.filter(pool_id=pool_id).values_list("state", flat=True))
    return (states[State.READY], states[State.POWERING_UP], states[State.POWERING_DOWN],
            states[State.POWERED_DOWN], states[State.FAILED])  # fmt: skip


def record_size(scaling: PoolScaling, now: datetime) -> PoolSizeSample | None:
    """A sample of the pool's size, when its counts changed since the last one or that is a minute old."""
    counts = size_counts(scaling.pool_id)
    last = PoolSizeSample.objects.filter(pool_id=scaling.pool_id).order_by("-at").first()
    if last is not None and last.counts == counts and now - last.at < SAMPLE_EVERY:
        return None
    ready, starting, stopping, powered_down, failed = counts
    return PoolSizeSample.objects.create(pool_id=scaling.pool_id, at=now, ready=ready, starting=starting,
                                         stopping=stopping, powered_down=powered_down, failed=failed)  # fmt: skip


def prune_sizes(now: datetime, *, force: bool = False) -> int:
    """Drop samples older than the retention (at most once an hour)."""
    global _pruned_at
    if not force and _pruned_at is not None and now - _pruned_at < PRUNE_EVERY:
        return 0
    _pruned_at = now
    deleted, _ = PoolSizeSample.objects.filter(at__lt=now - SIZE_RETENTION).delete()
    return deleted


# --- what is there --------------------------------------------------------------------------------


def _nodes(scaling: PoolScaling) -> list[Node]:
    return list(Node.objects.filter(pool=scaling.pool).order_by("name"))


def _observe(scaling: PoolScaling, now: datetime) -> None:
    """Bring the nodes' states to what the provider reports, mark starts that overran the timeout
    as failed, and note since when up nodes have been empty."""
    nodes = _nodes(scaling)
    try:
        reported = providers.observe(scaling, [n.name for n in nodes])
    except BackendError as error:
        logger.warning("could not read the power states of %s: %s", scaling.pool, error)
        reported = None
    busy = set(Allocation.objects.filter(gpu__node__in=nodes).values_list("gpu__node_id", flat=True))
    for node in nodes:
        power, created = NodePower.objects.get_or_create(node=node, defaults={"changed_at": now})
        state = node.state
        seen = reported.get(node.name) if reported else None
        if seen is not None and STATE_OF.get(seen, state) != state and not _waiting_out(state, seen):
            state = STATE_OF[seen]
        since = (now - power.changed_at).total_seconds()
        if state == State.POWERING_UP and since > scaling.start_timeout_s:
            state = State.FAILED
        elif state == State.FAILED and node.state == State.FAILED and since > scaling.start_timeout_s:
            # Failed for a start timeout: it may be tried again (after the other nodes).
            try:
                providers.reset(scaling, [node.name])
            except BackendError as error:
                logger.warning("could not reset %s: %s", node.name, error)
            else:
                state = State.POWERED_DOWN
        if state != node.state:
            _set_state(node, power, state, now)
            if state == State.FAILED:
                why = providers.failure(scaling, node.name) if seen == "failed" else ""
                reason = (
                    f"{node.name} failed to start ({why}): no work goes there" if why
                    else f"{node.name} did not start within {scaling.start_timeout_s} s: no work goes there"
                )  # fmt: skip
                ScalingDecision.objects.create(pool=scaling.pool, action=ScalingDecision.Action.FAILED,
                                               nodes=[node.name], reason=reason[:1000])  # fmt: skip
                request_cycle()
            elif state == State.READY:
                request_cycle()  # work waiting for it may start now
        idle = node.state == State.READY and node.pk not in busy
        if idle and power.idle_since is None:
            NodePower.objects.filter(pk=node.pk).update(idle_since=now)
        elif not idle and power.idle_since is not None:
            NodePower.objects.filter(pk=node.pk).update(idle_since=None)


def _waiting_out(state: str, seen: str) -> bool:
    """A state the portal set that the cluster has not caught up with yet: a node asked to start
    still reported down for a moment, or asked to stop still reported up."""
    return (state, seen) in ((State.POWERING_UP, "down"), (State.POWERING_DOWN, "up"))


def _set_state(node: Node, power: NodePower, state: str, now: datetime) -> None:
    Node.objects.filter(pk=node.pk).update(state=state, updated_at=now)
    NodePower.objects.filter(pk=node.pk).update(changed_at=now, idle_since=None)
    node.state, power.changed_at, power.idle_since = state, now, None


def _count_budget(scaling: PoolScaling, now: datetime) -> None:
    """GPU-hours of the pool's nodes running above its minimum, this calendar month."""
    month = f"{now:%Y-%m}"
    if scaling.budget_month != month:
        scaling.used_gpu_hours, scaling.budget_month = 0.0, month
    elif scaling.counted_at is not None:
        running = Node.objects.filter(pool=scaling.pool, state__in=(State.READY, State.POWERING_UP))
        sizes = sorted(running.annotate(devices=Count("gpus")).values_list("devices", flat=True))
        above = sum(sizes[: max(0, len(sizes) - scaling.min_nodes)])  # the minimum's nodes are free
        scaling.used_gpu_hours += above * max(0.0, (now - scaling.counted_at).total_seconds()) / 3600
    scaling.counted_at = now
    PoolScaling.objects.filter(pk=scaling.pk).update(
        used_gpu_hours=scaling.used_gpu_hours, budget_month=scaling.budget_month, counted_at=now
    )


def _as_pool(scaling: PoolScaling, now: datetime) -> autoscale.ElasticPool | None:
    nodes = _nodes(scaling)
    types = Counter(GPU.objects.filter(node__in=nodes).values_list("gpu_type", flat=True))
    if not types:
        return None
    gpu_type = types.most_common(1)[0][0]
    busy = set(Allocation.objects.filter(gpu__node__in=nodes).values_list("gpu__node_id", flat=True))
    idle = dict(NodePower.objects.filter(node__in=nodes).values_list("node_id", "idle_since"))
    elastic = tuple(
        autoscale.ElasticNode(
            adapter._node_name(node.pk, gpu_type), node.name, POWER_OF.get(node.state, "failed"),  # type: ignore[arg-type]
            node.pk in busy, idle[node.pk].timestamp() if idle.get(node.pk) else None,
        )
        for node in nodes
    )  # fmt: skip
    spent = scaling.budget_gpu_hours is not None and scaling.used_gpu_hours >= scaling.budget_gpu_hours
    return autoscale.ElasticPool(
        key=str(scaling.pool_id), cluster=scaling.pool.cluster.name, gpu_type=gpu_type, nodes=elastic,
        min_nodes=scaling.min_nodes, max_nodes=scaling.max_nodes, delay_s=float(scaling.scale_down_delay_s),
        devices_per_node=max(types.values()) // max(1, len(nodes)), start_s=float(scaling.start_timeout_s),
        may_grow=not spent,
        why_not=f"its budget of {scaling.budget_gpu_hours} GPU-hours this month is spent" if spent else "",
    )  # fmt: skip


# --- doing it ---------------------------------------------------------------------------------------


def _apply(scaling: PoolScaling, change: autoscale.Change, now: datetime) -> None:
    by_engine = {adapter._node_name(n.pk, g): n for n in _nodes(scaling) for g in _types(n)}
    nodes = [by_engine[name] for name in change.nodes if name in by_engine]
    names = [n.name for n in nodes]
    if change.action == "up":
        _start(scaling, nodes, change, now)
    else:
        _stop(scaling, nodes, change, now)
    logger.info("%s %s of %s: %s", change.action, ", ".join(names), scaling.pool, change.reason)


def _types(node: Node) -> set[str]:
    return set(node.gpus.values_list("gpu_type", flat=True))


def _start(scaling: PoolScaling, nodes: list[Node], change: autoscale.Change, now: datetime) -> None:
    names = [n.name for n in nodes]
    for node in nodes:
        power, _ = NodePower.objects.get_or_create(node=node, defaults={"changed_at": now})
        _set_state(node, power, State.POWERING_UP, now)
    decision = ScalingDecision.objects.create(pool=scaling.pool, action=ScalingDecision.Action.UP, nodes=names,
                                              reason=change.reason)  # fmt: skip
    ready_by = (now + timedelta(seconds=scaling.start_timeout_s)).isoformat()
    PoolScaling.objects.filter(pk=scaling.pk).update(
        starting_for={key: {"nodes": len(names), "ready_by": ready_by} for key in change.for_keys}
    )
    try:
        providers.power_up(scaling, names)
    except BackendError as error:
        ScalingDecision.objects.filter(pk=decision.pk).update(error=str(error)[:1000])
        for node in nodes:
            power = NodePower.objects.get(pk=node.pk)
            _set_state(node, power, State.FAILED, now)
        ScalingDecision.objects.create(pool=scaling.pool, action=ScalingDecision.Action.FAILED, nodes=names,
                                       reason=f"could not start {', '.join(names)}: {error}"[:1000])  # fmt: skip
        return
    if scaling.provider == PoolScaling.Provider.COMMAND:  # it returns once they are up
        for node in nodes:
            _set_state(node, NodePower.objects.get(pk=node.pk), State.READY, now)
        request_cycle()


def _stop(scaling: PoolScaling, nodes: list[Node], change: autoscale.Change, now: datetime) -> None:
    """Keep work off the nodes first, in step with the scheduler's cycles, then stop those that
    nothing runs on."""
    stopping = []
    with transaction.atomic():
        adapter._lock_cycle()
        for node in nodes:
            free = not Allocation.objects.filter(gpu__node=node).exists()
            if free and Node.objects.filter(pk=node.pk, state=State.READY).update(state=State.POWERING_DOWN):
                stopping.append(node)
    if not stopping:
        return
    names = [n.name for n in stopping]
    for node in stopping:
        NodePower.objects.filter(pk=node.pk).update(changed_at=now, idle_since=None)
    decision = ScalingDecision.objects.create(pool=scaling.pool, action=ScalingDecision.Action.DOWN, nodes=names,
                                              reason=change.reason)  # fmt: skip
    try:
        providers.power_down(scaling, names)
    except BackendError as error:
        ScalingDecision.objects.filter(pk=decision.pk).update(error=str(error)[:1000])
        Node.objects.filter(pk__in=[n.pk for n in stopping], state=State.POWERING_DOWN).update(state=State.READY)
        return
    if scaling.provider == PoolScaling.Provider.COMMAND:
        Node.objects.filter(pk__in=[n.pk for n in stopping]).update(state=State.POWERED_DOWN)
