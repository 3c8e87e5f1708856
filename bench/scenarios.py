"""The adversarial scenarios of the scheduler's guarantees under every policy, on one core.

    .venv/bin/python bench/scenarios.py [--json bench/out/scenarios.json] [--interval-s 2] [--stream-jobs 6000]

For each scenario (apps/scheduling/scenarios.py) and policy: the promised bound on the protected
workloads' wait, their worst and mean wait, whether the bound held, the victims, the mean JCT of
all jobs and the engine's CPU time. Exits 1 if a bound does not hold under the portal policy.
Then the engine's CPU time under portal on a borrower's stream of `--stream-jobs` jobs of mixed
shares of a device (0.25, 0.5 and 0.75 GPU in turn) and on the same stream of quarters only
(`fraction_stream`), beside a reference loop's time (the machine's speed); 0 skips them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.scheduling.scenarios import POLICIES, SCENARIOS, fraction_stream, run  # noqa: E402
from bench.scale import reference_loop_ms  # noqa: E402


def hours(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 3600:.2f} h"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "out" / "scenarios.json")
    p.add_argument("--interval-s", type=float, default=2.0, help="the scheduling period (default %(default)s)")
    p.add_argument("--stream-jobs", type=int, default=6000, help="jobs in each fraction stream (default %(default)s)")
    args = p.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    results = [run(make(), policy, args.interval_s) for make in SCENARIOS for policy in POLICIES]
    streams = []  # the same figures, and the reference loop's time before and after each
    for sizes in (("0.25", "0.5", "0.75"), ("0.25",)) if args.stream_jobs else ():
        before = reference_loop_ms()
        streams.append(run(fraction_stream(sizes, args.stream_jobs), "portal", args.interval_s))
        streams[-1]["reference_loop_ms"] = [before, reference_loop_ms()]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results + streams, indent=2) + "\n")
    print(
        f"{'scenario':32} {'policy':7} {'bound':>9} {'worst':>9} {'mean':>9} {'held':>5} {'victims':>7} {'avg JCT':>9}"
    )
    for r in results:
        print(
            f"{r['scenario']:32} {r['policy']:7} {hours(r['bound_s']):>9} {hours(r['protected_max_wait_s']):>9} "
            f"{hours(r['protected_mean_wait_s']):>9} {'yes' if r['within_bound'] else 'NO':>5} {r['victims']:>7} "
            f"{hours(r['avg_jct_s']):>9}"
        )
    for r in streams:
        print(
            f"{r['scenario']}: engine {r['engine_cpu_s']:.2f} CPU s for {args.stream_jobs} jobs (avg JCT "
            f"{hours(r['avg_jct_s'])}, the owner's wait {hours(r['protected_max_wait_s'])}); reference loop "
            f"{' and '.join(f'{ms:.0f}' for ms in r['reference_loop_ms'])} ms before and after"
        )
    return 0 if all(r["within_bound"] for r in results if r["policy"] == "portal") else 1


if __name__ == "__main__":
    sys.exit(main())
