"""GPU reservations on the Philly trace: what a few large ones cost everyone else, on one core.

    .venv/bin/python bench/reservations.py [--traces ../shared/traces] [--out bench/out] [--skip N]
                                           [--limit N] [--seed N] [--count N] [replay options...]

Replays a slice of the trace (the file's jobs from --skip, --limit of them) under portal three
times: the slice alone; the slice with, for each of --count reservations, one job of its holder
submitted at its start (as many GPUs as it holds, for 90% of its length) but no reservation; and
the same with the reservations (apps/scheduling/replay.py, "--reservations"). The reservations are
drawn with --seed: each of 1/8 to 1/4 of the cluster in whole nodes, for 12 to 72 hours, from the
hour after a job of the slice drawn at random (so mostly in its busy stretches), held by a team with
a quota that submits work inside it.

Reports, for the jobs of the teams that hold no reservation and for all the slice's jobs: mean,
median and 95th-percentile JCT and queueing delay (first start - submit) in each run; for the
holders' jobs, their queueing delay without and with the reservations; per reservation, the
GPU-hours it held against those its holder used on its devices, its holder's start latency (from
its start until the largest of its holder's jobs then waiting started), how many of its GPUs its
holder's ordinary work still held at its start (the engine does not evict a holder's own work for
its reservation) and the jobs evicted for it. Checks, exit status 1 if one fails: every start
latency within one scheduling period + grace_s; no other team's job on a reservation's devices
within it (the replay's own books); no quota violation, no partial gang.

Writes OUT/reservations.json. The traces' folder is --traces, else the environment variable
PORTAL_TRACES_DIR, else ../shared/traces beside the checkout; without philly_vc_jobs.csv there, a
synthetic trace in its shape (bench/synthetic.py, --seed, --limit jobs or 6,000) stands in. Replay
options after the known ones (e.g. --interval-s 10) go to every run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from statistics import mean, median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.scheduling import replay  # noqa: E402
from apps.scheduling.replay import Job, Options, Replay, ReservationRequest  # noqa: E402
from bench import synthetic  # noqa: E402

HOUR_S = 3600.0
HOLDER_USE = 0.9  # the holder's job runs for this share of its reservation


def choose(
    jobs: list[Job], quotas: dict[str, int], count: int, seed: int, gpus_per_node: int
) -> list[tuple[ReservationRequest, Job]]:
    """`count` reservations and their holders' jobs, the same for the same seed (see the docstring)."""
    rng = random.Random(seed)
    nodes = sum(quotas.values()) // gpus_per_node
    fewest, most = max(1, math.ceil(nodes / 8)), max(1, nodes // 4)
    anchors = jobs[: max(1, int(0.8 * len(jobs)))]
    chosen = []
    for number in range(count):
        gpus = gpus_per_node * rng.randint(fewest, max(fewest, most))
        duration = HOUR_S * rng.randint(12, 72)
        start = HOUR_S * math.ceil(rng.choice(anchors).submit_s / HOUR_S)
        inside = sorted({j.team for j in jobs if start <= j.submit_s < start + duration and quotas.get(j.team)})
        holder = rng.choice(inside or sorted(team for team, gpus in quotas.items() if gpus))
        request = ReservationRequest(holder, gpus, start, duration, number)
        work = Job(f"reserved-{number + 1}", start, HOLDER_USE * duration, Decimal(gpus), holder, len(jobs) + number)
        chosen.append((request, work))
    return chosen


def summary(values: Iterable[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"mean": 0.0, "median": 0.0, "p95": 0.0}
    return {
        "mean": round(mean(ordered), 1),
        "median": round(median(ordered), 1),
        "p95": round(replay.percentile(ordered, 0.95), 1),
    }


def group(run: Replay, job_ids: Iterable[str]) -> dict[str, Any]:
    """JCT and queueing delay (first start - submit) of the jobs that finished."""
    done = [run.progress[j] for j in job_ids if run.progress[j].finished_at is not None]
    return {
        "jobs": len(done),
        "jct_s": summary(p.finished_at - p.job.submit_s for p in done if p.finished_at is not None),
        "queueing_s": summary(run.first_start[p.job.job_id] - p.job.submit_s for p in done),
    }


def measure(jobs: list[Job], quotas: dict[str, int], options: Options) -> tuple[Replay, dict[str, Any], float]:
    run = Replay(sorted(jobs, key=lambda j: (j.submit_s, j.seq)), quotas, options)
    started = time.perf_counter()
    metrics = run.run()
    return run, metrics, time.perf_counter() - started


def checks(report: list[dict[str, Any]], metrics: dict[str, Any], options: Options) -> list[dict[str, Any]]:
    bound = options.interval_s + options.policy.grace_s
    found = []
    for held in report:
        latency = held["start_latency_s"]
        found.append({
            "check": f"{held['key']}: holder's start latency <= {bound:g} s",
            "value": latency, "met": latency is not None and latency <= bound,
        })  # fmt: skip
        found.append({"check": f"{held['key']}: no other team's job on it", "value": len(held["overlaps"]),
                      "met": not held["overlaps"]})  # fmt: skip
    for key in ("quota_violations", "partial_gangs"):
        found.append({"check": f"{key} == 0", "value": metrics[key], "met": metrics[key] == 0})
    return found


def run_all(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """The three replays and what they say (see the module's docstring)."""
    parsed = replay.parser().parse_args(["--trace", "-", "--quotas", "-", "--json", "-", "--policy", "portal", *extra])
    options = replay.options_from(parsed)
    jobs, quotas, source = synthetic.trace_slice(args.traces, args.skip, args.limit, args.seed)
    chosen = choose(jobs, quotas, args.count, args.seed, options.gpus_per_node)
    requests = tuple(request for request, _ in chosen)
    holders = {request.workspace for request in requests}
    added = [work for _, work in chosen]
    runs = {
        "trace alone": measure(jobs, quotas, options),
        "without reservations": measure(jobs + added, quotas, options),
        "with reservations": measure(jobs + added, quotas, replace(options, reservations=requests)),
    }
    others = [j.job_id for j in jobs if j.team not in holders]
    result: dict[str, Any] = {
        "source": source, "jobs": len(jobs), "cluster_gpus": sum(quotas.values()), "holders": sorted(holders),
        "options": {"skip": args.skip, "limit": args.limit, "seed": args.seed, "count": args.count, "replay": extra},
        "runs": {},
    }  # fmt: skip
    for name, (run, metrics, wall) in runs.items():
        result["runs"][name] = {
            "other_teams": group(run, others),
            "all_trace_jobs": group(run, (j.job_id for j in jobs)),
            "holders_jobs": group(run, (w.job_id for w in added)) if name != "trace alone" else None,
            **{key: metrics[key] for key in ("preemptions", "quota_violations", "partial_gangs", "gpu_utilization")},
            "engine_cpu_s": metrics["engine_cpu_s"],
            "wall_s": round(wall, 1),
        }
    _, metrics, _ = runs["with reservations"]
    result["reservations"] = metrics["reservations"]
    result["checks"] = checks(metrics["reservations"], metrics, options)
    return result


def show(result: dict[str, Any]) -> None:
    print(f"{result['source']}: {result['jobs']} jobs, {result['cluster_gpus']} GPUs")
    names = list(result["runs"])
    print(f"{'':42}" + "".join(f"{name:>22}" for name in names))
    for who in ("other_teams", "all_trace_jobs", "holders_jobs"):
        for what in ("jct_s", "queueing_s"):
            for stat in ("mean", "median", "p95"):
                cells = [result["runs"][n][who] for n in names]
                text = [f"{cell[what][stat]:>22,.0f}" if cell else f"{'':>22}" for cell in cells]
                print(f"{who + ' ' + what + ' ' + stat:42}" + "".join(text))
    for key in ("preemptions", "engine_cpu_s", "wall_s"):
        print(f"{key:42}" + "".join(f"{result['runs'][n][key]:>22}" for n in names))
    for held in result["reservations"]:
        print(
            f"{held['key']}: {held['workspace']}, {held['gpus']} GPUs on {held['nodes']} nodes, "
            f"{held['start_s']:.0f}-{held['end_s']:.0f} s; latency {held['start_latency_s']} s; "
            f"{held['used_gpu_h']:,.1f} of {held['reserved_gpu_h']:,.1f} GPU-h used by its holder; "
            f"{held['evicted']} evicted; {len(held['overlaps'])} overlaps; "
            f"{held['holder_ordinary_gpus_at_start']} of its GPUs held by its holder's ordinary work at its start"
        )
    for check in result["checks"]:
        print(f"{'met' if check['met'] else 'MISSED':6}  {check['check']}: {check['value']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    traces = os.environ.get("PORTAL_TRACES_DIR") or ROOT.parent / "shared" / "traces"
    p.add_argument("--traces", type=Path, default=Path(traces))
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    p.add_argument("--skip", type=int, default=0, help="leave out the trace file's first N jobs (default 0)")
    p.add_argument("--limit", type=int, default=10_000, help="then keep N jobs; 0: all (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="draws the reservations (default %(default)s)")
    p.add_argument("--count", type=int, default=3, help="how many reservations (default %(default)s)")
    args, extra = p.parse_known_args()
    if args.skip < 0 or args.limit < 0 or args.count < 1:
        p.error("--skip and --limit must be at least 0, --count at least 1")
    args.limit = args.limit or None
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    try:
        result = run_all(args, extra)
    except replay.TraceError as error:
        print(f"reservations: error: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reservations.json").write_text(json.dumps(result, indent=2) + "\n")
    show(result)
    return 0 if all(check["met"] for check in result["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
