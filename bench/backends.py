"""How long a backend takes from start() to a running job: the local backend and the real Slurm.

    .venv/bin/python bench/backends.py [--runs 20] [--slurm-runs 10] [--json bench/out/backends.json]

Measures `start()` alone (it returns once the job's processes run), not the task queue before it.
The Slurm part needs the cluster of deploy/slurm.sh running.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.backends.base import Backend, JobSpec  # noqa: E402
from workers.backends.local import LocalBackend  # noqa: E402
from workers.backends.slurm import SlurmBackend  # noqa: E402


def _time_starts(make: type[Backend], runs: int, work_dir: str, devices: list[list[str]]) -> list[float]:
    seconds = []
    for n in range(runs):
        backend = make()
        spec = JobSpec(key=f"bench-{make.__name__}-{n}", workspace="bench", name="bench", command="sleep 30",
                       work_dir=work_dir, replicas=len(devices), devices=devices)  # fmt: skip
        began = time.perf_counter()
        backend.start(spec)
        seconds.append(time.perf_counter() - began)
        backend.stop(grace_s=1.0)
    return seconds


def _summary(seconds: list[float]) -> dict[str, float]:
    return {"runs": len(seconds), "median_s": round(statistics.median(seconds), 3), "max_s": round(max(seconds), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--slurm-runs", type=int, default=10)
    parser.add_argument("--json", type=Path, default=Path("bench/out/backends.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work_dir:
        results = {
            "local_1_gpu": _summary(_time_starts(LocalBackend, args.runs, work_dir, [["0"]])),
            "local_gang_2x4": _summary(_time_starts(LocalBackend, args.runs, work_dir, [["0", "1", "2", "3"]] * 2)),
        }
        if args.slurm_runs:
            results["slurm_1_gpu"] = _summary(_time_starts(SlurmBackend, args.slurm_runs, work_dir, [["0"]]))
            gang = [["0", "1", "2", "3"]] * 2
            results["slurm_gang_2x4"] = _summary(_time_starts(SlurmBackend, args.slurm_runs, work_dir, gang))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
