"""Replay the Philly trace under fifo, shared and portal, on one core, and check portal against its targets.

    .venv/bin/python bench/philly.py [--traces ../shared/traces] [--out bench/out] [replay options...]

Writes OUT/philly_{fifo,shared,portal}.json (the replay's metrics) and OUT/philly.json (all three,
the wall time of each replay, and each target with its verdict). Replay options after the known
ones (e.g. --restart-cost-s 300) go to every run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.scheduling import replay  # noqa: E402
from bench.scale import reference_loop_ms  # noqa: E402


def run(policy: str, traces: Path, out: Path, extra: list[str]) -> tuple[dict[str, Any], float]:
    target = out / f"philly_{policy}.json"
    argv = [
        "--trace", str(traces / "philly_vc_jobs.csv"), "--quotas", str(traces / "philly_vc_quota.csv"),
        "--gpus-per-node", "8", "--policy", policy, "--json", str(target), *extra,
    ]  # fmt: skip
    started = time.perf_counter()
    if replay.main(argv) != 0:
        raise SystemExit(f"the {policy} replay failed")
    return json.loads(target.read_text()), time.perf_counter() - started


def targets(fifo: dict[str, Any], portal: dict[str, Any]) -> list[dict[str, Any]]:
    def check(name: str, value: float, limit: float, ok: bool) -> dict[str, Any]:
        return {"target": name, "value": round(value, 4), "limit": round(limit, 4), "met": ok}

    return [
        check("portal avg_jct_s <= 0.10 x fifo's", portal["avg_jct_s"], 0.10 * fifo["avg_jct_s"],
              portal["avg_jct_s"] <= 0.10 * fifo["avg_jct_s"]),
        check("portal avg_jct_s <= 1.12 x avg_duration_s", portal["avg_jct_s"], 1.12 * portal["avg_duration_s"],
              portal["avg_jct_s"] <= 1.12 * portal["avg_duration_s"]),
        check("portal jain_fairness_across_teams >= 0.95", portal["jain_fairness_across_teams"], 0.95,
              portal["jain_fairness_across_teams"] >= 0.95),
        check("portal gpu_utilization >= fifo's", portal["gpu_utilization"], fifo["gpu_utilization"],
              portal["gpu_utilization"] >= fifo["gpu_utilization"]),
        check("portal quota_violations == 0", portal["quota_violations"], 0, portal["quota_violations"] == 0),
        check("portal partial_gangs == 0", portal["partial_gangs"], 0, portal["partial_gangs"] == 0),
    ]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args, extra = p.parse_known_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    args.out.mkdir(parents=True, exist_ok=True)
    policies = ("fifo", "shared", "portal")
    results, wall, loop = {}, {}, {}
    for policy in policies:  # the machine's speed before and after each replay
        before = reference_loop_ms()
        results[policy], wall[policy] = run(policy, args.traces, args.out, extra)
        loop[policy] = [before, reference_loop_ms()]
    fifo, portal = results["fifo"], results["portal"]
    summary = {
        "options": extra,
        **results,
        "wall_s": {policy: round(seconds, 1) for policy, seconds in wall.items()},
        "reference_loop_ms": loop,
        "targets": targets(fifo, portal),
    }
    (args.out / "philly.json").write_text(json.dumps(summary, indent=2) + "\n")
    keys = [key for key in fifo if key != "per_workspace"]  # that one is in the JSON files
    width = max(len(k) for k in keys)
    print(f"{'':{width}}" + "".join(f"  {policy:>16}" for policy in policies))
    for key in keys:  # an estimate's figures are None without --estimates
        print(f"{key:{width}}" + "".join(f"  {results[policy][key]!s:>16}" for policy in policies))
    print(f"{'wall_s':{width}}" + "".join(f"  {wall[policy]:>16.1f}" for policy in policies))
    # A fixed pure-Python loop's time (bench/scale.py), before and after: figures from other machines
    # or hours compare as admissions per reference loop.
    said = {p: f"{loop[p][0]:.0f} / {loop[p][1]:.0f}" for p in policies}
    print(f"{'reference_loop_ms':{width}}" + "".join(f"  {said[p]:>16}" for p in policies))
    per_loop = {p: results[p]["admissions_per_s"] * sum(loop[p]) / 2000 for p in policies}
    print(f"{'admissions_per_loop':{width}}" + "".join(f"  {per_loop[p]:>16.1f}" for p in policies))
    for target in summary["targets"]:
        print(
            f"{'met' if target['met'] else 'MISSED':6}  {target['target']}: {target['value']} (limit {target['limit']})"
        )
    return 0 if all(t["met"] for t in summary["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
