"""The adversarial scenarios of the scheduler's guarantees under every policy, on one core.

    .venv/bin/python bench/scenarios.py [--json bench/out/scenarios.json] [--interval-s 2]

For each scenario (apps/scheduling/scenarios.py) and policy: the promised bound on the protected
workloads' wait, their worst and mean wait, whether the bound held, the victims, the mean JCT of
all jobs and the engine's CPU time. Exits 1 if a bound does not hold under the portal policy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.scheduling.scenarios import POLICIES, SCENARIOS, run  # noqa: E402


def hours(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 3600:.2f} h"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "out" / "scenarios.json")
    p.add_argument("--interval-s", type=float, default=2.0, help="the scheduling period (default %(default)s)")
    args = p.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    results = [run(make(), policy, args.interval_s) for make in SCENARIOS for policy in POLICIES]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"{'scenario':32} {'policy':7} {'bound':>9} {'worst':>9} {'mean':>9} {'held':>5} {'victims':>7} {'avg JCT':>9}"
    )
    for r in results:
        print(
            f"{r['scenario']:32} {r['policy']:7} {hours(r['bound_s']):>9} {hours(r['protected_max_wait_s']):>9} "
            f"{hours(r['protected_mean_wait_s']):>9} {'yes' if r['within_bound'] else 'NO':>5} {r['victims']:>7} "
            f"{hours(r['avg_jct_s']):>9}"
        )
    return 0 if all(r["within_bound"] for r in results if r["policy"] == "portal") else 1


if __name__ == "__main__":
    sys.exit(main())
