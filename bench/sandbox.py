"""What the sandbox costs a workload's start: local jobs and notebooks, with and without bubblewrap.

    .venv/bin/python bench/sandbox.py [--runs 20] [--notebook-runs 5] [--env-dir DIR] [--json bench/out/sandbox.json]

A job is timed from ``start()`` to the moment its command has run its first line inside the
sandbox (a file it writes appears), not only to the spawn; a notebook from ``start()`` to its
Jupyter server answering HTTP (the environment built beforehand, as a profile's is after its
first use). Where the portal runs as root, sandboxed workloads run as a workspace account
(``nobody`` here), as the portal runs them.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.backends.base import JobSpec, NotebookSpec, RunAs  # noqa: E402
from workers.backends.local import LocalBackend  # noqa: E402
from workers.backends.pyenv import ensure_env  # noqa: E402


def _run_as() -> RunAs | None:
    if os.geteuid() != 0:
        return None
    nobody = pwd.getpwnam("nobody")
    return RunAs("nobody", nobody.pw_uid, nobody.pw_gid)


def _time_jobs(sandbox: str, runs: int, work_dir: Path) -> list[float]:
    seconds = []
    for n in range(runs):
        backend = LocalBackend(sandbox=sandbox, run_dir=str(work_dir / "run"))
        marker = work_dir / "ws" / f"job-{sandbox}-{n}" / "started"
        spec = JobSpec(key=f"job-{sandbox}-{n}", workspace="ws", name="bench", command="touch started; sleep 30",
                       work_dir=str(work_dir / "ws"), devices=[["0"]], run_as=_run_as())  # fmt: skip
        began = time.perf_counter()
        backend.start(spec)
        while not marker.exists():
            time.sleep(0.001)
        seconds.append(time.perf_counter() - began)
        backend.stop(grace_s=1.0)
    return seconds


def _time_notebooks(sandbox: str, runs: int, work_dir: Path, env_dir: Path) -> list[float]:
    seconds = []
    for n in range(runs):
        backend = LocalBackend(sandbox=sandbox, run_dir=str(work_dir / "run"), env_root=str(env_dir))
        spec = NotebookSpec(key=f"nb-{sandbox}-{n}", workspace="ws", name="bench", work_dir=str(work_dir / "ws"),
                            base_url="/", token="bench-token", run_as=_run_as())  # fmt: skip
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
    parser.add_argument("--notebook-runs", type=int, default=5)
    parser.add_argument("--env-dir", type=Path, default=Path.home() / ".cache" / "gpuportal" / "test-envs")
    parser.add_argument("--json", type=Path, default=Path("bench/out/sandbox.json"))
    args = parser.parse_args()
    ensure_env([], args.env_dir)  # built once, outside the timings
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work_dir = Path(tmp)
        for sandbox in ("off", "bwrap"):
            results[f"job_{sandbox}"] = _summary(_time_jobs(sandbox, args.runs, work_dir))
            if args.notebook_runs:
                notebooks = _time_notebooks(sandbox, args.notebook_runs, work_dir, args.env_dir)
                results[f"notebook_{sandbox}"] = _summary(notebooks)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
