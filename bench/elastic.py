"""Elastic node pools on the Philly trace: what an autoscaled cluster saves in node-hours, and costs in JCT.

    .venv/bin/python bench/elastic.py [--traces ../shared/traces] [--out bench/out] [--skip N] [--limit N]
                                      [--seed N] [--period-s S] [--start-delay-s S] [--scale-down-delay-s S]
                                      [--min-nodes N] [--max-nodes N]

Replays a slice of the trace (the file's jobs from --skip, --limit of them) under portal, on one
core, twice with the same loop over the engine: (a) on the fixed cluster, every node up all the
time; (b) on an elastic one that starts with --min-nodes up (half the nodes by default) and may
grow to --max-nodes (all of them). In (b), after the cycle of every period (--period-s) the
autoscaler (`apps.scheduling.autoscale.decide`) is asked, with the cluster's nodes as one elastic
pool, as the portal asks it: a powered-down or starting node shows no free devices to the engine.
A node it starts takes --start-delay-s to become usable; an up node that has been empty for
--scale-down-delay-s is stopped, never below --min-nodes, never one with work on it.

The loop: a job is submitted at its arrival and ends when its run is done; a cycle runs at every
moment where jobs arrive or end or nodes become ready, and at every period while work waits; a
preempted job goes back in line and keeps the work of its last checkpoint (the replay's
--checkpoint-interval-s and --restart-cost-s defaults). Reports, for both: mean, median and
95th-percentile JCT (end - submit) and queueing delay (first start - submit), makespan (first
submission to last end), node-hours (each node's time powered, starting included, over that span,
and up to the last submission: the trace ends with weeks of a few long jobs), mean nodes powered;
for (b) the scale-ups and scale-downs; and the saving in node-hours and the change in JCT. Checks,
exit status 1 if one fails: every job finishes, no work is ever placed on a node that is not up, the
nodes powered stay within --min-nodes and --max-nodes.

Writes OUT/elastic.json. The traces' folder is --traces, else the environment variable
PORTAL_TRACES_DIR, else ../shared/traces beside the checkout; without philly_vc_jobs.csv there, a
synthetic trace in its shape (bench/synthetic.py, --seed, --limit jobs or 6,000) stands in.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from statistics import mean, median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.scheduling import replay  # noqa: E402
from apps.scheduling.autoscale import ElasticNode, ElasticPool, Power, decide  # noqa: E402
from apps.scheduling.engine import Engine  # noqa: E402
from apps.scheduling.types import UNIT, Admit, Device, NodeInfo, Policy, Snapshot, Workload  # noqa: E402
from bench import synthetic  # noqa: E402

HOUR_S = 3600.0
POOL = "trace:elastic"


@dataclass(frozen=True)
class Settings:
    gpus_per_node: int = 8
    policy: Policy = replay.PORTAL
    elastic: bool = False  # False: every node up all the time
    period_s: float = 60.0  # the scheduler's period: a cycle while work waits, then the autoscaler
    start_delay_s: float = 180.0  # a started node is usable this long after the decision
    scale_down_delay_s: float = 600.0  # an up node empty this long is stopped
    min_nodes: int | None = None  # None: half the nodes (rounded up)
    max_nodes: int | None = None  # None: all of them
    checkpoint_interval_s: float = 1800.0  # as the replay's: work kept across a preemption
    restart_cost_s: float = 120.0


@dataclass
class _Run:
    """One job's books: its shape, where it runs, what it kept across preemptions."""

    job: replay.Job
    workload: Workload
    saved_s: float = 0.0
    restart_s: float = 0.0
    started_at: float = 0.0
    end_at: float = 0.0
    admit: Admit | None = None
    first_start: float | None = None
    finished_at: float | None = None


@dataclass
class _Node:
    info: NodeInfo
    power: Power = "up"
    powered_at: float = 0.0  # when it was last started (powering up counts)
    ready_at: float = 0.0  # powering up: when it becomes usable
    idle_since: float | None = 0.0  # up and empty since
    used: dict[int, Decimal] = field(default_factory=lambda: defaultdict(Decimal))  # device: share held
    jobs: set[str] = field(default_factory=set)


class ElasticReplay:
    """The trace's jobs through one engine, on a fixed or an autoscaled cluster (see the module's docstring)."""

    def __init__(self, jobs: list[replay.Job], quotas: dict[str, int], settings: Settings):
        self.settings = settings
        total = sum(quotas.values())
        self.node_infos = replay.build_nodes(total, settings.gpus_per_node)
        count = len(self.node_infos)
        self.min_nodes = math.ceil(count / 2) if settings.min_nodes is None else settings.min_nodes
        self.max_nodes = count if settings.max_nodes is None else settings.max_nodes
        if not 0 < self.min_nodes <= self.max_nodes <= count:
            raise ValueError(f"need 0 < min nodes {self.min_nodes} <= max nodes {self.max_nodes} <= {count}")
        self.workspaces = replay.build_workspaces(quotas, {j.team for j in jobs}, settings.policy)
        self.engine = Engine(self.workspaces, self.node_infos, settings.policy)
        self.pool = self.engine.pools[replay.CLUSTER, replay.GPU_TYPE]
        self.jobs = sorted(jobs, key=lambda j: (j.submit_s, j.seq))
        self.t0 = self.jobs[0].submit_s if self.jobs else 0.0
        self.runs: dict[str, _Run] = {}
        for seq, job in enumerate(self.jobs):
            replicas, per_replica = replay.gang_shape(job.num_gpus, settings.gpus_per_node)
            workload = Workload(job.job_id, job.team, replay.GPU_TYPE, per_replica, replicas, seq=seq,
                                submitted_at=job.submit_s)  # fmt: skip
            self.runs[job.job_id] = _Run(job, workload)
        self.nodes = {info.name: _Node(info, powered_at=self.t0, idle_since=self.t0) for info in self.node_infos}
        self.ends: list[tuple[float, int, str]] = []  # (end, seq, job id) of running jobs
        self.counts = {"cycles": 0, "admitted": 0, "preempted": 0, "rejected": 0, "on_unready_node": 0,
                       "scale_ups": 0, "nodes_started": 0, "scale_downs": 0, "nodes_stopped": 0}  # fmt: skip
        self.spells: list[tuple[float, float]] = []  # (from, to) of every powered spell that ended
        self.powered_range = [count, count]  # fewest and most nodes powered at once
        self.engine_cpu_s = self.autoscaler_cpu_s = 0.0
        if settings.elastic:
            for info in self.node_infos[self.min_nodes :]:
                self._power_down(self.nodes[info.name], self.t0)
            self.powered_range = [self.min_nodes, self.min_nodes]

    # -- the loop ----------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Until every job has ended (see the module's docstring for what happens when)."""
        period, arrivals = self.settings.period_s, 0
        next_tick = math.floor(self.t0 / period) * period + period
        while arrivals < len(self.jobs) or self.ends or self.engine.pending:
            starting = [n.ready_at for n in self.nodes.values() if n.power == "powering_up"]
            now = min(
                self.jobs[arrivals].submit_s if arrivals < len(self.jobs) else math.inf,
                self.ends[0][0] if self.ends else math.inf, min(starting, default=math.inf), next_tick,
            )  # fmt: skip
            happened = False
            while self.ends and self.ends[0][0] <= now:
                self._finish(self.runs[heapq.heappop(self.ends)[2]], now)
                happened = True
            for node in self.nodes.values():
                if node.power == "powering_up" and node.ready_at <= now:
                    self._ready(node, now)
                    happened = True
            while arrivals < len(self.jobs) and self.jobs[arrivals].submit_s <= now:
                self._submit(self.runs[self.jobs[arrivals].job_id])
                arrivals, happened = arrivals + 1, True
            tick = now >= next_tick
            if tick:
                next_tick = math.floor(now / period) * period + period
            if happened or (tick and self.engine.pending):
                self._cycle(now)
            changed = self._autoscale(now) if tick and self.settings.elastic else False
            if tick and not (happened or changed or self.ends or arrivals < len(self.jobs) or starting):
                raise RuntimeError(f"{len(self.engine.pending)} job(s) can never start: the cluster stalled")
        return self.metrics()

    def _submit(self, run: _Run) -> None:
        self._timed(lambda: self.engine.submit(run.workload))

    def _finish(self, run: _Run, now: float) -> None:
        self._timed(lambda: self.engine.finish(run.job.job_id, now))
        self._release(run, now)
        run.finished_at = now

    def _cycle(self, now: float) -> None:
        decisions = self._timed(lambda: self.engine.cycle(now, explain=False))
        self.counts["cycles"] += 1
        self.counts["rejected"] += len(decisions.rejected)
        admitted = {admit.key: admit for admit in decisions.admitted}
        for preempt in decisions.preempted:
            run = self.runs[preempt.key]
            self.counts["preempted"] += 1
            if admitted.pop(preempt.key, None) is None:  # else admitted in this same cycle: it never ran
                self.ends.remove((run.end_at, run.workload.seq, preempt.key))
                heapq.heapify(self.ends)
                self._preempted(run, now)
        for admit in admitted.values():
            self._admitted(self.runs[admit.key], admit, now)
        for preempt in decisions.preempted:  # back in line, in their original place
            self._submit(self.runs[preempt.key])

    def _admitted(self, run: _Run, admit: Admit, now: float) -> None:
        self.counts["admitted"] += 1
        for replica in admit.placement:
            node = self.nodes[replica.node]
            if node.power != "up":
                self.counts["on_unready_node"] += 1
            node.jobs.add(run.job.job_id)
            node.idle_since = None
            for index, share in replica.devices:
                node.used[index] += share
        run.admit, run.started_at = admit, now
        if run.first_start is None:
            run.first_start = now
        run.end_at = now + run.restart_s + run.job.duration_s - run.saved_s
        heapq.heappush(self.ends, (run.end_at, run.workload.seq, run.job.job_id))

    def _preempted(self, run: _Run, now: float) -> None:
        """Back to the last checkpoint: only whole checkpoint intervals of this run's work are kept."""
        worked = max(0.0, now - run.started_at - run.restart_s)
        interval = self.settings.checkpoint_interval_s
        if interval > 0:
            run.saved_s += min(interval * math.floor(worked / interval), run.job.duration_s - run.saved_s)
        run.restart_s = self.settings.restart_cost_s
        self._release(run, now)

    def _release(self, run: _Run, now: float) -> None:
        assert run.admit is not None
        for replica in run.admit.placement:
            node = self.nodes[replica.node]
            node.jobs.discard(run.job.job_id)
            for index, share in replica.devices:
                node.used[index] -= share
            if not node.jobs:
                node.idle_since = now
        run.admit = None

    # -- power -------------------------------------------------------------------------------------

    def _autoscale(self, now: float) -> bool:
        """Ask the autoscaler, as the portal does after a cycle, and carry out what it decides; whether
        anything changed. Not asked when it could decide nothing (no waiting work with a node down, no
        node empty for the delay above the minimum): the same answers, far fewer snapshots."""
        powered = sum(1 for n in self.nodes.values() if n.power != "down")
        may_stop = powered > self.min_nodes and any(
            n.power == "up" and not n.jobs and n.idle_since is not None
            and now - n.idle_since >= self.settings.scale_down_delay_s
            for n in self.nodes.values()
        )  # fmt: skip
        may_start = bool(self.engine.pending) and any(n.power == "down" for n in self.nodes.values())
        if not (may_stop or may_start):
            return False
        started = time.process_time()
        changes = decide(self._snapshot(now), [self._elastic_pool()], now)
        self.autoscaler_cpu_s += time.process_time() - started
        for change in changes:
            for name in change.nodes:
                if change.action == "up":
                    self._power_up(self.nodes[name], now)
                else:
                    self._power_down(self.nodes[name], now)
            key = "scale_ups" if change.action == "up" else "scale_downs"
            self.counts[key] += 1
            self.counts["nodes_started" if change.action == "up" else "nodes_stopped"] += len(change.nodes)
        powered = sum(1 for n in self.nodes.values() if n.power != "down")
        self.powered_range = [min(self.powered_range[0], powered), max(self.powered_range[1], powered)]
        return bool(changes)

    def _elastic_pool(self) -> ElasticPool:
        nodes = tuple(
            ElasticNode(n.info.name, n.info.name, n.power, bool(n.jobs), n.idle_since if n.power == "up" else None)
            for n in self.nodes.values()
        )
        return ElasticPool(
            POOL, replay.CLUSTER, replay.GPU_TYPE, nodes, self.min_nodes, self.max_nodes,
            self.settings.scale_down_delay_s, self.settings.gpus_per_node, self.settings.start_delay_s,
        )  # fmt: skip

    def _snapshot(self, now: float) -> Snapshot:
        """The cluster as the cycle that just ran left it, as the portal shows it: a node that is not up
        has no free devices."""
        nodes = tuple(
            replace(n.info, devices=tuple(
                Device(d.index, d.free - n.used[d.index] if n.power == "up" else Decimal(0)) for d in n.info.devices
            ))
            for n in self.nodes.values()
        )  # fmt: skip
        running = tuple(
            replace(run.workload, started_at=run.started_at, cluster=run.admit.cluster, placement=run.admit.placement)
            for run in (self.runs[key] for _, _, key in self.ends)
            if run.admit is not None
        )  # fmt: skip
        pending = tuple(self.engine.pending.values())
        return Snapshot(self.workspaces, nodes, running, pending, now, self.settings.policy)

    def _power_up(self, node: _Node, now: float) -> None:
        assert node.power == "down"
        node.power, node.powered_at, node.ready_at = "powering_up", now, now + self.settings.start_delay_s

    def _ready(self, node: _Node, now: float) -> None:
        """Started: its devices become free to the engine."""
        self.pool.give(self.pool.nodes[node.info.name], [(p, UNIT) for p in range(len(node.info.devices))])
        node.power, node.idle_since = "up", now

    def _power_down(self, node: _Node, now: float) -> None:
        """Stopped: its devices are taken from the engine (it must be empty), its powered time counted."""
        if node.jobs:
            raise RuntimeError(f"{node.info.name} stopped with {len(node.jobs)} job(s) on it")
        self.pool.take(self.pool.nodes[node.info.name], [(p, UNIT) for p in range(len(node.info.devices))])
        self.spells.append((node.powered_at, now))
        node.power, node.idle_since = "down", None

    def _timed(self, call: Any) -> Any:
        started = time.process_time()
        try:
            return call()
        finally:
            self.engine_cpu_s += time.process_time() - started

    # -- figures -----------------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        done = [run for run in self.runs.values() if run.finished_at is not None]
        end = max((run.finished_at for run in done if run.finished_at is not None), default=self.t0)
        spells = self.spells + [(n.powered_at, end) for n in self.nodes.values() if n.power != "down"]
        node_s = sum(max(0.0, to - since) for since, to in spells)
        # The trace's last submissions are followed by weeks of a few long jobs: over that tail a fixed
        # cluster is all idle, so the saving is also given up to the last submission.
        last = self.jobs[-1].submit_s if self.jobs else self.t0
        submitting_s = sum(max(0.0, min(to, last) - since) for since, to in spells)
        makespan = end - self.t0
        return {
            "jobs": len(self.runs),
            "finished": len(done),
            "jct_s": summary(run.finished_at - run.job.submit_s for run in done if run.finished_at is not None),
            "queueing_s": summary(run.first_start - run.job.submit_s for run in done if run.first_start is not None),
            "makespan_s": round(makespan, 1),
            "node_hours": round(node_s / HOUR_S, 1),
            "mean_nodes_powered": round(node_s / makespan, 2) if makespan > 0 else 0.0,
            "node_hours_until_last_submission": round(submitting_s / HOUR_S, 1),
            "mean_nodes_powered_until_last_submission": round(submitting_s / (last - self.t0), 2)
            if last > self.t0
            else 0.0,
            "nodes": len(self.nodes),
            "min_nodes": self.min_nodes if self.settings.elastic else len(self.nodes),
            "max_nodes": self.max_nodes if self.settings.elastic else len(self.nodes),
            "fewest_nodes_powered": self.powered_range[0],
            "most_nodes_powered": self.powered_range[1],
            **self.counts,
            "engine_cpu_s": round(self.engine_cpu_s, 2),
            "autoscaler_cpu_s": round(self.autoscaler_cpu_s, 2),
        }


def summary(values: Iterable[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"mean": 0.0, "median": 0.0, "p95": 0.0}
    return {
        "mean": round(mean(ordered), 1),
        "median": round(median(ordered), 1),
        "p95": round(replay.percentile(ordered, 0.95), 1),
    }


def compare(jobs: list[replay.Job], quotas: dict[str, int], settings: Settings) -> dict[str, Any]:
    """Both runs, their figures and wall times, the saving and the checks."""
    result: dict[str, Any] = {}
    for name, elastic in (("fixed", False), ("elastic", True)):
        started = time.perf_counter()
        result[name] = ElasticReplay(jobs, quotas, replace(settings, elastic=elastic)).run()
        result[name]["wall_s"] = round(time.perf_counter() - started, 1)
    fixed, elastic = result["fixed"], result["elastic"]
    result["node_hours_saved"] = round(fixed["node_hours"] - elastic["node_hours"], 1)
    result["node_hours_saved_share"] = round(1 - elastic["node_hours"] / fixed["node_hours"], 4)
    key = "node_hours_until_last_submission"
    result["saved_share_until_last_submission"] = round(1 - elastic[key] / fixed[key], 4) if fixed[key] else None
    result["jct_change"] = {
        k: round(elastic["jct_s"][k] / fixed["jct_s"][k] - 1, 4) if fixed["jct_s"][k] else None
        for k in ("mean", "median", "p95")
    }
    result["checks"] = {
        "every job finished": all(r["finished"] == r["jobs"] for r in (fixed, elastic)),
        "no work on a node not up": all(r["on_unready_node"] == 0 for r in (fixed, elastic)),
        "nodes powered within min and max": (
            elastic["min_nodes"] <= elastic["fewest_nodes_powered"] <= elastic["most_nodes_powered"]
            <= elastic["max_nodes"]
        ),
    }  # fmt: skip
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_traces = Path(os.environ.get("PORTAL_TRACES_DIR") or ROOT.parent / "shared" / "traces")
    p.add_argument("--traces", type=Path, default=default_traces, help="folder of philly_vc_{jobs,quota}.csv")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="where elastic.json goes")
    p.add_argument("--skip", type=int, default=0, help="jobs of the file to skip (file order)")
    p.add_argument("--limit", type=int, default=20_000, help="jobs in the slice (0: all)")
    p.add_argument("--seed", type=int, default=1, help="the synthetic trace's seed, when there is no trace file")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--period-s", type=float, default=60.0, help="a cycle while work waits, then the autoscaler")
    p.add_argument("--start-delay-s", type=float, default=180.0, help="a started node is usable after this")
    p.add_argument("--scale-down-delay-s", type=float, default=600.0, help="an empty node is stopped after this")
    p.add_argument("--min-nodes", type=int, default=None, help="nodes always up (default: half, rounded up)")
    p.add_argument("--max-nodes", type=int, default=None, help="most nodes up (default: all)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    jobs, quotas, source = synthetic.trace_slice(args.traces, args.skip, args.limit or None, args.seed)
    settings = Settings(
        gpus_per_node=args.gpus_per_node, period_s=args.period_s, start_delay_s=args.start_delay_s,
        scale_down_delay_s=args.scale_down_delay_s, min_nodes=args.min_nodes, max_nodes=args.max_nodes,
    )  # fmt: skip
    options = vars(args) | {"traces": str(args.traces), "out": str(args.out)}
    result: dict[str, Any] = {"source": source, "options": options}
    result |= compare(jobs, quotas, settings)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "elastic.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{source}: {len(jobs)} jobs")
    fixed, elastic = result["fixed"], result["elastic"]
    for key in [k for k in fixed if k not in ("jct_s", "queueing_s")]:
        print(f"{key:24} {fixed[key]!s:>14} {elastic[key]!s:>14}")
    for key in ("jct_s", "queueing_s"):
        for stat in ("mean", "median", "p95"):
            print(f"{key + ' ' + stat:24} {fixed[key][stat]!s:>14} {elastic[key][stat]!s:>14}")
    print(f"node-hours saved: {result['node_hours_saved']} ({100 * result['node_hours_saved_share']:.1f}%)")
    print(f"share saved until the last submission: {result['saved_share_until_last_submission']}")
    print(f"JCT change: {result['jct_change']}")
    for check, ok in result["checks"].items():
        print(f"{'met' if ok else 'FAILED':6}  {check}")
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
