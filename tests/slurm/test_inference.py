"""Inference endpoint replicas on the real Slurm, for real: the llama.cpp server (its environment
built with the nodes' Python by deploy/test.sh) serving a tiny model made here, as a batch job of a
workspace's own Unix account where the tests run as root, listening on its node's address behind
the replica's API key. First through the backend alone, then through the portal (the scheduler
places the replica on the Slurm cluster, the notebook proxy in front of the live portal calls it).

Slurm's simulated nodes are this one machine: what a node runs is a process here, found in ``/proc``.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.accounts.api_tokens import do_create_token
from apps.inference.actions import do_delete_endpoint
from apps.inference.models import Replica
from apps.inventory.actions import do_register_cluster
from apps.workspaces.unix import ensure_account
from tests.conftest import SHARED_ENV_DIR
from tests.inference.endpoints import cpu_profile, endpoint
from tests.inference.serving import chat, client, serving, turn_until
from tests.inference.tinymodel import write_tiny_gguf
from tests.personas import World
from tests.proxy import Proxy
from tests.slurm.conftest import squeue
from workers.backends import servers
from workers.backends.base import BackendError, Endpoint, InferenceSpec, Keep, RunAs, Status
from workers.backends.pyenv import ensure_serve_env
from workers.backends.slurm import SERVER_ENV_FILE, SlurmBackend
from workers.backends.slurm_commands import master_port

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)

NODE_PYTHON = "/usr/bin/python3"  # the nodes' Python: the accounts cannot reach pytest's
#: The workspace account the replicas run as where the tests run as root (next to the Ray tests'),
#: made with groupadd/useradd as apps/workspaces/unix.py makes them.
ACCOUNT = ("gpw-infslurm", 200_614)
WORKSPACE = "team-inf"
SERVED_NAME = "tiny-chat"


def run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout


@pytest.fixture(scope="module")
def serve_env() -> Path:
    """The server's environment for the nodes' Python. deploy/test.sh builds it first (compiling
    llama.cpp: minutes); built again here only where the SDK changed since (pip's cached wheel: seconds)."""
    return ensure_serve_env("llamacpp", SHARED_ENV_DIR, NODE_PYTHON)


@pytest.fixture(scope="module")
def account() -> RunAs | None:
    """The workspace's own account where the tests run as root (the portal switches to it then)."""
    if os.geteuid() != 0:
        return None
    name, uid = ACCOUNT
    with contextlib.suppress(KeyError):
        entry = pwd.getpwnam(name)
        return RunAs(name, entry.pw_uid, entry.pw_gid)
    for argv in (["groupadd", "--gid", str(uid), name],
                 ["useradd", "--uid", str(uid), "--gid", str(uid), "--no-create-home", "--home-dir", "/nonexistent",
                  "--shell", "/usr/sbin/nologin", name]):  # fmt: skip
        subprocess.run(argv, capture_output=True, check=False, timeout=30)
    entry = pwd.getpwnam(name)
    return RunAs(name, entry.pw_uid, entry.pw_gid)


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    """A work directory the workspace's account can reach, as a cluster's shared filesystem is."""
    work = Path(tempfile.mkdtemp(prefix="gpuportal-infslurm-")) / "work"
    work.parent.chmod(0o711)
    work.mkdir(mode=0o711)
    yield work
    SlurmBackend().sweep_orphans(str(work))
    shutil.rmtree(work.parent, ignore_errors=True)


def backend_for(work: Path) -> SlurmBackend:
    return SlurmBackend(env_root=str(SHARED_ENV_DIR), python=NODE_PYTHON, owner=str(work), start_timeout_s=60)


def replica_spec(work: Path, key: str, model: Path, account: RunAs | None) -> InferenceSpec:
    return InferenceSpec(
        key=key,
        workspace=WORKSPACE,
        name=key,
        work_dir=str(work / WORKSPACE),
        server="llamacpp",
        model_path=str(model),
        served_name=SERVED_NAME,
        cpu_cores=1,
        memory_gb=1,
        start_timeout_s=60,
        api_key=secrets.token_urlsafe(24),
        run_as=account,
    )


def model_at(work: Path, relative: str) -> Path:
    """The tiny model in the workspace's directory (made by the portal: the account reads it)."""
    path = work / WORKSPACE / relative
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    return write_tiny_gguf(path)


@dataclass
class Running:
    backend: SlurmBackend
    spec: InferenceSpec
    endpoint: Endpoint

    @property
    def job_id(self) -> str:
        return str(self.backend.get_state()["job_id"])

    @property
    def job_dir(self) -> Path:
        return Path(self.spec.work_dir, self.spec.key)

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.endpoint.url, headers=headers, timeout=30)


def server_processes(port: int) -> dict[int, str]:
    """The processes of this machine (Slurm's nodes) serving on ``port``: pid -> command line."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if b"uvicorn" in cmdline and b"--port" in cmdline and cmdline[cmdline.index(b"--port") + 1] == b"%d" % port:
                found[int(entry)] = b" ".join(cmdline).decode(errors="replace")
    return found


@pytest.fixture(scope="module")
def replica(serve_env: Path, work: Path, account: RunAs | None) -> Iterator[Running]:
    backend = backend_for(work)
    spec = replica_spec(work, "replica-1", model_at(work, "models/tiny.gguf"), account)
    started = backend.start_inference(spec)
    yield Running(backend, spec, started)
    with contextlib.suppress(BackendError):
        backend.stop(grace_s=5)


def test_the_server_listens_on_tcp_only_with_its_key() -> None:
    argv, env = servers.command(
        "llamacpp", model_path="/m.gguf", served_name="m", cpu_cores=1, api_key="k", host="10.0.0.7", port="20001"
    )
    assert argv[argv.index("--host") + 1 :][:3] == ["10.0.0.7", "--port", "20001"] and "--uds" not in argv
    assert env["API_KEY"] == "k" and "k" not in argv
    with pytest.raises(ValueError):  # any process of the node could call it
        servers.command("llamacpp", model_path="/m.gguf", served_name="m", cpu_cores=1, host="10.0.0.7", port="1")
    vllm, _ = servers.command("vllm", model_path="/m", served_name="m", cpu_cores=1, api_key="k", host="h", port="2")
    assert vllm[:7] == ["vllm", "serve", "/m", "--host", "h", "--port", "2"]


def test_a_replica_serves_the_openai_api_on_its_node_to_its_key_alone(replica: Running) -> None:
    assert replica.endpoint.url == f"http://127.0.0.1:{replica.endpoint.port}"  # the node's address
    with replica.client() as anonymous:
        assert anonymous.get("/v1/models").status_code == 401
        assert anonymous.post("/v1/chat/completions", json={"messages": []}).status_code == 401
    with replica.client("not-the-key") as wrong:
        assert wrong.get("/v1/models").status_code == 401
    with replica.client(replica.spec.api_key) as keyed:
        assert keyed.get("/v1/models").json()["data"][0]["id"] == SERVED_NAME
        body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
        answer = keyed.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["role"] == "assistant"
    assert answer.json()["usage"]["completion_tokens"] > 0
    assert replica.backend.poll() == Status("running")


def test_the_replica_is_a_slurm_job_of_the_workspaces_account_of_its_size(
    replica: Running, account: RunAs | None
) -> None:
    user = account.user if account else pwd.getpwuid(os.geteuid()).pw_name
    listed = run("squeue", "-h", "-j", replica.job_id, "-o", "%T|%D|%C|%m|%u|%a|%j").strip().split("|")
    assert listed[:5] == ["RUNNING", "1", "1", "1G", user], listed
    assert listed[6] == replica.spec.key
    if account:
        assert listed[5] == WORKSPACE  # the workspace's Slurm account
    running = server_processes(replica.endpoint.port)
    assert running, "no server process found"
    owners = {Path(f"/proc/{pid}").stat().st_uid for pid in running}
    assert owners == {account.uid if account else os.geteuid()}


def test_its_key_is_in_no_command_line_batch_script_or_state(replica: Running, account: RunAs | None) -> None:
    key = replica.spec.api_key
    shown = run("scontrol", "show", "job", "-dd", replica.job_id)
    shown += run("scontrol", "write", "batch_script", replica.job_id, "-")  # the script, as Slurm keeps it
    assert "replica.sh" in shown and key not in shown
    running = server_processes(replica.endpoint.port)
    assert running and not any(key in cmdline for cmdline in running.values())
    # The server has it in its environment, which only its account (and root) can read.
    assert any(f"API_KEY={key}".encode() in Path(f"/proc/{pid}/environ").read_bytes() for pid in running)
    assert key not in json.dumps(replica.backend.get_state())
    env_file = replica.job_dir / ".portal" / SERVER_ENV_FILE
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert (replica.job_dir / ".portal").stat().st_mode & 0o777 == 0o700
    if account:
        assert env_file.stat().st_uid == account.uid


def test_a_start_whose_worker_died_is_adopted_and_answers(replica: Running, work: Path) -> None:
    taken = backend_for(work)
    assert taken.adopt(replica.spec) == replica.endpoint
    assert taken.poll() == Status("running")
    assert b"Uvicorn running on http://127.0.0.1" in taken.logs(0)[0]
    state = replica.backend.get_state()
    assert SlurmBackend().sweep_orphans(str(work), Keep(states=(state,))) == []
    # Reattached from its recorded state, as after a worker's restart.
    again = backend_for(work)
    again.load_state(state)
    assert again.poll() == Status("running") and again.start_inference(replica.spec) == replica.endpoint


def test_stop_ends_the_slurm_job_and_its_server(replica: Running) -> None:
    replica.backend.stop(grace_s=10)
    assert squeue(replica.job_id) == ""
    assert server_processes(replica.endpoint.port) == {}
    status = replica.backend.poll()
    assert status.state == "exited" and status.message == "stopped on request"
    assert b"Uvicorn running on" in replica.backend.logs(0)[0]  # its log stays readable


def test_a_model_it_cannot_load_fails_the_start_with_the_servers_last_lines(
    serve_env: Path, work: Path, account: RunAs | None
) -> None:
    broken = work / WORKSPACE / "models" / "broken.gguf"
    broken.parent.mkdir(parents=True, exist_ok=True)
    broken.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\xff" * 64)  # a GGUF header, then nothing usable
    backend = backend_for(work)
    spec = replica_spec(work, "replica-broken", broken, account)
    with pytest.raises(BackendError) as failed:
        backend.start_inference(spec)
    assert failed.value.permanent  # it would fail again
    assert "exited before it answered" in failed.value.message
    assert "Failed to load model" in failed.value.message, failed.value.message
    assert squeue(str(backend.get_state()["job_id"])) == ""


class Squatter(http.server.BaseHTTPRequestHandler):
    """Another tenant's server on the node, which took a replica's port first: it answers every
    request, and keeps the Authorization headers it was sent."""

    seen: list[str] = []

    def do_GET(self) -> None:
        Squatter.seen.append(self.headers.get("Authorization", ""))
        body = b'{"object": "list", "data": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_port_another_tenant_took_first_fails_the_start_and_never_gets_the_key(
    serve_env: Path, work: Path, account: RunAs | None
) -> None:
    # A replica's port follows from its job's id (MASTER_PORT): take those of the next jobs.
    held = run("sbatch", "--parsable", "--hold", "-p", "gpu", "-o", "/dev/null", "--wrap", "true").strip()
    run("scancel", held)
    squatters = []
    for job_id in range(int(held) + 1, int(held) + 30):
        squatter = http.server.ThreadingHTTPServer(("127.0.0.1", master_port(str(job_id))), Squatter)
        threading.Thread(target=squatter.serve_forever, args=(0.05,), daemon=True).start()
        squatters.append(squatter)
    backend = backend_for(work)
    spec = replica_spec(work, "replica-squatted", model_at(work, "models/tiny.gguf"), account)
    try:
        with pytest.raises(BackendError) as failed:
            backend.start_inference(spec)
    finally:
        for squatter in squatters:
            squatter.shutdown()
            squatter.server_close()
    assert failed.value.permanent and "address already in use" in failed.value.message, failed.value.message
    assert spec.api_key not in "".join(Squatter.seen)
    assert squeue(str(backend.get_state()["job_id"])) == ""


def test_an_endpoint_on_the_slurm_cluster_serves_through_the_portal(
    serve_env: Path, tx_world: World, proxy: Proxy, settings: Any, shared_work: Path
) -> None:
    world = tx_world
    # The workspace's account runs the server on its node: the workspace's directory and the
    # server's environment are on storage the accounts reach, as a cluster's are.
    settings.PORTAL_WORK_DIR = shared_work
    settings.PORTAL_NOTEBOOK_ENV_DIR = SHARED_ENV_DIR
    settings.PORTAL_NOTEBOOK_PYTHON = NODE_PYTHON
    settings.PORTAL_INFERENCE_START_TIMEOUT_S = 60
    slurm = do_register_cluster("slurm", kind="slurm", connection={"partition": "gpu"}, acting_user=world.admin)
    made = endpoint(world.team_a, world.alice, cpu_profile(memory_gb=1), requested_cluster=slurm)
    replica = turn_until(lambda: serving(made))[0]
    assert replica.cluster_id == slurm.pk
    assert replica.proxy_target.startswith("http://127.0.0.1:"), replica.proxy_target
    job_id = str(replica.backend_state["job_id"])
    assert run("squeue", "-h", "-j", job_id, "-o", "%T %u %a").split() == [
        "RUNNING", ensure_account(world.team_a).user, "team-a",
    ]  # fmt: skip
    assert httpx.get(f"{replica.proxy_target}/v1/models", timeout=10).status_code == 401  # the proxy adds the key

    token = do_create_token(world.alice, name="app", expires_in_days=1, endpoint=made, acting_user=world.alice)[1]
    with client(made, token, proxy.url) as http:
        answer = chat(http, made)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["role"] == "assistant"

    do_delete_endpoint(made, acting_user=world.alice)
    turn_until(lambda: Replica.objects.get(pk=replica.pk).state == Replica.State.STOPPED, timeout_s=60)
    assert squeue(job_id) == ""
