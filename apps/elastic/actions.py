"""Making a node pool elastic, changing its limits, and making it static again: what admins do in the
console and through the API (``/api/v1/pool-scaling/``). Each change is checked against the pool as
the inventory has it, and written to the audit trail; the autoscaler (apps/elastic/scaling.py) reads
the limits on its next run.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from django.db import transaction

from apps.audit.actions import SYSTEM, Origin, do_log_event
from apps.audit.events import Event
from apps.elastic.models import PoolScaling
from apps.errors import ActionError, Conflict
from apps.inventory.models import Cluster, Node, NodePool
from apps.scheduling.trigger import request_cycle

# States only the autoscaler brings a node out of: a pool with such nodes keeps its scaling.
NOT_UP = (Node.State.POWERED_DOWN, Node.State.POWERING_UP, Node.State.POWERING_DOWN, Node.State.FAILED)


@dataclass(frozen=True)
class Limits:
    """A pool's scaling limits and provider, as ``PoolScaling`` keeps them (its defaults too)."""

    max_nodes: int
    enabled: bool = True
    provider: str = PoolScaling.Provider.SLURM
    command: str = ""
    min_nodes: int = 0
    scale_down_delay_s: int = 600
    start_timeout_s: int = 600
    budget_gpu_hours: int | None = None

    @classmethod
    def of(cls, scaling: PoolScaling) -> Limits:
        return cls(**{name: getattr(scaling, name) for name in cls.__dataclass_fields__})


def check_limits(pool: NodePool, limits: Limits) -> None:
    """Refuse limits the pool cannot keep, naming the field at fault. The serializer has already
    checked each number's own range; these rules read the pool and the other fields."""
    if limits.min_nodes > limits.max_nodes:
        raise ActionError(
            f"The minimum ({limits.min_nodes}) is above the maximum ({limits.max_nodes}) of nodes.", field="min_nodes"
        )
    count = Node.objects.filter(pool=pool).count()
    if limits.max_nodes > count:
        raise ActionError(
            f"Pool {pool} has {count} node{'s' if count != 1 else ''} in the inventory, and an elastic pool "
            f"cannot start nodes it does not have: the maximum is at most {count}.",
            field="max_nodes",
        )
    if limits.provider == PoolScaling.Provider.SLURM and pool.cluster.kind != Cluster.Kind.SLURM:
        raise ActionError(
            f"Slurm's power saving starts only a Slurm cluster's nodes, and {pool.cluster.name} is "
            f"{pool.cluster.get_kind_display()}: scale it by command.",
            field="provider",
        )
    if limits.provider == PoolScaling.Provider.KUBERNETES and pool.cluster.kind != Cluster.Kind.KUBERNETES:
        raise ActionError(
            f"The cluster autoscaler's ProvisioningRequests start only a Kubernetes cluster's nodes, and "
            f"{pool.cluster.name} is {pool.cluster.get_kind_display()}.",
            field="provider",
        )
    if limits.provider == PoolScaling.Provider.COMMAND and not limits.command:
        raise ActionError("A pool scaled by command needs the command's absolute path.", field="command")
    if limits.command:
        check_command(limits.command)


def check_command(command: str) -> None:
    """The operator's program: an absolute path to an executable file on the portal's host (it is run
    as `<command> up|down <cluster> <pool> <node>...`, never through a shell)."""
    if not os.path.isabs(command):
        raise ActionError(f"{command} is not an absolute path (such as /usr/local/bin/scale-pool).", field="command")
    if not os.path.isfile(command):
        raise ActionError(f"{command} is not a file on the portal's host.", field="command")
    if not os.access(command, os.X_OK):
        raise ActionError(f"{command} is not executable (chmod +x).", field="command")


@transaction.atomic(durable=True)
def do_set_pool_scaling(pool: NodePool, limits: Limits, *, acting_user: Any, origin: Origin = SYSTEM) -> PoolScaling:
    """Make `pool` elastic with `limits`, or change the limits of an elastic pool. The month's count
    of GPU-hours is kept; the scheduler runs a cycle once committed, so the autoscaler acts on the
    new limits at once."""
    check_limits(pool, limits)
    scaling = PoolScaling.objects.select_for_update().filter(pool=pool).first()
    created = scaling is None
    before = {} if scaling is None else asdict(Limits.of(scaling))
    if scaling is None:
        scaling = PoolScaling(pool=pool)
    for name, value in asdict(limits).items():
        setattr(scaling, name, value)
    scaling.save()
    changed = {name: value for name, value in asdict(limits).items() if before.get(name, object()) != value}
    do_log_event(Event.ELASTIC_SET, scaling, acting_user=acting_user, origin=origin,
                 data={"pool": str(pool), "created": created, **changed})  # fmt: skip
    request_cycle()
    return scaling


@transaction.atomic(durable=True)
def do_disable(scaling: PoolScaling, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    """Make an elastic pool static again: its scaling is removed (its decisions stay, as history).
    Refused while a node is powered down, starting, stopping or failed to start: with no autoscaler,
    nothing would ever bring it back (setting ``enabled`` false keeps the nodes as they are)."""
    pool = scaling.pool
    stuck = list(Node.objects.filter(pool=pool, state__in=NOT_UP).order_by("name").values_list("name", "state"))
    if stuck:
        which = ", ".join(f"{name} ({Node.State(state).label.lower()})" for name, state in stuck)
        raise Conflict(
            f"Pool {pool} has nodes that are not up: {which}. Without its scaling nothing would start them again; "
            "disable its scaling instead (enabled false), or remove it once every node is up."
        )
    do_log_event(Event.ELASTIC_DELETE, scaling, acting_user=acting_user, origin=origin, data={"pool": str(pool)})
    scaling.delete()
    request_cycle()
