"""The scheduling engine's plain data: what a snapshot holds and what decisions say."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from itertools import count
from typing import Literal, NamedTuple, overload

ZERO = Decimal("0")
UNIT = 1000  # thousandths of a GPU in one GPU: the finest share the portal accepts


# A share of one device is a quarter, a third, a half, two thirds or three quarters of it: what
# time-slicing and MIG slices give in practice. Thirds are written to the thousandth, 0.333 below a
# third and 0.667 above two thirds, so that shares that fill a device exactly (three thirds, two
# thirds and a third) still add up to at most one, in thousandths here and in the database alike.
SHARES = tuple(Decimal(share) for share in ("0.25", "0.333", "0.5", "0.667", "0.75"))
SHARES_TEXT = "0.25, 0.333, 0.5, 0.667 or 0.75"


def gpu_shape_problem(gpus: Decimal | int) -> str | None:
    """Why `gpus` is not a number of GPUs per replica (None if it is): 0 (no GPU), a share of one
    device (SHARES) or a whole number of devices. The one wording the API, the pages and the CLI
    give (docs/fractional-gpus.md)."""
    gpus = Decimal(gpus)  # a field's default may be a plain int
    written = f"{gpus.normalize():f}"
    if gpus < 0:
        return "GPUs cannot be negative."
    if gpus > 1 and gpus != gpus.to_integral_value():
        return (
            f"{written} GPUs: more than one device must be a whole number (1, 2, 8...); "
            f"a share of one device is {SHARES_TEXT}."
        )
    if 0 < gpus < 1 and gpus not in SHARES:
        others = "or 0 for no GPU, or a whole number of devices"
        return f"{written} GPUs: a share of one device is {SHARES_TEXT} ({others})."
    return None


def units_of(gpus: Decimal) -> int:
    return int(gpus * UNIT)


@lru_cache(maxsize=4096)  # placements name the same few amounts again and again
def gpus_of(units: int) -> Decimal:
    return (Decimal(units) / UNIT).normalize()


@lru_cache(maxsize=4096)  # reasons name the same few amounts again and again
def fmt_units(units: int) -> str:
    """Thousandths as the GPUs they make, without trailing zeros ("2", "0.5", "1.25", "0.333")."""
    whole, part = divmod(abs(units), UNIT)
    text = str(whole) if not part else f"{whole}.{part:03d}".rstrip("0")
    return f"-{text}" if units < 0 else text


# A job's expected runtime, for estimates, is the median length of the last OBSERVED_RUNS runs like it
# that succeeded within OBSERVED_WITHIN_S (in the portal: of its name in its workspace; in the trace
# replay: of its team). See docs/scheduler.md, "Explanations and estimates".
OBSERVED_RUNS = 20
OBSERVED_WITHIN_S = 30 * 86400.0


# --- Plain data in ---------------------------------------------------------------------------


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
    weight: float = 1.0
    # Decayed past use per GPU type, in GPU-seconds (see Policy.half_life_s).
    history: tuple[tuple[str, float], ...] = ()

    def quota(self, gpu_type: str) -> Quota:
        """A type without a quota row has no nominal quota: such work may only borrow."""
        for quota in self.quotas:
            if quota.gpu_type == gpu_type:
                return quota
        return Quota(gpu_type, ZERO)


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
class ReplicaPlacement:
    node: str
    devices: tuple[tuple[int, Decimal], ...]  # (device index, share)


# Slots: a pass reads hundreds of thousands of these, and fields kept in the object itself are read sooner.
@dataclass(frozen=True, slots=True)
class Workload:
    key: str  # "job:12", "instance:3"
    workspace: str
    gpu_type: str
    gpus_per_replica: Decimal
    replicas: int = 1
    priority: int = 0
    seq: int = 0  # submission order; earlier first among equal priorities
    submitted_at: float = 0.0
    preemptible: bool = True
    checkpointable: bool = False
    # For estimates only. A run's expected length (e.g. the median of its earlier runs; None: unknown)
    # and its declared limit (it is stopped then; None: none): see Engine._runtime.
    expected_runtime_s: float | None = None
    max_runtime_s: float | None = None
    eligible_at: float = 0.0  # requeued with backoff: not considered before this time
    # Running workloads only: when they started and where they hold their devices.
    started_at: float | None = None
    cluster: str | None = None
    placement: tuple[ReplicaPlacement, ...] = ()
    # Its other pod sets of `gpu_type`, each (GPUs per replica, replicas), placed with the first:
    # all together or none (a Ray cluster's head and workers).
    more: tuple[tuple[Decimal, int], ...] = ()
    # Running workloads only: the reservation (Reservation.key) whose devices it runs on, uncounted
    # against its workspace's quota; None: none.
    reservation: str | None = None

    @property
    def total_gpus(self) -> Decimal:
        return self.gpus_per_replica * self.replicas + sum((g * r for g, r in self.more), Decimal("0"))

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """Each pod set's (thousandths of a GPU per replica, replicas), the first one first."""
        return ((self.replica_units, self.replicas), *((units_of(g), r) for g, r in self.more))

    # Thousandths of a GPU per replica and in all, worked out once (the scheduling pass asks for them
    # again and again).
    # With several pod sets, preemption makes room for `all_replicas` replicas of the widest one's
    # size (`widest_units`): enough for each, however they are placed.
    replica_units: int = field(init=False, repr=False, compare=False)
    units: int = field(init=False, repr=False, compare=False)
    widest_units: int = field(init=False, repr=False, compare=False)
    all_replicas: int = field(init=False, repr=False, compare=False)

    def started(self, at: float | None) -> Workload:
        """The same workload started at `at`: `replace(self, started_at=at)` without working out its
        units again (the pass admits thousands at a time)."""
        copy = object.__new__(Workload)
        for name in Workload.__slots__:
            object.__setattr__(copy, name, getattr(self, name))
        object.__setattr__(copy, "started_at", at)
        return copy

    def __post_init__(self) -> None:
        replica_units = units_of(self.gpus_per_replica)
        more = [(units_of(g), r) for g, r in self.more]
        object.__setattr__(self, "replica_units", replica_units)
        object.__setattr__(self, "units", replica_units * self.replicas + sum(u * r for u, r in more))
        object.__setattr__(self, "widest_units", max([replica_units, *(u for u, _ in more)]))
        object.__setattr__(self, "all_replicas", self.replicas + sum(r for _, r in more))


@dataclass(frozen=True)
class Reservation:
    """Whole devices of one pool held for one workspace over [start, end) (an approved GPU
    provisioning request): from `start` only its work runs there, uncounted against its quota;
    before it, only work declared to end by then, or preemptible work (evicted `Policy.grace_s`
    before it), may use them."""

    key: str  # "gpr:7"
    workspace: str
    cluster: str
    gpu_type: str
    devices: tuple[tuple[str, int], ...]  # (node name, device index), whole devices
    start: float
    end: float
    label: str = ""  # how reasons name it, e.g. "team-b's reservation, Mon 09:00-Thu 09:00"

    @property
    def gpus(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class Policy:
    name: Literal["portal", "fifo", "shared"] = "portal"
    placement: Literal["binpack", "spread"] = "binpack"
    placement_by_cluster: tuple[tuple[str, str], ...] = ()  # (cluster, "binpack" | "spread") overrides
    half_life_s: float = 7 * 86400.0  # fair share: how fast past use is forgotten
    min_runtime_s: float = 600.0  # never preempt a workload younger than this
    starvation_s: float = 3600.0  # a blocked gang older than this gets capacity held for it
    grace_s: float = 60.0  # checkpoint-aware workloads get this long to save before they stop
    max_scan: int = 100_000  # pending workloads examined per cycle (Slurm's bf_max_job_test)
    max_victims: int = 32  # most workloads one preemption may evict
    preemption: bool = True
    max_preemption_tries: int = 64  # preemption searches per cycle, to bound a cycle's cost


@dataclass(frozen=True)
class Snapshot:
    workspaces: tuple[WorkspaceInfo, ...]
    nodes: tuple[NodeInfo, ...]  # device shares already net of the running workloads
    running: tuple[Workload, ...]
    pending: tuple[Workload, ...]
    now: float = 0.0
    policy: Policy = field(default_factory=Policy)
    reservations: tuple[Reservation, ...] = ()
    estimate: bool = True  # work out the pending workloads' estimated starts (the costly part of a pass)


# --- Decisions out -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Admit:
    key: str
    cluster: str | None
    placement: tuple[ReplicaPlacement, ...]
    borrowed: Decimal = ZERO
    reservation: str | None = None  # placed on this reservation's devices, uncounted against quota


@dataclass(frozen=True)
class Preempt:
    key: str
    reason: str
    for_key: str
    grace_s: float = 0.0


class Pending(NamedTuple):
    """Why a workload still waits, where it stands and when it should start."""

    key: str
    reason: str
    workspace_position: int
    cluster_position: int
    estimated_start: float | None = None  # always after the cycle's `now`; None: unknown


class PendingList(Sequence[Pending]):
    """An explained pass's `Pending`, one per pending workload in the cluster's queue order, kept as
    columns and made as they are read: made all at once, hundreds of thousands of objects that live
    on cost the garbage collector more than the pass that explains them."""

    __slots__ = ("estimates", "keys", "positions", "reasons")

    def __init__(self, keys: list[str], reasons: list[str], positions: list[int], estimates: list[float | None]):
        self.keys, self.reasons, self.positions, self.estimates = keys, reasons, positions, estimates

    def __len__(self) -> int:
        return len(self.keys)

    @overload
    def __getitem__(self, index: int) -> Pending: ...

    @overload
    def __getitem__(self, index: slice) -> list[Pending]: ...

    def __getitem__(self, index: int | slice) -> Pending | list[Pending]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return Pending(self.keys[index], self.reasons[index], self.positions[index], index + 1, self.estimates[index])

    def __iter__(self) -> Iterator[Pending]:
        return map(Pending._make, zip(self.keys, self.reasons, self.positions, count(1), self.estimates))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PendingList({list(self)!r})"


@dataclass(frozen=True)
class Reject:
    key: str
    reason: str


@dataclass
class Decisions:
    admitted: list[Admit] = field(default_factory=list)
    preempted: list[Preempt] = field(default_factory=list)
    pending: Sequence[Pending] = field(default_factory=list)
    rejected: list[Reject] = field(default_factory=list)
    # Whether `pending` carries estimated starts (False: the pass was asked for none, and every
    # `estimated_start` is None), and the CPU seconds working them out took.
    estimated: bool = field(default=False, compare=False)
    estimate_s: float = field(default=0.0, compare=False)
