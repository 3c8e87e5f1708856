"""How long a Ray cluster of a head and two workers takes from the request to every node joined,
on the local backend and on the development Slurm.

    .venv/bin/python bench/ray_ready.py [--runs 3] [--slurm-runs 3] [--json bench/out/ray_ready.json]

Measures the backend's `start_ray_cluster()` (it returns once every node joined and the dashboard
answers), then stops the cluster. The Slurm part needs deploy/slurm.sh's cluster, and builds the
Ray environment for the nodes first (once; not timed).
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.backends.base import Backend, NodeGroup, RayClusterSpec  # noqa: E402
from workers.backends.local import LocalBackend  # noqa: E402
from workers.backends.pyenv import ensure_ray_env  # noqa: E402
from workers.backends.slurm import SlurmBackend  # noqa: E402

ENV_DIR = Path("/var/cache/gpuportal/test-envs")
NODE_PYTHON = "/usr/bin/python3"


def _spec(work: Path, key: str, devices: bool) -> RayClusterSpec:
    return RayClusterSpec(
        key=key,
        workspace="bench",
        name=key,
        work_dir=str(work / "bench"),
        auth_token=secrets.token_urlsafe(24),
        head=NodeGroup("head", cpu_cores=1, memory_gb=1),
        workers=NodeGroup(
            "worker", replicas=2, gpu_type="h100", gpus=1, cpu_cores=1, memory_gb=1,
            devices=[["0"], ["1"]] if devices else [],
        ),
    )  # fmt: skip


def _time(make: type[Backend], runs: int, work: Path, **options: object) -> list[float]:
    seconds = []
    for n in range(runs):
        backend = make(owner=str(work), **options)  # type: ignore[call-arg]
        spec = _spec(work, f"bench-ray-{make.__name__.lower()}-{n}", devices=make is LocalBackend)
        began = time.perf_counter()
        backend.start(spec)
        seconds.append(time.perf_counter() - began)
        backend.stop(grace_s=5.0)
    return seconds


def _summary(seconds: list[float]) -> dict[str, float]:
    return {"runs": len(seconds), "median_s": round(statistics.median(seconds), 1), "max_s": round(max(seconds), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--slurm-runs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("bench/out/ray_ready.json"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpr-bench-", dir="/tmp"))  # short: Unix socket paths
    root.chmod(0o711)
    work = root / "work"
    work.mkdir(mode=0o711)
    results = {}
    try:
        if args.runs:
            local = _time(LocalBackend, args.runs, work, run_dir=str(root / "run"))
            results["local_head_and_2_workers"] = _summary(local)
        if args.slurm_runs:
            ensure_ray_env(ENV_DIR, NODE_PYTHON)
            slurm = _time(SlurmBackend, args.slurm_runs, work, env_root=str(ENV_DIR), python=NODE_PYTHON)
            results["slurm_head_and_2_workers"] = _summary(slurm)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
