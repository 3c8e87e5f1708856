"""Adversarial scenarios for the scheduler's guarantees, replayed in simulated time.

Part of the pure scheduling core: no Django. Each scenario is a small cluster, quotas and a trace
built to break one promise of docs/scheduler.md ("Guarantees"): a protected workspace submits
work that the promise covers, and others submit the work most likely to keep it waiting. The
tests (tests/scheduling/test_guarantees.py) check each bound; the benchmark (bench/scenarios.py)
reports each scenario's figures under every policy.

    python -m apps.scheduling.scenarios            # every scenario, every policy, as JSON
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from apps.scheduling.replay import PORTAL, Job, Options, Replay
from apps.scheduling.types import Policy

HOUR = 3600.0


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    quotas: dict[str, int]  # team: GPUs; the cluster is their sum, in nodes of 8
    cohorts: dict[str, str | None] | None  # None: all teams in one cohort
    jobs: tuple[Job, ...]
    protected: frozenset[str]  # the ids of the jobs the promise is about
    # The promised bound on the protected team's wait, in seconds, under a policy.
    bound: Callable[[Policy, float], float]
    # Knobs of the portal policy that differ from the replay's (e.g. a shorter min_runtime_s).
    knobs: tuple[tuple[str, float], ...] = ()


class _Trace:
    """Jobs in the order they are added; ids and file order follow."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.protected: set[str] = set()

    def add(
        self, team: str, at: float, duration: float, gpus: str | int, count: int = 1, protected: bool = False
    ) -> None:
        for _ in range(count):
            n = len(self.jobs)
            self.jobs.append(Job(f"{team}-{n}", at, duration, Decimal(str(gpus)), team, n))
            if protected:
                self.protected.add(f"{team}-{n}")

    def stream(
        self, team: str, start: float, end: float, every: float, durations: list[float], gpus: str | int
    ) -> None:
        """A job every `every` seconds from `start` to `end`, durations taken in turn."""
        at, i = start, 0
        while at < end:
            self.add(team, at, durations[i % len(durations)], gpus)
            at += every
            i += 1

    def done(self) -> tuple[Job, ...]:
        return tuple(sorted(self.jobs, key=lambda j: (j.submit_s, j.seq)))


def reclaim_bound(policy: Policy, interval: float) -> float:
    """Nominal quota comes back within min_runtime_s plus one period."""
    return policy.min_runtime_s + interval


def _flood_then_reclaim_small() -> Scenario:
    t = _Trace()
    t.add("borrower", 0, 40 * HOUR, 1, count=64)  # 16 GPUs taken, 8 of them the owner's
    t.add("owner", 1 * HOUR, 4 * HOUR, 1, count=8, protected=True)
    return Scenario(
        "flood-reclaim-small",
        "a borrower floods the cluster with long 1-GPU jobs; the owner then asks for its 8 GPUs as 8 jobs",
        {"owner": 8, "borrower": 8},
        None,
        t.done(),
        frozenset(t.protected),
        reclaim_bound,
    )


def _flood_then_reclaim_stream() -> Scenario:
    t = _Trace()
    # About 24 short jobs in flight for 16 GPUs: whatever ends is wanted again at once.
    t.stream("borrower", 0, 72 * HOUR, 300, [1.5 * HOUR, 2 * HOUR, 1 * HOUR], 1)
    t.add("owner", 24 * HOUR, 6 * HOUR, 8, protected=True)
    return Scenario(
        "flood-reclaim-short-stream",
        "a borrower keeps a stream of short 1-GPU jobs going; at hour 24 the owner asks for one 8-GPU job",
        {"owner": 8, "borrower": 8},
        None,
        t.done(),
        frozenset(t.protected),
        _reclaim_gang_bound(2 * HOUR),  # what it drains of the borrower's work within its quota: 2 h at most
    )


def _flood_then_reclaim_gangs() -> Scenario:
    t = _Trace()
    t.add("borrower", 0, 50 * HOUR, 16, count=6)  # 2-node gangs over all 8 nodes
    t.add("owner", 24 * HOUR, 6 * HOUR, 8, count=4, protected=True)
    t.add("owner", 24 * HOUR, 6 * HOUR, 32, protected=True)
    return Scenario(
        "flood-reclaim-big-gangs",
        "a borrower holds the cluster with 16-GPU gangs; the owner asks for 4 x 8 GPUs and a 32-GPU gang",
        {"owner": 64, "borrower": 0},
        None,
        t.done(),
        frozenset(t.protected),
        reclaim_bound,
    )


def _reclaim_spread() -> Scenario:
    t = _Trace()
    # 1-GPU jobs over every node, none of them idle: a 32-GPU gang needs victims on 4 whole nodes.
    t.add("borrower", 0, 60 * HOUR, 1, count=64)
    t.add("owner", 24 * HOUR, 6 * HOUR, 32, protected=True)
    return Scenario(
        "reclaim-gang-over-spread-jobs",
        "a borrower's 1-GPU jobs cover every node; the owner asks for a 32-GPU gang within its quota",
        {"owner": 32, "borrower": 32},
        None,
        t.done(),
        frozenset(t.protected),
        reclaim_bound,
    )


def _gang_bound(longest: float) -> Callable[[Policy, float], float]:
    def bound(policy: Policy, interval: float) -> float:
        """A gang waiting for its own workspace's work (beyond its quota as it stands): its nodes and
        quota held from starvation_s and drained within the longest runtime of that work; plus one
        period."""
        return max(policy.min_runtime_s, policy.starvation_s + longest) + interval

    return bound


def _reclaim_gang_bound(longest: float) -> Callable[[Policy, float], float]:
    def bound(policy: Policy, interval: float) -> float:
        """A gang within its nominal quota: its nodes held from its first refusal; what others run
        there above their quotas evicted after min_runtime_s, their work within their quotas drained
        within its longest runtime; plus one period."""
        return max(policy.min_runtime_s, longest) + interval

    return bound


def _gangs_in_stream_one_team() -> Scenario:
    t = _Trace()
    t.stream("team", 0, 96 * HOUR, 150, [2 * HOUR, 3 * HOUR, 1 * HOUR], 1)  # 3/4 of the cluster on average
    for hour in (10, 40, 70):
        t.add("team", hour * HOUR, 4 * HOUR, 64, protected=True)
    return Scenario(
        "gangs-in-a-stream-one-team",
        "one team owns the cluster and runs a 1-GPU stream that keeps it busy; three 64-GPU gangs arrive",
        {"team": 64},
        None,
        t.done(),
        frozenset(t.protected),
        _gang_bound(3 * HOUR),
    )


def _gangs_in_stream_borrowing() -> Scenario:
    t = _Trace()
    t.stream("borrower", 0, 96 * HOUR, 120, [2 * HOUR, 3 * HOUR, 1 * HOUR], 1)
    for hour in (10, 40, 70):
        t.add("owner", hour * HOUR, 4 * HOUR, 32, protected=True)
    return Scenario(
        "gangs-in-a-borrowed-stream",
        "a borrower's 1-GPU stream keeps the cluster full; the owner's 32-GPU gangs fit its quota",
        {"owner": 32, "borrower": 32},
        None,
        t.done(),
        frozenset(t.protected),
        _reclaim_gang_bound(3 * HOUR),  # some of the borrower's work on its nodes is within its quota
    )


def _no_quota() -> Scenario:
    t = _Trace()
    t.add("guest", 0, 30 * HOUR, 1, count=32)  # no quota: all of it borrowed
    t.add("owner", 2 * HOUR, 5 * HOUR, 8, count=2, protected=True)
    t.add("member", 3 * HOUR, 5 * HOUR, 1, count=16)
    return Scenario(
        "workspace-without-quota",
        "a workspace without quota borrows the whole cluster; both owners take theirs back",
        {"owner": 16, "member": 16},
        None,
        t.done(),
        frozenset(t.protected),
        reclaim_bound,
    )


def _blocked_queue() -> Scenario:
    t = _Trace()
    t.add("blocked", 0, 20 * HOUR, 8)  # its whole quota, then 300 jobs that cannot fit it
    t.add("blocked", 1, 2 * HOUR, 4, count=300)
    t.add("small", 60, 1 * HOUR, 1, protected=True)
    return Scenario(
        "blocked-queue",
        "a workspace without borrowing has 300 jobs beyond its quota; another's 1-GPU job must not wait on them",
        {"blocked": 8, "small": 8},
        {"blocked": None, "small": None},
        t.done(),
        frozenset(t.protected),
        lambda policy, interval: interval,
    )


def _fractions() -> Scenario:
    t = _Trace()
    t.add("borrower", 0, 30 * HOUR, "0.5", count=20)
    t.add("borrower", 0, 30 * HOUR, "0.25", count=24)
    t.add("borrower", 0, 30 * HOUR, 1, count=4)
    t.add("borrower", 0, 30 * HOUR, "0.333", count=9)
    t.add("owner", 3 * HOUR, 5 * HOUR, "0.25", count=8, protected=True)
    t.add("owner", 3 * HOUR, 5 * HOUR, "0.5", count=4, protected=True)
    t.add("owner", 3 * HOUR, 5 * HOUR, 1, count=2, protected=True)
    t.add("owner", 3 * HOUR, 5 * HOUR, "0.333", count=3, protected=True)
    t.add("owner", 3 * HOUR, 5 * HOUR, "0.667", protected=True)
    return Scenario(
        "fractions",
        "thirds, quarters and halves of GPUs mixed with whole GPUs; the owner reclaims 7.67 GPUs' worth",
        {"owner": 8, "borrower": 8},
        None,
        t.done(),
        frozenset(t.protected),
        reclaim_bound,
    )


def _gang_in_others_streams() -> Scenario:
    t = _Trace()
    # Two teams' streams of short 1-GPU jobs, more than their quotas together: both borrow the owner's
    # idle quota, and their jobs, within their quotas or not, sit on every node.
    t.stream("b", 0, 30 * HOUR, 120, [1.5 * HOUR, 2 * HOUR, 1 * HOUR], 1)
    t.stream("c", 60, 30 * HOUR, 120, [1.5 * HOUR, 2 * HOUR, 1 * HOUR], 1)
    t.add("owner", 10 * HOUR, 4 * HOUR, 16, protected=True)
    return Scenario(
        "gang-in-other-teams-streams",
        "two teams' 1-GPU streams cover every node (min_runtime_s 1 h); the owner's 16-GPU gang fits its quota",
        {"owner": 16, "b": 24, "c": 24},
        None,
        t.done(),
        frozenset(t.protected),
        reclaim_bound,
        (("min_runtime_s", HOUR),),
    )


def _gang_refused_for_quota() -> Scenario:
    t = _Trace()
    t.add("borrower", 0, 60 * HOUR, 7, count=4)  # 7 of every node's 8 GPUs, all borrowed
    t.stream("other", 0, 40 * HOUR, 300, [1 * HOUR], 1)  # within its quota: the last GPU of every node
    t.add("owner", 2 * HOUR, 4 * HOUR, 16, protected=True)
    return Scenario(
        "gang-refused-for-quota",
        "a borrower holds the owner's quota, another team's jobs within its quota take the last GPU of "
        "every node; the owner's 16-GPU gang is refused for quota and needs two whole nodes",
        {"owner": 24, "other": 8},
        None,
        t.done(),
        frozenset(t.protected),
        _reclaim_gang_bound(1 * HOUR),
    )


def _fraction_over_spread_quarters() -> Scenario:
    t = _Trace()
    t.add("borrower", 0, 30 * HOUR, "0.75", count=40)  # one on each of the 40 devices
    t.add("borrower", 1, 30 * HOUR, "0.25", count=40)  # then a quarter on each: the cheapest victims
    t.add("owner", 3 * HOUR, 5 * HOUR, "0.5", protected=True)
    return Scenario(
        "fraction-over-spread-quarters",
        "a borrower's quarters, its cheapest victims, are each on a different device; the owner asks for a half",
        {"owner": 8, "borrower": 32},
        None,
        t.done(),
        frozenset(t.protected),
        reclaim_bound,
    )


def _whole_gpu_over_short_quarters() -> Scenario:
    t = _Trace()
    # Quarters shorter than min_runtime_s: never victims, and what ends is spread over devices.
    t.stream("borrower", 0, 40 * HOUR, 60, [1200.0, 1800.0, 2400.0], "0.25")
    t.add("owner", 2 * HOUR, 4 * HOUR, 1, protected=True)
    return Scenario(
        "whole-gpu-over-short-quarters",
        "a borrower without quota streams short quarter-GPU jobs; the owner asks for one whole GPU",
        {"owner": 8, "borrower": 0},
        None,
        t.done(),
        frozenset(t.protected),
        reclaim_bound,
    )


def _searches_run_out() -> Scenario:
    t = _Trace()
    t.add("borrower", 0, 40 * HOUR, 1, count=128)
    t.add("owner", 3 * HOUR, 4 * HOUR, 1, count=100, protected=True)  # 100 searches: 64 a cycle
    return Scenario(
        "preemption-searches-run-out",
        "the owner reclaims 100 GPUs from old borrowed jobs at once: more searches than one cycle allows",
        {"owner": 128, "borrower": 0},
        None,
        t.done(),
        frozenset(t.protected),
        lambda policy, interval: interval,  # the rest on the next period
    )


def fraction_stream(sizes: tuple[str, ...], jobs: int) -> Scenario:
    """Not a guarantee but a cost: a borrower without quota streams `jobs` short jobs, one a minute,
    their GPUs taken in turn from `sizes` (e.g. 0.25, 0.5 and 0.75: more than the cluster runs, so a
    backlog of mixed shares of a device builds up); the owner asks for one whole GPU at hour 2.
    bench/scenarios.py times the engine on it."""
    t = _Trace()
    for n in range(jobs):
        t.add("borrower", 60.0 * n, (1200.0, 1800.0, 2400.0)[n % 3], sizes[n % len(sizes)])
    t.add("owner", 2 * HOUR, 4 * HOUR, 1, protected=True)
    return Scenario(
        f"fraction-stream-{'-'.join(sizes)}",
        f"a borrower without quota streams {jobs} short jobs of {', '.join(sizes)} GPU in turn; the owner "
        "asks for one whole GPU",
        {"owner": 8, "borrower": 0},
        None,
        t.done(),
        frozenset(t.protected),
        reclaim_bound,
    )


SCENARIOS: tuple[Callable[[], Scenario], ...] = (
    _flood_then_reclaim_small, _flood_then_reclaim_stream, _flood_then_reclaim_gangs, _reclaim_spread,
    _gangs_in_stream_one_team, _gangs_in_stream_borrowing, _no_quota, _blocked_queue, _fractions,
    _gang_in_others_streams, _gang_refused_for_quota, _fraction_over_spread_quarters,
    _whole_gpu_over_short_quarters, _searches_run_out,
)  # fmt: skip

POLICIES = ("portal", "fifo", "shared")


def policy_named(name: str, knobs: tuple[tuple[str, float], ...] = ()) -> Policy:
    if name == "portal":
        return replace(PORTAL, **dict(knobs))  # type: ignore[arg-type]
    return Policy(name=name, preemption=False, starvation_s=PORTAL.starvation_s)  # type: ignore[arg-type]


def run(scenario: Scenario, policy_name: str = "portal", interval_s: float = 2.0) -> dict[str, Any]:
    """Replay one scenario: the protected team's waits against the promised bound, and the rest."""
    policy = policy_named(policy_name, scenario.knobs)
    options = replace(Options(), policy=policy, interval_s=interval_s, cohorts=scenario.cohorts)
    replay = Replay(list(scenario.jobs), scenario.quotas, options)
    metrics = replay.run()
    waits = [
        replay.first_start[j] - replay.progress[j].job.submit_s for j in scenario.protected if j in replay.first_start
    ]
    unstarted = len(scenario.protected) - len(waits)  # rejected: a hard quota can never hold them
    bound = scenario.bound(policy_named("portal", scenario.knobs), interval_s)
    worst = max(waits, default=0.0)
    return {
        "scenario": scenario.name,
        "policy": policy_name,
        "bound_s": bound,
        "protected_jobs": len(scenario.protected),
        "protected_rejected": unstarted,
        "protected_max_wait_s": worst,
        "protected_mean_wait_s": round(sum(waits) / len(waits), 1) if waits else 0.0,
        "within_bound": worst <= bound and not unstarted,
        "victims": metrics["preemptions"],
        "avg_jct_s": metrics["avg_jct_s"],
        "rejected": metrics["rejected"],
        "quota_violations": metrics["quota_violations"],
        "partial_gangs": metrics["partial_gangs"],
        "engine_cpu_s": metrics["engine_cpu_s"],
    }


def main() -> int:
    results = [run(make(), policy) for make in SCENARIOS for policy in POLICIES]
    json.dump(results, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
