"""How fast workloads run through the whole embedded portal, as a user sees it over the API.

    .venv/bin/python bench/embedded.py [--runs 10] [--no-slurm] [--json bench/out/embedded.json]

Starts `deploy/run.sh` (Daphne behind the notebook proxy, two Celery workers on the filesystem
broker, the scheduler loop) in a temporary data directory, signs in as the admin, then, one
after another with free capacity:

- jobs (1 GPU, local): from `admitted_at` to `started_at`, and from the POST to the first answer
  that shows the job running;
- instances (CPU only, local): from the POST, and from `admitted_at`, to RUNNING;
- notebooks on a running local instance, the profile's environment already built (one warm-up
  notebook builds it first): from the POST to READY, and to the first page through the proxy;
- while a notebook's environment is being built (a package set no run built before) on the
  provisioning worker: jobs again, admission to running, then a notebook of the profile built
  above, from the POST to READY;
- with Slurm (deploy/slurm.sh) registered as a cluster: 1-GPU jobs, admission to running.

The API is polled every 20 ms. Notebook environments are kept in PORTAL_NOTEBOOK_ENV_DIR
(default ~/.cache/gpuportal/bench-envs) between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.02


class Portal:
    def __init__(self, data_dir: Path, env_dir: Path, work_dir: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"}}
        self.env.update(PORTAL_DATA_DIR=str(data_dir), PORTAL_PORT=str(self.port), PORTAL_NOTEBOOK_ENV_DIR=str(env_dir))
        # Slurm runs a workspace's jobs as its account: the work directory must be reachable by it,
        # so it lives outside the (private) data directory, as on a cluster's shared storage.
        work_dir.chmod(0o711)
        self.env["PORTAL_WORK_DIR"] = str(work_dir)
        self.process = subprocess.Popen(
            ["bash", "deploy/run.sh"],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if "GPU Portal is running at" in line:
                self.ready.set()

    def start(self) -> requests.Session:
        if not self.ready.wait(300):
            raise SystemExit("the embedded portal did not start:\n" + "".join(self.output))
        password = re.search(r"Login: admin / (\S+)", "".join(self.output))
        assert password, "".join(self.output)
        session = requests.Session()
        token = session.post(
            f"{self.url}/api/v1/auth/token/", json={"username": "admin", "password": password.group(1)}
        )
        session.headers["Authorization"] = f"Token {token.json()['token']}"
        return session

    def manage(self, *args: str) -> None:
        subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, check=True, capture_output=True)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=120)


def _reader(api: requests.Session, url: str, kind: str, pk: int) -> Callable[[], dict[str, Any]]:
    return lambda: dict(api.get(f"{url}/api/v1/{kind}/{pk}/").json())


def _until(read: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool], timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = read()
        if done(row):
            return row
        time.sleep(POLL_S)
    raise SystemExit(f"timed out: last seen {row}")


def _gap(row: dict[str, Any], start: str, end: str) -> float:
    return (datetime.fromisoformat(row[end]) - datetime.fromisoformat(row[start])).total_seconds()


def _summary(seconds: list[float]) -> dict[str, float]:
    return {"runs": len(seconds), "median_s": round(statistics.median(seconds), 3), "max_s": round(max(seconds), 3)}


def _jobs(api: requests.Session, url: str, runs: int, **extra: Any) -> dict[str, list[float]]:
    admitted, submitted = [], []
    for n in range(runs):
        body = {"workspace": "admin", "name": f"bench-{n}", "command": "sleep 2", "gpu_type": "h100",
                "gpus_per_replica": "1", "cpu_cores": 1, "memory_gb": 1, **extra}  # fmt: skip
        began = time.perf_counter()
        job = api.post(f"{url}/api/v1/jobs/", json=body)
        job.raise_for_status()
        read = _reader(api, url, "jobs", job.json()["id"])
        row = _until(read, lambda r: r["state"] in ("RUNNING", "SUCCEEDED", "FAILED"))
        submitted.append(time.perf_counter() - began)
        if row["state"] == "FAILED":
            raise SystemExit(f"job failed: {row['failure_reason']}")
        admitted.append(_gap(row, "admitted_at", "started_at"))
        api.post(f"{url}/api/v1/jobs/{row['id']}/cancel/").raise_for_status()
        _until(read, lambda r: r["state"] == "CANCELLED")
    return {"admission_to_running": admitted, "submit_to_running": submitted}


def _instances(api: requests.Session, url: str, runs: int) -> dict[str, list[float]]:
    admitted, requested = [], []
    for n in range(runs):
        began = time.perf_counter()
        created = api.post(
            f"{url}/api/v1/instances/", json={"workspace": "admin", "name": f"box-{n}", "profile": "cpu-small"}
        )
        created.raise_for_status()
        read = _reader(api, url, "instances", created.json()["id"])
        row = _until(read, lambda r: r["state"] in ("RUNNING", "FAILED"))
        requested.append(time.perf_counter() - began)
        if row["state"] == "FAILED":
            raise SystemExit(f"instance failed: {row['failure_reason']}")
        admitted.append(_gap(row, "admitted_at", "started_at"))
        api.delete(f"{url}/api/v1/instances/{row['id']}/").raise_for_status()
        _until(read, lambda r: r["state"] == "DELETED")
    return {"request_to_running": requested, "admission_to_running": admitted}


def _notebooks(api: requests.Session, url: str, runs: int) -> dict[str, list[float]]:
    profile = {"name": "bench-kernel", "image": "quay.io/jupyter/base-notebook", "published": True}
    api.post(f"{url}/api/v1/notebook-profiles/", json=profile)
    box = api.post(f"{url}/api/v1/instances/", json={"workspace": "admin", "name": "nb-box", "profile": "cpu-small"})
    box.raise_for_status()
    _until(lambda: api.get(f"{url}/api/v1/instances/{box.json()['id']}/").json(), lambda r: r["state"] == "RUNNING")
    ready, answering = [], []
    for n in range(runs + 1):  # the first builds the environment: not counted
        body = {"workspace": "admin", "name": f"lab-{n}", "instance": box.json()["id"], "profile": "bench-kernel"}
        began = time.perf_counter()
        created = api.post(f"{url}/api/v1/notebooks/", json=body)
        created.raise_for_status()
        read = _reader(api, url, "notebooks", created.json()["id"])
        row = _until(read, lambda r: r["state"] in ("READY", "FAILED"), timeout_s=600)
        if row["state"] == "FAILED":
            raise SystemExit(f"notebook failed: {row['failure_reason']}")
        became_ready = time.perf_counter() - began
        # The notebook's own host (<name>-<id>.localhost, which this client does not resolve: it
        # connects to the proxy by address and names the host), with the server's token.
        host, path = urlsplit(row["url"]).netloc, urlsplit(row["url"]).path
        nb = {"Host": host, "Authorization": f"token {row['access_token']}"}
        while requests.get(f"{url}{path}api/status", headers=nb, allow_redirects=False).status_code != 200:
            time.sleep(POLL_S)
        if n:
            ready.append(became_ready)
            answering.append(time.perf_counter() - began)
        api.delete(f"{url}/api/v1/notebooks/{row['id']}/").raise_for_status()
        _until(read, lambda r: r["state"] == "STOPPED")
    api.delete(f"{url}/api/v1/instances/{box.json()['id']}/")
    return {"request_to_ready": ready, "request_to_first_page": answering}


def _jobs_while_building(api: requests.Session, url: str, runs: int) -> dict[str, list[float]]:
    """While a notebook's environment builds (a package set never built before: a version floor
    no other run used): jobs, from admission to running; then a notebook whose environment is
    built (`_notebooks` built it), from the POST to READY."""
    nonce = int(time.time()) % 100000
    profile = {"name": f"bench-build-{nonce}", "image": "quay.io/jupyter/base-notebook", "published": True,
               "python_packages": ["jupyterlab", f"tqdm>=4.0.{nonce}"]}  # fmt: skip
    api.post(f"{url}/api/v1/notebook-profiles/", json=profile).raise_for_status()
    box = api.post(f"{url}/api/v1/instances/", json={"workspace": "admin", "name": "build-box", "profile": "cpu-small"})
    box.raise_for_status()
    _until(lambda: api.get(f"{url}/api/v1/instances/{box.json()['id']}/").json(), lambda r: r["state"] == "RUNNING")
    body = {"workspace": "admin", "name": "building", "instance": box.json()["id"], "profile": profile["name"]}
    began = time.perf_counter()
    notebook = api.post(f"{url}/api/v1/notebooks/", json=body)
    notebook.raise_for_status()
    read = _reader(api, url, "notebooks", notebook.json()["id"])
    _until(read, lambda r: r["state"] == "STARTING")
    jobs = _jobs(api, url, runs)
    other = {"workspace": "admin", "name": "built", "instance": box.json()["id"], "profile": "bench-kernel"}
    asked = time.perf_counter()
    other_id = api.post(f"{url}/api/v1/notebooks/", json=other).json()["id"]
    done = _until(_reader(api, url, "notebooks", other_id), lambda r: r["state"] in ("READY", "FAILED"))
    other_ready = time.perf_counter() - asked
    if done["state"] == "FAILED":
        raise SystemExit(f"notebook failed: {done['failure_reason']}")
    still_building = read()["state"] == "STARTING"
    row = _until(read, lambda r: r["state"] in ("READY", "FAILED"), timeout_s=900)
    built = time.perf_counter() - began
    if not still_building:
        raise SystemExit(f"the environment was built ({built:.0f} s) before the jobs were done: no figure")
    api.delete(f"{url}/api/v1/notebooks/{other_id}/")
    api.delete(f"{url}/api/v1/notebooks/{row['id']}/")
    api.delete(f"{url}/api/v1/instances/{box.json()['id']}/")
    return {
        "admission_to_running": jobs["admission_to_running"],
        "built_notebook_request_to_ready": [other_ready],
        "environment_build": [built],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--no-slurm", action="store_true", help="skip the Slurm part (no deploy/slurm.sh cluster)")
    parser.add_argument("--json", type=Path, default=Path("bench/out/embedded.json"))
    args = parser.parse_args()
    env_dir = Path(os.environ.get("PORTAL_NOTEBOOK_ENV_DIR", Path.home() / ".cache" / "gpuportal" / "bench-envs"))
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as data_dir, tempfile.TemporaryDirectory() as work_dir:
        portal = Portal(Path(data_dir), env_dir, Path(work_dir))
        try:
            api = portal.start()
            for name, seconds in _jobs(api, portal.url, args.runs).items():
                results[f"local_job_{name}"] = _summary(seconds)
            for name, seconds in _instances(api, portal.url, args.runs).items():
                results[f"local_instance_{name}"] = _summary(seconds)
            for name, seconds in _notebooks(api, portal.url, args.runs).items():
                results[f"local_notebook_{name}"] = _summary(seconds)
            for name, seconds in _jobs_while_building(api, portal.url, args.runs).items():
                results[f"local_job_while_building_{name}"] = _summary(seconds)
            if not args.no_slurm:
                portal.manage("register_cluster", "slurm", "--kind", "slurm", "--partition", "gpu")
                for name, seconds in _jobs(api, portal.url, args.runs, cluster="slurm").items():
                    results[f"slurm_job_{name}"] = _summary(seconds)
        finally:
            portal.stop()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
