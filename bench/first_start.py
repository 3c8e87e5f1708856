"""How long the first job and the first notebook take on a portal started from a fresh data directory.

    .venv/bin/python bench/first_start.py [--no-prebuild] [--after 0] [--json bench/out/first_start.json]

Starts the embedded portal (`deploy/run.sh`) on an empty data directory, its environments kept in
it (PORTAL_NOTEBOOK_ENV_DIR is its own `envs/`, empty: nothing built before), signs in as the
admin and, `--after` seconds after the portal says it is running (0: at once, the worst case; a
person signing in takes some seconds), submits a 1-GPU job (`sleep 30`) and launches a CPU
instance with a notebook of the demo's `minimal` profile, all at once, as a newcomer would. It
times, through the API (polled every 50 ms):

- the job: from its POST to the first answer that shows it RUNNING;
- the notebook: from its POST to READY, and to the first answer of its Jupyter through the proxy;

and prints each one's start steps as the portal recorded them (`start_progress`). With
`--no-prebuild` the portal builds no environment ahead (PORTAL_PREBUILD_ENVIRONMENTS=0): the first
start builds its own, as before. pip's cache (~/.cache/pip) is this machine's: packages it holds
are not downloaded again, so a machine that never installed them takes longer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.embedded import Portal  # noqa: E402

POLL_S = 0.05
TARGETS = {"job_submit_to_running_s": 5.0, "notebook_request_to_ready_s": 30.0}


def _poll(api: requests.Session, url: str, done: Any, timeout_s: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        row = dict(api.get(url, timeout=30).json())
        if done(row):
            return row
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: last seen {row}")
        time.sleep(POLL_S)


def _steps(row: dict[str, Any]) -> list[str]:
    """The recorded start steps, one line each: name, how long (or "open"), what it did."""
    lines = []
    for step in row.get("start_progress") or []:
        ended = step["ended_at"]
        took = f"{_stamp(ended) - _stamp(step['started_at']):6.1f} s" if ended else "    open"
        lines.append(f"{step['step']:<12} {took}  {step['detail']}")
    return lines


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def first_job(api: requests.Session, url: str, out: dict[str, Any], ids: dict[str, int]) -> None:
    body = {"workspace": "admin", "name": "first", "command": "sleep 30", "gpu_type": "h100",
            "gpus_per_replica": "1", "cpu_cores": 1, "memory_gb": 1}  # fmt: skip
    began = time.perf_counter()
    job = api.post(f"{url}/api/v1/jobs/", json=body, timeout=30)
    job.raise_for_status()
    ids["job"] = job.json()["id"]
    row = _poll(api, f"{url}/api/v1/jobs/{job.json()['id']}/", lambda r: r["state"] in ("RUNNING", "FAILED"))
    out["job_submit_to_running_s"] = round(time.perf_counter() - began, 2)
    out["job_state"] = row["state"]
    out["job_steps"] = _steps(row)
    api.post(f"{url}/api/v1/jobs/{row['id']}/cancel/", timeout=30)


def first_notebook(api: requests.Session, url: str, out: dict[str, Any], ids: dict[str, int]) -> None:
    began = time.perf_counter()
    box = api.post(f"{url}/api/v1/instances/", json={"workspace": "admin", "name": "box", "profile": "cpu-small"})
    box.raise_for_status()
    body = {"workspace": "admin", "name": "lab", "instance": box.json()["id"], "profile": "minimal"}
    created = api.post(f"{url}/api/v1/notebooks/", json=body, timeout=30)
    created.raise_for_status()
    ids["notebook"] = created.json()["id"]
    read = f"{url}/api/v1/notebooks/{created.json()['id']}/"
    row = _poll(api, read, lambda r: r["state"] in ("READY", "FAILED", "STOPPED"))
    out["notebook_request_to_ready_s"] = round(time.perf_counter() - began, 2)
    out["notebook_state"] = row["state"]
    if row["state"] == "READY":
        host, path = urlsplit(row["url"]).netloc, urlsplit(row["url"]).path
        headers = {"Host": host, "Authorization": f"token {row['access_token']}"}
        while requests.get(f"{url}{path}api/status", headers=headers, allow_redirects=False).status_code != 200:
            time.sleep(POLL_S)
        out["notebook_request_to_first_page_s"] = round(time.perf_counter() - began, 2)
    else:
        out["notebook_failure"] = row.get("failure_reason")
    out["notebook_steps"] = _steps(row)
    out["instance_steps"] = _steps(api.get(f"{url}/api/v1/instances/{box.json()['id']}/").json())


WIDTHS = {"1280": {"width": 1280, "height": 860}, "390": {"width": 390, "height": 844}}


def screenshots(portal: Portal, ids: dict[str, int], where: Path, stop: threading.Event) -> None:
    """While they start, pictures of the job's and the notebook's pages (at a desktop's and a
    phone's width), each taken once its start is past waiting for a worker: signed in as the admin
    in Debian's Chromium (Playwright)."""
    from playwright.sync_api import sync_playwright

    password = re.search(r"Login: admin / (\S+)", "".join(portal.output))
    assert password, "".join(portal.output)
    where.mkdir(parents=True, exist_ok=True)
    pending = {"job": "jobs", "notebook": "notebooks"}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"])
        page = browser.new_page()
        page.goto(f"{portal.url}/login/")
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", password.group(1))
        page.click("button[type=submit]")
        while pending and not stop.is_set():
            for kind, plural in list(pending.items()):
                if kind not in ids:
                    continue
                row = requests.get(f"{portal.url}/api/v1/{plural}/{ids[kind]}/", cookies=_cookies(page)).json()
                steps = row.get("start_progress") or []
                if steps and steps[-1]["ended_at"] is None and steps[-1]["step"] != "queued":
                    page.goto(f"{portal.url}/w/admin/{plural}/{ids[kind]}/")
                    for width, size in WIDTHS.items():
                        page.set_viewport_size(size)
                        page.wait_for_timeout(300)
                        page.screenshot(path=str(where / f"{kind}-starting-{width}.png"), full_page=True)
                    del pending[kind]
            time.sleep(0.2)
        browser.close()


def _cookies(page: Any) -> dict[str, str]:
    return {cookie["name"]: cookie["value"] for cookie in page.context.cookies()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-prebuild", action="store_true", help="build no environment ahead of the starts")
    parser.add_argument("--after", type=float, default=0.0, help="seconds between the portal's start and the requests")
    parser.add_argument("--json", type=Path, default=Path("bench/out/first_start.json"))
    parser.add_argument("--screenshots", type=Path, help="keep pictures of the pages while they start here")
    args = parser.parse_args()
    results: dict[str, Any] = {"prebuild": not args.no_prebuild, "after_s": args.after}
    with tempfile.TemporaryDirectory() as data_dir, tempfile.TemporaryDirectory() as work_dir:
        envs = Path(data_dir) / "envs"  # the portal's default place, empty
        os.environ["PORTAL_PREBUILD_ENVIRONMENTS"] = "0" if args.no_prebuild else "1"  # the portal inherits it
        began = time.perf_counter()
        portal = Portal(Path(data_dir), envs, Path(work_dir))
        try:
            api = portal.start()
            results["portal_start_s"] = round(time.perf_counter() - began, 1)
            time.sleep(args.after)
            jobs: dict[str, Any] = {}
            notebooks: dict[str, Any] = {}
            ids: dict[str, int] = {}
            threads = [
                threading.Thread(target=first_job, args=(api, portal.url, jobs, ids)),
                threading.Thread(target=first_notebook, args=(api, portal.url, notebooks, ids)),
            ]
            stop = threading.Event()
            if args.screenshots:
                threads.append(threading.Thread(target=screenshots, args=(portal, ids, args.screenshots, stop)))
            for thread in threads:
                thread.start()
            for thread in threads[:2]:
                thread.join()
            stop.set()
            for thread in threads[2:]:
                thread.join()
            results.update(jobs)
            results.update(notebooks)
            builds = envs / "builds.json"
            results["environment_builds"] = json.loads(builds.read_text()) if builds.exists() else {}
        finally:
            portal.stop()
    for name, target in TARGETS.items():
        if name in results:
            results[f"{name.removesuffix('_s')}_within_target"] = results[name] <= target
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    for key in ("job_steps", "notebook_steps", "instance_steps"):
        print(f"{key}:")
        for line in results.get(key, []):
            print(f"  {line}")
    print(json.dumps({k: v for k, v in results.items() if not k.endswith("_steps")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
