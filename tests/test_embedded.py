"""The README's first command: the embedded portal starts, answers, and stops cleanly."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.proxy import browser_session, sign_in

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_state(job_url: str, headers: dict[str, str], states: set[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    state = ""
    while state not in states and time.monotonic() < deadline:
        state = requests.get(job_url, headers=headers, timeout=10).json()["state"]
        time.sleep(0.3)
    return state


def _processes_with(marker: str) -> list[int]:
    """Pids whose environment or command line mentions `marker` (the run's private data directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes() + (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


class EmbeddedPortal:
    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.port = _free_port()
        env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"}}
        env.update(PORTAL_DATA_DIR=str(data_dir), PORTAL_PORT=str(self.port))
        # Notebook environments are shared with the other tests (built once per machine).
        env.setdefault("PORTAL_NOTEBOOK_ENV_DIR", str(Path.home() / ".cache" / "gpuportal" / "test-envs"))
        self.process = subprocess.Popen(
            ["bash", "deploy/run.sh"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.output: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if "GPU Portal is running at" in line:
                self.ready.set()

    def wait_ready(self, timeout_s: float = 180) -> str:
        assert self.ready.wait(timeout_s), "".join(self.output)
        return f"http://127.0.0.1:{self.port}"

    def admin_headers(self, url: str) -> dict[str, str]:
        """The API's headers for the admin whose password the start printed."""
        password = re.search(r"Login: admin / (\S+)", "".join(self.output))
        assert password, "".join(self.output)
        answer = requests.post(
            f"{url}/api/v1/auth/token/", json={"username": "admin", "password": password.group(1)}, timeout=10
        )
        return {"Authorization": f"Token {answer.json()['token']}"}

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)  # what Ctrl-C sends
        return self.process.wait(timeout=60)


@pytest.mark.slow
def test_it_runs_answers_and_stops_without_stray_processes(tmp_path: Path) -> None:
    data_dir = tmp_path / "portal-data"
    portal = EmbeddedPortal(data_dir)
    try:
        url = portal.wait_ready()
        output = "".join(portal.output)
        assert f"GPU Portal is running at {url}" in output
        password = re.search(r"Login: admin / (\S+)", output)
        assert password, output

        assert requests.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
        assert requests.get(f"{url}/api/schema/", timeout=30).status_code == 200
        token = requests.post(
            f"{url}/api/v1/auth/token/", json={"username": "admin", "password": password.group(1)}, timeout=10
        ).json()["token"]
        headers = {"Authorization": f"Token {token}"}

        # Without a mail server, an invitation is written where the start said, link and all. (The
        # start prints that after the line that says it runs: wait for it.)
        said = f"Mail (invitations): written to {data_dir.resolve() / 'mail'}"
        deadline = time.monotonic() + 15
        while said not in "".join(portal.output):
            assert time.monotonic() < deadline, "".join(portal.output)
            time.sleep(0.1)
        invited = requests.post(
            f"{url}/api/v1/invitations/",
            json={"workspace": "admin", "email": "dana@example.org", "role": "viewer"},
            headers=headers,
            timeout=10,
        )
        assert invited.status_code == 201 and invited.json()["sent_at"], invited.text
        [mail] = (data_dir / "mail").iterdir()
        link = re.search(r"(/invitations/[A-Za-z0-9_-]+/)", mail.read_text())
        assert link and "To: dana@example.org" in mail.read_text()
        assert "Make my account and accept" in requests.get(f"{url}{link.group(1)}", timeout=10).text

        profiles = requests.get(f"{url}/api/v1/compute-profiles/", headers=headers, timeout=10).json()
        assert profiles["count"] == 5
        notebooks = requests.get(f"{url}/api/v1/notebook-profiles/", headers=headers, timeout=10).json()
        assert {p["name"] for p in notebooks["results"]} == {"minimal", "data-science", "spark", "tensorflow"}
        gpus = requests.get(f"{url}/api/v1/gpus/", headers=headers, timeout=10).json()
        assert gpus["count"] >= 1

        # A job submitted over HTTP is admitted by the scheduler, started by the worker on this
        # machine, and followed to its end by the reconcile loop.
        body = {"workspace": "admin", "name": "hello", "command": "echo hi from $CUDA_VISIBLE_DEVICES"}
        job = requests.post(
            f"{url}/api/v1/jobs/",
            json={**body, "gpu_type": "h100", "gpus_per_replica": "1"},
            headers=headers,
            timeout=10,
        )
        assert job.status_code == 201, job.text
        job_url = f"{url}/api/v1/jobs/{job.json()['id']}/"
        assert _wait_for_state(job_url, headers, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
        assert requests.get(f"{job_url}logs/", headers=headers, timeout=10).json()["text"] == "hi from 0\n"

        # The metrics, behind the token the start names, on SQLite: the job's wait and admission,
        # and the scheduler loop's cycles.
        assert f"Metrics: {url}/metrics" in "".join(portal.output)
        scraper = {"Authorization": f"Bearer {(data_dir / 'metrics_token').read_text().strip()}"}
        assert requests.get(f"{url}/metrics", timeout=10).status_code == 401
        scraped = requests.get(f"{url}/metrics", headers=scraper, timeout=30)
        assert scraped.status_code == 200, scraped.text[:300]
        figures = {
            sample.name + str(sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(scraped.text)
            for sample in family.samples
        }
        assert figures["gpuportal_admissions_total[('kind', 'job')]"] >= 1
        assert figures["gpuportal_wait_seconds_count[('kind', 'job')]"] >= 1
        assert figures["gpuportal_scheduler_cycles_total[]"] >= 1

        # An instance and a notebook on it run for real; the notebook answers through the proxy
        # in front of the portal, to its members.
        nb_profile = {"name": "kernel-only", "image": "quay.io/jupyter/base-notebook", "published": True}
        created = requests.post(f"{url}/api/v1/notebook-profiles/", json=nb_profile, headers=headers, timeout=10)
        assert created.status_code == 201, created.text
        body = {"workspace": "admin", "name": "box", "profile": "cpu-small"}
        instance = requests.post(f"{url}/api/v1/instances/", json=body, headers=headers, timeout=10).json()
        assert _wait_for_state(f"{url}/api/v1/instances/{instance['id']}/", headers, {"RUNNING"}) == "RUNNING"
        body = {"workspace": "admin", "name": "lab", "instance": instance["id"], "profile": "kernel-only"}
        notebook = requests.post(f"{url}/api/v1/notebooks/", json=body, headers=headers, timeout=10).json()
        notebook_url = f"{url}/api/v1/notebooks/{notebook['id']}/"
        assert _wait_for_state(notebook_url, headers, {"READY", "FAILED"}, timeout_s=180) == "READY"
        # ...on a host of its own: the admin signs in to the portal and is handed on to it; the
        # server's token works too; nobody else gets anything but the way to the portal.
        assert notebook["url"] == f"http://lab-{notebook['id']}.localhost:{portal.port}/"
        status = f"{notebook['url']}api/status"
        admin = sign_in(url, "admin", password.group(1))
        opened = admin.get(notebook["url"], timeout=30)
        assert opened.status_code == 200 and "<title>JupyterLab</title>" in opened.text
        assert opened.url == f"{notebook['url']}lab"
        nb_token = {"Authorization": f"token {notebook['access_token']}"}
        assert browser_session().get(status, headers=nb_token, timeout=10).status_code == 200
        anonymous = browser_session().get(status, allow_redirects=False, timeout=10)
        assert anonymous.status_code == 302
        assert anonymous.headers["Location"].startswith(f"{url}/notebooks/authorize/lab-{notebook['id']}/")

        # A job still running when the portal stops is stopped with it (its command names the
        # data directory, so the check for stray processes below would see it).
        body = {"workspace": "admin", "name": "sleeper", "command": f"sleep 300 # {data_dir}"}
        sleeper = requests.post(f"{url}/api/v1/jobs/", json=body, headers=headers, timeout=10).json()
        assert _wait_for_state(f"{url}/api/v1/jobs/{sleeper['id']}/", headers, {"RUNNING"}) == "RUNNING"
    finally:
        code = portal.stop()
    assert code == 0, "".join(portal.output)
    assert _processes_with(str(data_dir)) == []

    # Running it again is safe: same data, no new admin password for a used account is needed.
    # The instance and the notebook stopped with the portal start again.
    again = EmbeddedPortal(data_dir)
    try:
        url = again.wait_ready()
        assert requests.get(f"{url}/healthz", timeout=10).status_code == 200
        notebook_url = f"{url}/api/v1/notebooks/{notebook['id']}/"
        assert _wait_for_state(notebook_url, headers, {"READY"}, timeout_s=60) == "READY"
        deadline = time.monotonic() + 30
        # Its URL follows the portal's new address (another port this time).
        status = requests.get(notebook_url, headers=headers, timeout=10).json()["url"] + "api/status"
        assert f":{again.port}/" in status
        while browser_session().get(status, headers=nb_token, timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the notebook did not come back after the restart"
            time.sleep(0.3)
    finally:
        assert again.stop() == 0
    assert _processes_with(str(data_dir)) == []
