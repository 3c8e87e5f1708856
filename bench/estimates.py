"""Check estimated starts against what happened: the Philly trace under portal, on one core.

    .venv/bin/python bench/estimates.py [--traces ../shared/traces] [--out bench/out] [replay options...]

Replays the trace with `--estimates` (docs/scheduler.md, "The trace replay"): every job gets the
expected runtime the portal would give it, and each job that waits has its first estimated start
compared with its actual start. Writes OUT/estimates.json (the replay's metrics and its wall
time) and prints the estimate figures. Replay options after the known ones (e.g. --limit 10000)
go to the replay.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.scheduling import replay  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args, extra = p.parse_known_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / "estimates.json"
    argv = [
        "--trace", str(args.traces / "philly_vc_jobs.csv"), "--quotas", str(args.traces / "philly_vc_quota.csv"),
        "--gpus-per-node", "8", "--policy", "portal", "--estimates", "--json", str(target), *extra,
    ]  # fmt: skip
    started = time.perf_counter()
    if replay.main(argv) != 0:
        raise SystemExit("the replay failed")
    wall = time.perf_counter() - started
    metrics = json.loads(target.read_text())
    target.write_text(json.dumps({"options": extra, "metrics": metrics, "wall_s": round(wall, 1)}, indent=2) + "\n")
    waited = metrics["estimated_starts"] + metrics["unknown_starts"]
    print(f"jobs that waited at least one cycle     {waited:>10}")
    print(f"  with an estimate before they started  {metrics['estimated_starts']:>10}")
    print(f"  unknown until they started            {metrics['unknown_starts']:>10}")
    print(f"median |actual start - estimate|, s     {metrics['p50_estimate_error_s']:>10}")
    print(f"90th percentile, s                      {metrics['p90_estimate_error_s']:>10}")
    print(f"CPU estimating, s                       {metrics['estimate_cpu_s']:>10}")
    print(f"CPU scheduling, s                       {metrics['engine_cpu_s']:>10}")
    print(f"wall time, s                            {wall:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
