"""Scheduling engine at scale, in process on one core: admission rate, one explained pass, memory.

    .venv/bin/python bench/scale.py --json scale.json

The cluster: 1,000 nodes x 8 GPUs of one type; 50 workspaces in 5 cohorts of 10, quotas adding up
to the cluster, all allowed to borrow inside their cohort; 15,000 pending workloads from a quarter
GPU to 64-GPU gangs (see MIX). See bench/README.md for what each figure measures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
import timeit
import tracemalloc
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from apps.scheduling.engine import Engine  # noqa: E402
from apps.scheduling.types import UNIT, Device, NodeInfo, Policy, Quota, Workload, WorkspaceInfo, units_of  # noqa: E402

GPU_TYPE = "h100"
NODES, GPUS_PER_NODE = 1000, 8
COHORTS, WORKSPACES_PER_COHORT = 5, 10
PENDING = 15_000
# (GPUs per replica, replicas, weight in the mix): fractions, single GPUs, whole nodes, gangs.
MIX = (
    ("0.25", 1, 5), ("0.5", 1, 10), ("1", 1, 45), ("2", 1, 10), ("4", 1, 10), ("8", 1, 10),
    ("8", 2, 5), ("8", 4, 3), ("8", 8, 2),
)  # fmt: skip


def reference_loop_ms() -> float:
    """The machine's speed now: milliseconds for a fixed pure-Python loop (the best of 5 runs of 5), as
    `python3 -m timeit -n 5 "sum(i*i for i in range(1000000))"` prints it. Figures from different
    machines or hours compare as multiples of it."""
    runs = timeit.repeat("sum(i*i for i in range(1000000))", number=5, repeat=5)
    return round(min(runs) / 5 * 1000, 1)


def cluster() -> tuple[tuple[WorkspaceInfo, ...], tuple[NodeInfo, ...]]:
    devices = tuple(Device(i, Decimal(1)) for i in range(GPUS_PER_NODE))
    nodes = tuple(NodeInfo(f"node-{n:04d}", "bench", GPU_TYPE, devices) for n in range(NODES))
    count = COHORTS * WORKSPACES_PER_COHORT
    base = NODES * GPUS_PER_NODE // count  # 160 each, alternating 96 and 224 so quotas differ
    workspaces = tuple(
        WorkspaceInfo(
            f"ws-{w:02d}",
            (Quota(GPU_TYPE, Decimal(base + (64 if w % 2 else -64))),),
            cohort=f"cohort-{w % COHORTS}",
            can_borrow=True,
        )
        for w in range(count)
    )
    return workspaces, nodes


class Stream:
    """Workloads drawn from MIX, numbered in submission order; the same seed gives the same stream."""

    def __init__(self, seed: int, workspaces: tuple[WorkspaceInfo, ...]):
        self.random = random.Random(seed)
        self.names = [w.name for w in workspaces]
        self.shapes = [(Decimal(g), r) for g, r, _ in MIX]
        self.weights = [w for _, _, w in MIX]
        self.seq = 0

    def next(self, now: float) -> Workload:
        self.seq += 1
        gpus, replicas = self.random.choices(self.shapes, self.weights)[0]
        priority = 1 if self.random.random() < 0.05 else 0
        runtime = self.random.choice((600.0, 3600.0, 4 * 3600.0, 24 * 3600.0))
        name = self.random.choice(self.names)
        return Workload(
            f"job:{self.seq}", name, GPU_TYPE, gpus, replicas, priority, self.seq, now, expected_runtime_s=runtime
        )


def loaded_engine(policy: Policy, seed: int) -> tuple[Engine, Stream]:
    workspaces, nodes = cluster()
    engine = Engine(workspaces, nodes, policy)
    stream = Stream(seed, workspaces)
    for _ in range(PENDING):
        engine.submit(stream.next(0.0))
    return engine, stream


def full_passes(policy: Policy, seed: int, repeat: int, estimate: bool = True) -> dict[str, Any]:
    """One explained pass from an empty cluster, then one over a full cluster (admits little), on a
    fresh engine each time; the median of `repeat` times of each, and of the part of each that
    worked out the estimated starts (none without `estimate`). What building the engine left for
    the garbage collector is collected before each timed pass."""
    firsts: list[float] = []
    seconds: list[float] = []
    estimating: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        engine, stream = loaded_engine(policy, seed)
        gc.collect()
        started = time.process_time()
        first = engine.cycle(0.0, explain=True, estimate=estimate)
        firsts.append(time.process_time() - started)
        for _ in range(len(first.admitted)):  # keep the backlog at PENDING
            engine.submit(stream.next(0.0))
        for key in sorted(engine.running)[:50]:
            engine.finish(key, 60.0)
        gc.collect()
        started = time.process_time()
        second = engine.cycle(60.0, explain=True, estimate=estimate)
        seconds.append(time.process_time() - started)
        estimating[0].append(first.estimate_s)
        estimating[1].append(second.estimate_s)
    return {
        "estimated": estimate,
        "first_pass_estimates_s": round(statistics.median(estimating[0]), 3),
        "full_cluster_pass_estimates_s": round(statistics.median(estimating[1]), 3),
        "first_pass_s": round(statistics.median(firsts), 3),
        "first_pass_runs_s": [round(s, 3) for s in firsts],
        "first_pass_admitted": len(first.admitted),
        "first_pass_explained": len(first.pending),
        "full_cluster_pass_s": round(statistics.median(seconds), 3),
        "full_cluster_pass_runs_s": [round(s, 3) for s in seconds],
        "full_cluster_pass_admitted": len(second.admitted),
        "full_cluster_pass_explained": len(second.pending),
        "full_cluster_pass_preempted": len(second.preempted),
    }


class Books:
    """Use per workspace kept apart from the engine, to check every cohort after each cycle: what its
    workspaces use above their quotas must not exceed what the others leave idle of theirs."""

    def __init__(self, workspaces: tuple[WorkspaceInfo, ...]):
        self.nominal = {w.name: units_of(w.quotas[0].nominal) for w in workspaces}
        self.cohort = {w.name: w.cohort or w.name for w in workspaces}
        self.used = dict.fromkeys(self.nominal, 0)
        self.overcommitted = 0  # (cycle, cohort) pairs found over-committed
        self.worst = 0  # the most GPUs (thousandths) any cohort used beyond its quotas

    def change(self, workload: Workload, sign: int) -> None:
        self.used[workload.workspace] += sign * workload.units

    def check(self) -> None:
        balance: dict[str, int] = {}
        for name, nominal in self.nominal.items():
            balance[self.cohort[name]] = balance.get(self.cohort[name], 0) + self.used[name] - nominal
        self.overcommitted += sum(1 for b in balance.values() if b > 0)
        self.worst = max(self.worst, *balance.values())


def sustained(policy: Policy, seed: int, steps: int, finish_per_step: int) -> dict[str, Any]:
    """Steady state: each step the oldest running workloads finish, one cycle (explain=False) runs,
    victims go back in line and fresh submissions keep PENDING waiting. Admissions per engine CPU
    second (finish, cycle and submit), the first (cold) step excluded."""
    workspaces, _ = cluster()
    engine, stream = loaded_engine(policy, seed)
    books, submitted = Books(workspaces), {w.key: w for w in engine.pending.values()}
    started_at: dict[str, float] = {}
    admitted = preempted = 0
    cpu = 0.0
    for step in range(steps + 1):
        now = step * 60.0
        oldest = sorted(started_at, key=lambda k: (started_at[k], submitted[k].seq))[:finish_per_step]
        begin = time.process_time()
        for key in oldest:
            engine.finish(key, now)
        decisions = engine.cycle(now, explain=False)
        if step:
            cpu += time.process_time() - begin
            admitted += len(decisions.admitted)
            preempted += len(decisions.preempted)
        for key in oldest:
            del started_at[key]
            books.change(submitted[key], -1)
        evicted = {preempt.key for preempt in decisions.preempted}
        for key in sorted(evicted & started_at.keys()):  # the others were admitted and evicted in this cycle
            del started_at[key]
            books.change(submitted[key], -1)
        for admit in decisions.admitted:
            if admit.key not in evicted:
                started_at[admit.key] = now
                books.change(submitted[admit.key], +1)
        books.check()
        fresh = [stream.next(now) for _ in range(PENDING - len(engine.pending) - len(evicted))]
        submitted.update((w.key, w) for w in fresh)
        begin = time.process_time()
        for key in sorted(evicted):
            engine.submit(submitted[key])  # back in line, in its old place
        for workload in fresh:
            engine.submit(workload)
        if step:
            cpu += time.process_time() - begin
    return {
        "steps": steps,
        "admitted": admitted,
        "preempted": preempted,
        "engine_cpu_s": round(cpu, 3),
        "admissions_per_s": round(admitted / cpu, 1) if cpu else 0.0,
        "decisions_per_s": round((admitted + preempted) / cpu, 1) if cpu else 0.0,
        "pending_at_end": len(engine.pending),
        "running_at_end": len(engine.running),
        "cohort_overcommitted": books.overcommitted,
        "worst_cohort_excess_gpus": books.worst / UNIT,
    }


def peak_memory(policy: Policy, seed: int) -> dict[str, Any]:
    """tracemalloc's peak while the engine is built, loaded and runs an explained pass and 20 cycles."""
    gc.collect()
    tracemalloc.start()
    engine, stream = loaded_engine(policy, seed)
    engine.cycle(0.0, explain=True)
    for step in range(1, 21):
        for key in sorted(engine.running)[:50]:
            engine.finish(key, step * 60.0)
        for _ in range(len(engine.cycle(step * 60.0, explain=False).admitted)):
            engine.submit(stream.next(step * 60.0))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"peak_mib": round(peak / 2**20, 1)}


def main() -> int:
    global PENDING
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default="-", help="where to write the results; - for stdout (default)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=200, help="steady-state cycles to time (default %(default)s)")
    p.add_argument("--finish-per-step", type=int, default=50, help="workloads ending per cycle (default %(default)s)")
    p.add_argument("--pending", type=int, default=PENDING, help="workloads kept waiting (default %(default)s)")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--only-passes", action="store_true", help="measure the explained passes alone")
    only.add_argument(
        "--only-sustained", action="store_true", help="measure the sustained cycles alone (to pair engines run by run)"
    )
    p.add_argument("--repeat", type=int, default=3, help="times each explained pass is timed (default %(default)s)")
    p.add_argument(
        "--no-estimates",
        action="store_true",
        help="explained passes without estimated starts, as the portal runs most cycles where the line is long",
    )
    p.add_argument(
        "--max-scan", type=int, default=1000, help="Policy.max_scan of the timed cycles (default %(default)s)"
    )
    args = p.parse_args()
    PENDING = args.pending
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    policy = Policy(name="portal", max_scan=args.max_scan)
    explained = Policy(name="portal")  # max_scan 100,000: the explained pass looks at every pending workload
    before = reference_loop_ms()
    result: dict[str, Any] = {
        "nodes": NODES,
        "gpus": NODES * GPUS_PER_NODE,
        "workspaces": COHORTS * WORKSPACES_PER_COHORT,
        "cohorts": COHORTS,
        "pending": PENDING,
        "max_scan": args.max_scan,
    }
    if not args.only_sustained:
        result["full_pass"] = full_passes(explained, args.seed, args.repeat, estimate=not args.no_estimates)
    if not args.only_passes:
        result["sustained"] = sustained(policy, args.seed, args.steps, args.finish_per_step)
    if not (args.only_passes or args.only_sustained):
        result["memory"] = peak_memory(explained, args.seed)
    # The machine's speed, before and after: admissions per CPU second times the loop's seconds is
    # admissions per reference loop, a figure that compares across machines (as a ratio, roughly).
    result["reference_loop_ms"] = [before, reference_loop_ms()]
    if "sustained" in result:
        loop_s = statistics.mean(result["reference_loop_ms"]) / 1000
        result["sustained"]["admissions_per_reference_loop"] = round(
            result["sustained"]["admissions_per_s"] * loop_s, 1
        )
    text = json.dumps(result, indent=2) + "\n"
    if args.json == "-":
        sys.stdout.write(text)
    else:
        Path(args.json).write_text(text)
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
