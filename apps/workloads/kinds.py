"""The kind registry: what each kind of workload is, for the parts of the portal that serve every
kind alike (the scheduler's adapter, metrics, workload tokens, live events).

A kind's app registers its ``KindInfo`` when it is ready (``AppConfig.ready``); nothing outside
the kind's app names it. What the workload host needs of a kind (its spec, its phases, the
actions that record what happened) is apps/workloads/host.py's ``Kind``, registered alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Scheduling:
    """How the scheduler treats a kind it admits.

    ``queued``: the state of a workload waiting for admission; ``admitted``: the state admission
    moves it to; ``holding``: the states in which its pod sets hold their devices. ``succeeded``:
    the state of a run that ended well (its past runs of a name estimate the next one's length;
    None: no estimates). ``preempt(pk, reason, grace_s)``: stop it for other work (None: never
    preempted, whatever its row says). ``details(pks)``: per id, whether it takes a grace signal
    before preemption and its runtime limit in seconds. ``requeue_unready(timeout_s)``: put back in
    line what was admitted longer ago than that and never ran, returning their ids.
    ``make_way(pks, reason)``: for a node's drain, where the kind replaces its workloads elsewhere
    before they stop (make before break), whatever their class; ``stay(pks)`` takes that back
    (the node came back first). None: a drain preempts it or waits it out.
    """

    queued: str
    admitted: str
    holding: tuple[str, ...]
    admit_event: str
    succeeded: str | None = None
    preempt: Callable[[int, str, float], None] | None = None
    details: Callable[[Iterable[int]], dict[int, tuple[bool, float | None]]] | None = None
    requeue_unready: Callable[[float], list[int]] | None = None
    make_way: Callable[[list[int], str], None] | None = None
    stay: Callable[[list[int]], None] | None = None


@dataclass(frozen=True)
class KindInfo:
    """One kind of workload. ``model``: its detail model (a subclass of ``Workload``);
    ``token_states``: the states in which its processes may run, and so its workload token works;
    ``events``: the audit events counted as its submissions and failures; ``scheduling``: None
    for a kind the scheduler does not admit (a notebook runs on its instance's devices)."""

    name: str
    model: type[Any]
    token_states: tuple[str, ...]
    submit_event: str
    fail_event: str
    scheduling: Scheduling | None = None
    label: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def states(self) -> tuple[str, ...]:
        return tuple(self.model.State.values)


KINDS: dict[str, KindInfo] = {}


def register(info: KindInfo) -> None:
    KINDS[info.name] = info


def kind(name: str) -> KindInfo:
    return KINDS[name]


def scheduled() -> dict[str, Scheduling]:
    """The kinds the scheduler admits, by name."""
    return {name: info.scheduling for name, info in KINDS.items() if info.scheduling is not None}
