"""Check estimated starts against what happened: the Philly trace under portal, on one core.

    .venv/bin/python bench/estimates.py [--traces ../shared/traces] [--out bench/out]
                                        [--skip N] [--limit N] [--teams a,b,...] [replay options...]

Replays the trace with `--estimates` (docs/scheduler.md, "The trace replay"): every job gets the
expected runtime the portal would give it, and each job that waits has its first estimated start
compared with its actual start. Writes OUT/estimates.json (the replay's metrics, the share of jobs
that started before their estimate, the CPU time per estimating cycle, the wall time) and prints
the estimate figures. `--skip N` leaves out the trace file's first N jobs and `--limit N` keeps the
next N (a slice); `--teams` keeps only those teams' jobs and quotas (a smaller cluster). Other
replay options after the known ones (e.g. --min-runtime-s 600) go to the replay. The traces' folder
is `--traces`, else the environment variable PORTAL_TRACES_DIR, else ../shared/traces beside the
checkout; `bench/synthetic.py FOLDER` writes a synthetic trace in the same shape there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.scheduling import replay  # noqa: E402


def measure(
    traces: Path, extra: list[str], *, skip: int = 0, limit: int | None = None, teams: set[str] | None = None
) -> dict[str, Any]:
    """Replay the slice with estimates; the replay's metrics and the estimates' figures."""
    argv = [
        "--trace", str(traces / "philly_vc_jobs.csv"), "--quotas", str(traces / "philly_vc_quota.csv"),
        "--gpus-per-node", "8", "--policy", "portal", "--estimates", "--json", "-", *extra,
    ]  # fmt: skip
    args = replay.parser().parse_args(argv)
    options = replay.options_from(args)
    jobs = sorted(replay.read_trace(args.trace), key=lambda j: j.seq)
    quotas = replay.read_quotas(args.quotas)
    if teams:
        jobs = [j for j in jobs if j.team in teams]
        quotas = {team: gpus for team, gpus in quotas.items() if team in teams}
    jobs = jobs[skip : None if limit is None else skip + limit]
    jobs.sort(key=lambda j: (j.submit_s, j.seq))
    run = replay.Replay(jobs, quotas, replace(options, cohorts=replay.read_cohorts(args.quotas)))
    pending: list[int] = []
    cpu: list[float] = []
    record = run._record_estimates

    def timed(now: float) -> None:
        pending.append(len(run.engine.pending))
        started = time.process_time()
        record(now)
        cpu.append(time.process_time() - started)

    run._record_estimates = timed  # type: ignore[method-assign]
    started = time.perf_counter()
    metrics = run.run()
    wall = time.perf_counter() - started
    errors = [run.first_start[j] - estimate for j, estimate in run.estimated.items() if j in run.first_start]
    typical = statistics.median(pending) if pending else 0
    near = [c for n, c in zip(pending, cpu, strict=True) if typical / 2 <= n <= typical * 2] or cpu
    return {
        "jobs": len(jobs),
        "metrics": metrics,
        "started_before_estimate": sum(e < 0 for e in errors) / len(errors) if errors else None,
        "started_after_estimate": sum(e > 0 for e in errors) / len(errors) if errors else None,
        "estimating_cycles": len(cpu),
        "pending_p50": typical,
        "pending_p90": sorted(pending)[int(0.9 * len(pending))] if pending else 0,
        "cpu_ms_per_cycle_p50": round(1000 * statistics.median(cpu), 3) if cpu else None,
        "cpu_ms_per_cycle_at_typical_pending": round(1000 * statistics.mean(near), 3) if near else None,
        "cpu_ms_per_cycle_max": round(1000 * max(cpu), 3) if cpu else None,
        "wall_s": round(wall, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    traces = os.environ.get("PORTAL_TRACES_DIR") or ROOT.parent / "shared" / "traces"
    p.add_argument("--traces", type=Path, default=Path(traces))
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    p.add_argument("--skip", type=int, default=0, help="leave out the trace file's first N jobs")
    p.add_argument("--limit", type=int, default=None, help="then keep only N jobs")
    p.add_argument("--teams", default="", help="comma-separated teams to keep (jobs and quotas)")
    args, extra = p.parse_known_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    args.out.mkdir(parents=True, exist_ok=True)
    teams = {t for t in args.teams.split(",") if t} or None
    result = measure(args.traces, extra, skip=args.skip, limit=args.limit, teams=teams)
    options = {"skip": args.skip, "limit": args.limit, "teams": sorted(teams or ()), "replay": extra}
    target = args.out / "estimates.json"
    target.write_text(json.dumps({"options": options, **result}, indent=2) + "\n")
    metrics = result["metrics"]
    waited = metrics["estimated_starts"] + metrics["unknown_starts"]
    print(f"jobs replayed                           {result['jobs']:>10}")
    print(f"jobs that waited at least one cycle     {waited:>10}")
    print(f"  with an estimate before they started  {metrics['estimated_starts']:>10}")
    print(f"  unknown until they started            {metrics['unknown_starts']:>10}")
    print(f"median |actual start - estimate|, s     {metrics['p50_estimate_error_s']:>10}")
    print(f"90th percentile, s                      {metrics['p90_estimate_error_s']:>10}")
    before = result["started_before_estimate"]
    print(f"started before the estimate             {before if before is None else f'{before:.1%}':>10}")
    print(f"pending when estimating, median / p90   {result['pending_p50']:>6} / {result['pending_p90']}")
    print(f"CPU per estimating cycle, ms: median    {result['cpu_ms_per_cycle_p50']:>10}")
    print(f"  at the typical pending count (mean)   {result['cpu_ms_per_cycle_at_typical_pending']:>10}")
    print(f"CPU estimating, s                       {metrics['estimate_cpu_s']:>10}")
    print(f"CPU scheduling, s                       {metrics['engine_cpu_s']:>10}")
    print(f"wall time, s                            {result['wall_s']:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
