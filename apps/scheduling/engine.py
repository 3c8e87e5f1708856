"""The scheduling engine: plain data in, decisions out.

Pure on purpose: no Django, ORM or backend imports, so it can be tested on its own and replayed
on traces in simulated time. The same snapshot always gives the same decisions.

This is the admission rule of the foundation: a workload is admitted when its workspace's GPU
quota (plus what it may borrow from its cohort) and the free devices of one cluster fit the
whole gang at once; everything else stays pending, with a reason and its queue positions.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

ZERO = Decimal("0")
ONE = Decimal("1")


@dataclass(frozen=True)
class Quota:
    gpu_type: str
    nominal: Decimal
    borrowing_limit: Decimal | None = None  # None: no limit beyond what the cohort has idle
    lending_limit: Decimal | None = None  # None: lends all of its idle quota


@dataclass(frozen=True)
class WorkspaceInfo:
    name: str
    quotas: tuple[Quota, ...] = ()
    cohort: str | None = None
    can_borrow: bool = False

    def quota(self, gpu_type: str) -> Quota:
        for quota in self.quotas:
            if quota.gpu_type == gpu_type:
                return quota
        return Quota(gpu_type, ZERO, ZERO, ZERO)


@dataclass(frozen=True)
class Device:
    index: int
    free: Decimal  # share of the device not yet allocated, 0..1


@dataclass(frozen=True)
class NodeInfo:
    name: str
    cluster: str
    gpu_type: str
    devices: tuple[Device, ...]


@dataclass(frozen=True)
class Workload:
    key: str  # "job:12", "instance:3"
    workspace: str
    gpu_type: str
    gpus_per_replica: Decimal
    replicas: int = 1
    priority: int = 0
    seq: int = 0  # submission order; earlier first among equal priorities

    @property
    def total_gpus(self) -> Decimal:
        return self.gpus_per_replica * self.replicas


@dataclass(frozen=True)
class Snapshot:
    workspaces: tuple[WorkspaceInfo, ...]
    nodes: tuple[NodeInfo, ...]
    running: tuple[Workload, ...]
    pending: tuple[Workload, ...]


@dataclass(frozen=True)
class ReplicaPlacement:
    node: str
    devices: tuple[tuple[int, Decimal], ...]  # (device index, share)


@dataclass(frozen=True)
class Admit:
    key: str
    cluster: str | None
    placement: tuple[ReplicaPlacement, ...]
    borrowed: Decimal = ZERO


@dataclass(frozen=True)
class Pending:
    key: str
    reason: str
    workspace_position: int
    cluster_position: int


@dataclass
class Decisions:
    admitted: list[Admit] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)


def _fmt(value: Decimal) -> str:
    return f"{value.normalize():f}"


class _Ledger:
    """GPU use per workspace and type, and what each cohort has idle to lend."""

    def __init__(self, workspaces: tuple[WorkspaceInfo, ...], running: tuple[Workload, ...]):
        self.workspaces = {w.name: w for w in workspaces}
        self.used: dict[tuple[str, str], Decimal] = defaultdict(lambda: ZERO)
        for workload in running:
            self.used[workload.workspace, workload.gpu_type] += workload.total_gpus

    def lendable(self, cohort: str, gpu_type: str, borrower: str) -> Decimal:
        total = ZERO
        for ws in self.workspaces.values():
            if ws.cohort != cohort or ws.name == borrower:
                continue
            quota = ws.quota(gpu_type)
            idle = max(ZERO, quota.nominal - self.used[ws.name, gpu_type])
            if quota.lending_limit is not None:
                idle = min(idle, quota.lending_limit)
            total += idle
        # GPUs already borrowed by cohort members, the borrower included, come out of what is left to lend.
        borrowed = sum(
            (
                max(ZERO, self.used[ws.name, gpu_type] - ws.quota(gpu_type).nominal)
                for ws in self.workspaces.values()
                if ws.cohort == cohort
            ),
            ZERO,
        )
        return max(ZERO, total - borrowed)

    def check(self, workload: Workload) -> tuple[bool, Decimal, str]:
        """(fits, GPUs borrowed, reason if not)."""
        ws = self.workspaces.get(workload.workspace, WorkspaceInfo(workload.workspace))
        quota = ws.quota(workload.gpu_type)
        used = self.used[ws.name, workload.gpu_type]
        after = used + workload.total_gpus
        if after <= quota.nominal:
            return True, ZERO, ""
        reason = (
            f"waiting for quota: {_fmt(used)} of {_fmt(quota.nominal)} {workload.gpu_type} in use "
            f"in workspace {ws.name}, this needs {_fmt(workload.total_gpus)}"
        )
        if not ws.can_borrow or ws.cohort is None:
            return False, ZERO, reason
        over = after - quota.nominal
        already = max(ZERO, used - quota.nominal)
        if quota.borrowing_limit is not None and over > quota.borrowing_limit:
            return False, ZERO, f"{reason} (borrowing limit {_fmt(quota.borrowing_limit)})"
        lendable = self.lendable(ws.cohort, workload.gpu_type, ws.name)
        if over - already > lendable:
            return False, ZERO, f"{reason}; cohort {ws.cohort} has {_fmt(lendable)} idle to lend"
        return True, over - already, ""

    def charge(self, workload: Workload) -> None:
        self.used[workload.workspace, workload.gpu_type] += workload.total_gpus


class _Free:
    """Free device shares per node, updated as workloads are placed."""

    def __init__(self, nodes: tuple[NodeInfo, ...]):
        self.nodes = {n.name: n for n in nodes}
        self.free = {n.name: {d.index: d.free for d in n.devices} for n in nodes}

    def _fit_replica(self, node: str, share: Decimal, free: dict[int, Decimal]) -> list[tuple[int, Decimal]] | None:
        if share < ONE:
            # A fractional replica takes the fullest device that still has room (bin-packing).
            options = sorted((f, i) for i, f in free.items() if f >= share)
            if not options:
                return None
            return [(options[0][1], share)]
        whole = [i for i, f in sorted(free.items()) if f == ONE]
        count = int(share)
        return [(i, ONE) for i in whole[:count]] if len(whole) >= count else None

    def place(self, workload: Workload) -> tuple[str | None, tuple[ReplicaPlacement, ...]] | None:
        """Place every replica of the gang in one cluster, or nothing at all."""
        clusters = sorted({n.cluster for n in self.nodes.values() if n.gpu_type == workload.gpu_type})
        for cluster in clusters:
            trial = {name: dict(f) for name, f in self.free.items() if self.nodes[name].cluster == cluster}
            placement: list[ReplicaPlacement] = []
            for _ in range(workload.replicas):
                # Bin-pack: try the nodes with the least free capacity first.
                candidates = sorted(
                    (name for name in trial if self.nodes[name].gpu_type == workload.gpu_type),
                    key=lambda name: (sum(trial[name].values()), name),
                )
                for name in candidates:
                    devices = self._fit_replica(name, workload.gpus_per_replica, trial[name])
                    if devices is not None:
                        for index, share in devices:
                            trial[name][index] -= share
                        placement.append(ReplicaPlacement(name, tuple(devices)))
                        break
                else:
                    break
            if len(placement) == workload.replicas:
                for name, free in trial.items():
                    self.free[name] = free
                return cluster, tuple(placement)
        return None

    def describe_shortage(self, workload: Workload) -> str:
        need = _fmt(workload.gpus_per_replica)
        nodes = "a node" if workload.replicas == 1 else f"{workload.replicas} nodes"
        return f"waiting for {nodes} with {need} free {workload.gpu_type}"


def schedule(snapshot: Snapshot) -> Decisions:
    """Admit what fits now, in priority then submission order; explain the rest."""
    ledger = _Ledger(snapshot.workspaces, snapshot.running)
    free = _Free(snapshot.nodes)
    decisions = Decisions()
    order = sorted(snapshot.pending, key=lambda w: (-w.priority, w.seq, w.key))
    waiting: list[tuple[Workload, str]] = []
    for workload in order:
        if workload.gpus_per_replica <= ZERO:
            decisions.admitted.append(Admit(workload.key, None, ()))
            continue
        fits, borrowed, reason = ledger.check(workload)
        if not fits:
            waiting.append((workload, reason))
            continue
        placed = free.place(workload)
        if placed is None:
            waiting.append((workload, free.describe_shortage(workload)))
            continue
        ledger.charge(workload)
        decisions.admitted.append(Admit(workload.key, placed[0], placed[1], borrowed))
    per_workspace: dict[str, int] = defaultdict(int)
    for cluster_position, (workload, reason) in enumerate(waiting, start=1):
        per_workspace[workload.workspace] += 1
        decisions.pending.append(Pending(workload.key, reason, per_workspace[workload.workspace], cluster_position))
    return decisions
