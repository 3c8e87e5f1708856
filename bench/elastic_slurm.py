"""An elastic pool on the development Slurm, timed: from a pending gang to the nodes powered up for
it (Slurm's own power saving: its resume program starts their slurmd), to the gang running there,
and, once they are empty, to their power-down.

    DATABASE_URL=postgres://... .venv/bin/python bench/elastic_slurm.py [--runs 3] [--json bench/out/elastic_slurm.json]

The steps are the portal's own: the job submitted through the API (its cycle leaves it pending: the
partition's nodes are off), the autoscaler's upkeep (as the scheduler's loop turns it, here as fast
as it can: every 0.2 s), the cycle that admits the gang once the nodes are ready, Slurm starting it.
Needs deploy/slurm.sh's cluster (partition elastic: node5 and node6) and root.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="gangs, one after another")
    parser.add_argument("--json", default=str(ROOT / "bench" / "out" / "elastic_slurm.json"))
    args = parser.parse_args()
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    os.environ.update({"BENCH_ELASTIC_OUT": str(out), "BENCH_RUNS": str(args.runs)})
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    import pytest

    status = pytest.main(["bench/elastic_slurm_cases.py", "-q", "-s", "-p", "no:cacheprovider", "-o",
                          "log_level=WARNING"])  # fmt: skip
    if not out.exists():
        return int(status) or 1
    runs = json.loads(out.read_text())["runs"]
    print(f"\n{len(runs)} gangs of 2 x 4 GPUs on partition elastic (2 nodes, powered down at first):")
    for key, label in (("decision_s", "submitted -> nodes asked for"), ("nodes_ready_s", "-> both nodes ready"),
                       ("job_running_s", "-> gang running on Slurm"), ("job_done_s", "-> gang done (sleep 2)"),
                       ("power_down_s", "empty -> both powered down")):  # fmt: skip
        values = [r[key] for r in runs]
        print(f"  {label:32} median {statistics.median(values):6.2f} s  (min {min(values):.2f}, max {max(values):.2f})")
    print(f"\n{out}")
    return int(status)


if __name__ == "__main__":
    raise SystemExit(main())
