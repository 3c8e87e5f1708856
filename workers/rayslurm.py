"""The program a Ray cluster's Slurm batch job runs: the batch step, and each node of the cluster.

The Slurm backend (workers/backends/slurm_ray.py) submits one batch job for a whole Ray cluster: a
heterogeneous job whose component 0 is the head's node and component 1 the workers' nodes (a plain
one-node job where there are no workers). Its batch script runs this program as ``batch``, on the
head's node, which

1. starts the head as a job step (``srun --het-group=0 ... rayslurm.py node head``) and waits until
   the head's dashboard answers;
2. starts the workers as one job step, one task per node (``srun --het-group=1
   --ntasks-per-node=1 ... rayslurm.py node worker``; task ``i`` is ``worker-i``), and waits until
   every node joined the cluster;
3. writes ``status.json`` in the cluster's Ray directory (``phase`` ``ready``: the backend's start
   returns), then runs the ``entrypoint``, if there is one, as the cluster's Ray job through the
   Jobs API, copying its driver's log to this program's output, and ends the whole batch job with
   its exit code; without one it waits until a node's step ends or it is stopped.

Each ``node`` runs ``ray start --block`` with the node's own ``--num-cpus``, ``--num-gpus``
(the devices Slurm gave the step, in ``CUDA_VISIBLE_DEVICES``, which Ray honours), ``--memory``,
``--object-store-memory`` and a custom resource naming it (``{"worker-0": 1}``), so that work can be
pinned to a node. Its ``--temp-dir`` is its directory under the cluster's Ray directory, reached
through a short link in a private directory of its own (``mktemp -d /tmp/ray-XXXXXXXX``): Ray puts
Unix sockets under its temporary directory, and their paths must fit 107 bytes. Every port Ray takes
a fixed default for (the head's GCS, dashboard and client server, each node's dashboard agent) is
picked free on the node, as simulated nodes may be one machine, and the head publishes its own in
``head.json``; Ray picks the others itself (``--min-worker-port=0``, ...).

The cluster's token reaches Ray through the environment only (``RAY_AUTH_MODE=token``,
``RAY_AUTH_TOKEN``): this program reads it, with the portal's variables, from a file only the
cluster's account can read (``ray-secrets.json``) and puts it in the environment of the steps it
starts. ``ray stop`` is never called: it stops every Ray process of the account on the machine.

Ending. A node ends on SIGTERM (``scancel --signal=TERM``, the backend's stop, or this program's own
when the entrypoint ended): ``ray start --block`` drains the node for ``DRAIN_TIMEOUT_S`` and stops
its processes (every process it starts dies with it, and it dies with the node's program), the
program removes its link and exits 143. A node's step that ends so means the cluster was stopped;
any other end of a step (a node that died) fails the cluster: it runs as one gang, and the batch
job then ends with 1. The batch job's exit status is the entrypoint's exit code, 143 when stopped
(see ``exit_as()``). A node killed before it could remove its link (SIGKILL) leaves that link's
empty directory; the next node of the account on that machine removes it (``remove_stale_links()``).

Standard library only; it runs on the Python of the environment that holds ``ray``. Usage:
``rayslurm.py batch <config.json>`` or ``rayslurm.py node <config.json> head|worker``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

STATUS_VERSION = 1
STOPPED_EXIT_CODE = 143
FAILED_EXIT_CODE = 1
_TERMINAL_JOB_STATES = ("SUCCEEDED", "FAILED", "STOPPED")
_PR_SET_PDEATHSIG = 1
#: How long a node stopped with SIGTERM lets Ray drain it (its default, 30 s, is for Ray Serve's
#: rolling upgrades; here the whole cluster is going away). The spec's ``env`` may set another.
DRAIN_TIMEOUT_S = "2"
#: Where each node's short link to its Ray directory lies (not ``$TMPDIR``, which a cluster's
#: environment may set to a path too long for Ray's sockets).
LINK_PARENT = "/tmp"
#: The rendezvous variables Slurm's jobs get, which mean nothing to a Ray node.
_RENDEZVOUS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def log(message: str) -> None:
    print(f"rayslurm: {message}", flush=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a reader sees the old file or the new one, whole)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(data, indent=1))
    os.replace(partial, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on every address of this machine right now (held together, so
    that they differ, and released for Ray to take a moment later)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def node_address() -> str:
    """This Slurm node's address (``NodeAddr``), as the other nodes and the portal reach it."""
    node = os.environ.get("SLURMD_NODENAME", "")
    try:
        out = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    match = re.search(r"NodeAddr=(\S+)", out)
    return match.group(1) if match else socket.gethostbyname(socket.gethostname())


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the process that started it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Cluster:
    """What both parts know: the configuration the backend wrote, and the cluster's directories."""

    def __init__(self, config_path: str) -> None:
        config = json.loads(Path(config_path).read_text())
        self.config_path = config_path
        self.config: dict[str, Any] = config
        self.ray_dir = Path(config["ray_dir"])
        self.job_dir = Path(config["job_dir"])

    def dashboard(self) -> str:
        head = read_json(self.ray_dir / "head.json") or {}
        return f"http://{head.get('address', '127.0.0.1')}:{head.get('dashboard_port', 0)}"

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A call to the dashboard's HTTP API, with the cluster's token."""
        request = urllib.request.Request(
            self.dashboard() + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {os.environ.get('RAY_AUTH_TOKEN', '')}",
                     "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def alive_nodes(self) -> dict[str, dict[str, Any]]:
        """The nodes the dashboard lists as alive, by the name of their resource (``head``, ``worker-0``)."""
        try:
            answer = self.api("GET", "/api/v0/nodes?limit=10000&detail=false")
        except (OSError, ValueError):
            return {}
        found = {}
        for node in nodes_of(answer):
            if node.get("state") == "ALIVE":
                found[str(node.get("node_name", ""))] = node
        return found


def nodes_of(answer: Any) -> list[dict[str, Any]]:
    """The node records of a State API answer (``{"data": {"result": {"result": [...]}}}``)."""
    data = answer.get("data", {}) if isinstance(answer, dict) else {}
    result = data.get("result", {}) if isinstance(data, dict) else {}
    nodes = result.get("result", []) if isinstance(result, dict) else []
    return [n for n in nodes if isinstance(n, dict)]


# -- a node ----------------------------------------------------------------------------------------


def remove_stale_links() -> None:
    """Remove the link directories (``/tmp/ray-XXXXXXXX``) this account's nodes left on this machine
    when they were killed before they could remove their own (a stop with no time to drain): those
    whose node directory is gone, or whose cluster ended (its ``status.json`` says so)."""
    for entry in Path(LINK_PARENT).glob("ray-????????"):
        try:
            info = entry.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            target = Path(os.readlink(entry / "t"))
        except OSError:
            continue
        status = read_json(target.parent / "status.json") or {}
        if not target.is_dir() or status.get("phase") in ("exited", "failed"):
            shutil.rmtree(entry, ignore_errors=True)


def node_argv(cluster: Cluster, role: str, name: str, address: str, temp_dir: str) -> list[str]:
    """``ray start --block`` for the node ``name`` at ``address``, on ports free here; the head
    publishes its own (``head.json``), which a worker reads to join it."""
    shape = cluster.config["head" if role == "head" else "workers"]
    ray = str(Path(sys.executable).parent / "ray")
    argv = [ray, "start", "--block", f"--temp-dir={temp_dir}", f"--node-name={name}"]
    argv += [f"--node-ip-address={address}", "--disable-usage-stats", "--min-worker-port=0", "--max-worker-port=0"]
    argv += [f"--num-cpus={shape['num_cpus']}", f"--num-gpus={shape['num_gpus']}"]
    argv += [f"--memory={shape['memory_bytes']}", f"--object-store-memory={shape['object_store_bytes']}"]
    argv += [f"--resources={json.dumps({name: 1})}"]
    if role == "head":
        gcs, dashboard, client, agent = free_ports(4)
        argv += ["--head", f"--port={gcs}", "--include-dashboard=true", f"--ray-client-server-port={client}"]
        argv += [f"--dashboard-host={address}", f"--dashboard-port={dashboard}"]
        published = {"address": address, "gcs_port": gcs, "dashboard_port": dashboard, "client_port": client}
        write_json(cluster.ray_dir / "head.json", published | {"slurm_node": os.environ.get("SLURMD_NODENAME", "")})
    else:
        (agent,) = free_ports(1)
        head = read_json(cluster.ray_dir / "head.json") or {}
        argv += [f"--address={head.get('address')}:{head.get('gcs_port')}"]
    return [*argv, f"--dashboard-agent-listen-port={agent}"]


def run_node(cluster: Cluster, role: str) -> int:
    """Run one Ray node on this Slurm node until it ends or this process gets SIGTERM."""
    name = "head" if role == "head" else f"worker-{int(os.environ.get('SLURM_PROCID', '0'))}"
    address, slurm_node = node_address(), os.environ.get("SLURMD_NODENAME", "")
    node_dir = cluster.ray_dir / name
    shutil.rmtree(node_dir, ignore_errors=True)
    node_dir.mkdir(mode=0o700)
    remove_stale_links()
    link_root = tempfile.mkdtemp(prefix="ray-", dir=LINK_PARENT)  # 0700, named at random
    os.symlink(node_dir, f"{link_root}/t")
    argv = node_argv(cluster, role, name, address, f"{link_root}/t")
    write_json(cluster.ray_dir / f"node-{name}.json", {"name": name, "slurm_node": slurm_node, "address": address})
    env = {k: v for k, v in os.environ.items() if k not in _RENDEZVOUS} | {"RAY_USAGE_STATS_ENABLED": "0"}
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", DRAIN_TIMEOUT_S)
    log(f"{name} on {slurm_node}: {shlex.join(argv[1:])}")
    proc = subprocess.Popen(argv, env=env, cwd=cluster.job_dir, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    stopping: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        if not stopping:  # once: Slurm may send it again while the node stops
            stopping.append(signum)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        code = proc.wait()
    finally:
        shutil.rmtree(link_root, ignore_errors=True)
    log(f"{name} exited with code {code}" + (" (stopped on request)" if stopping else ""))
    if stopping:
        return STOPPED_EXIT_CODE
    return 128 - code if code < 0 else code


# -- the batch step --------------------------------------------------------------------------------


class Batch:
    """The batch step: starts the nodes' steps, says when the cluster is ready, runs the entrypoint."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.config = cluster.config
        self.steps: dict[str, subprocess.Popen[bytes]] = {}
        self.phase = "starting"
        self.reason = ""
        self.ready_at: float | None = None
        self.exit_code: int | None = None
        self.job: dict[str, Any] = {}
        self.stopping = False
        self._driver_log: BinaryIO | None = None

    def write_status(self) -> None:
        """``status.json`` (``version`` 1): the cluster's ``phase`` (``starting``, ``ready``, ``failed``,
        ``stopping``, ``exited``), why (``reason``), the Slurm job, the head's addresses, when it was
        ready, its entrypoint job and its exit code once it ended."""
        head = read_json(self.cluster.ray_dir / "head.json") or {}
        status = {
            "version": STATUS_VERSION,
            "job_id": os.environ.get("SLURM_JOB_ID", ""),
            "phase": self.phase,
            "reason": self.reason,
            "updated_at": time.time(),
            "ready_at": self.ready_at,
            "head": head,
            "nodes": ["head", *(f"worker-{i}" for i in range(self.config["workers"]["replicas"]))],
            "entrypoint": self.job or None,
            "exit_code": self.exit_code,
        }
        write_json(self.cluster.ray_dir / "status.json", status)

    def set_phase(self, phase: str, reason: str = "") -> None:
        if (phase, reason) != (self.phase, self.reason):
            log(f"cluster {phase}" + (f": {reason}" if reason else ""))
        self.phase, self.reason = phase, reason
        if phase == "ready" and self.ready_at is None:
            self.ready_at = time.time()
        self.write_status()

    def fail(self, reason: str) -> None:
        self.exit_code = FAILED_EXIT_CODE
        self.set_phase("failed", reason)

    def srun(self, role: str) -> subprocess.Popen[bytes]:
        config, portal = self.config, Path(self.config["portal_dir"])
        argv = ["srun", "--export=ALL"]  # a node that ends ends the cluster: this program stops the others
        if config["workers"]["replicas"]:
            argv.append(f"--het-group={0 if role == 'head' else 1}")
        count = 1 if role == "head" else config["workers"]["replicas"]
        output = portal / ("head.log" if role == "head" else "worker-%t.log")
        argv += [f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1", f"--output={output}"]
        argv += [f"--error={output}", sys.executable, "-I", os.path.abspath(__file__), "node"]
        argv += [self.cluster.config_path, role]
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, cwd=self.cluster.job_dir)

    def run(self) -> int:
        secrets = read_json(Path(self.config["secrets"])) or {}
        os.environ.update({str(k): str(v) for k, v in secrets.items()})
        os.environ["RAY_AUTH_MODE"] = "token"
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self.write_status()
        try:
            if self.start():
                self.supervise()
        finally:
            self.shutdown()
        return STOPPED_EXIT_CODE if self.exit_code is None else self.exit_code

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def start(self) -> bool:
        """The head, then the workers once the head's dashboard answers; True once every node joined."""
        deadline = time.monotonic() + float(self.config["start_timeout_s"])
        self.steps["head"] = self.srun("head")
        if not self.wait_for(lambda: "head" in self.cluster.alive_nodes(), deadline, "the head to answer"):
            return False
        if self.config["workers"]["replicas"]:
            self.steps["workers"] = self.srun("worker")
        expected = {"head", *(f"worker-{i}" for i in range(self.config["workers"]["replicas"]))}
        if not self.wait_for(lambda: expected <= set(self.cluster.alive_nodes()), deadline, "every node to join"):
            return False
        self.set_phase("ready")
        return True

    def wait_for(self, condition: Any, deadline: float, what: str) -> bool:
        while not self.stopping:
            if self.step_ended():
                return False
            if condition():
                return True
            if time.monotonic() > deadline:
                self.fail(f"timed out waiting for {what} ({self.config['start_timeout_s']:g}s)")
                return False
            time.sleep(0.5)
        return False

    def step_ended(self) -> bool:
        """Whether a node's step ended (the cluster then fails: it runs as one gang)."""
        for name, step in self.steps.items():
            code = step.poll()
            if code is None:
                continue
            if code == STOPPED_EXIT_CODE:  # its nodes were stopped on request (scancel --signal=TERM)
                self.stopping = True
            elif not self.stopping:
                self.fail(f"the {name} step ended with code {code}")
            return True
        return False

    def supervise(self) -> None:
        while not self.stopping and self.exit_code is None:
            if self.step_ended():
                return
            self.follow_entrypoint()
            time.sleep(0.5)

    def follow_entrypoint(self) -> None:
        """Submit the entrypoint (once); copy its driver's log out; when it ends, end the cluster
        with its exit code."""
        entrypoint, submission_id = self.config.get("entrypoint") or "", self.config["submission_id"]
        if not entrypoint:
            return
        if not self.job:
            command = f"cd {shlex.quote(str(self.cluster.job_dir))} && exec bash -c {shlex.quote(entrypoint)}"
            try:
                self.cluster.api("POST", "/api/jobs/", {"entrypoint": command, "submission_id": submission_id})
            except (OSError, ValueError) as exc:
                self.fail(f"the entrypoint could not be submitted: {exc}")
                return
            self.job = {"submission_id": submission_id, "status": "PENDING", "exit_code": None}
            log(f"submitted the entrypoint as Ray job {submission_id}")
            self.write_status()
        try:
            info = self.cluster.api("GET", f"/api/jobs/{submission_id}")
        except (OSError, ValueError):
            return
        self.copy_driver_log()
        status = str(info.get("status", ""))
        if status != self.job["status"]:
            self.job["status"] = status
            self.write_status()
        if status in _TERMINAL_JOB_STATES:
            self.copy_driver_log()
            code = info.get("driver_exit_code")
            code = (0 if status == "SUCCEEDED" else FAILED_EXIT_CODE) if code is None else int(code)
            code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
            self.job["exit_code"] = code
            log(f"the entrypoint ended: {status}, exit code {code}")
            self.exit_code = code

    def copy_driver_log(self) -> None:
        """Copy what the entrypoint's driver wrote since the last call to this program's output."""
        if self._driver_log is None:
            path = self.cluster.ray_dir / "head" / "session_latest" / "logs"
            path = path / f"job-driver-{self.config['submission_id']}.log"
            if not path.is_file():
                return
            self._driver_log = open(path, "rb")  # noqa: SIM115 (kept open while it grows)
        while chunk := self._driver_log.read(1 << 16):
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()

    def shutdown(self) -> None:
        """SIGTERM every task of the nodes' steps (``scancel --signal=TERM``, which leaves the batch
        step alone: srun itself would end its step at once on a signal), then after ``grace_s`` end
        the steps (SIGKILL to srun: Slurm kills what is left when the batch step ends)."""
        if self.phase != "failed":
            self.set_phase("stopping", "stopped on request" if self.stopping else "the entrypoint ended")
        if any(step.poll() is None for step in self.steps.values()):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(["scancel", "--signal=TERM", os.environ.get("SLURM_JOB_ID", "")], timeout=30)
        deadline = time.monotonic() + float(self.config["grace_s"])
        while any(step.poll() is None for step in self.steps.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for step in self.steps.values():
            if step.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    step.kill()
                step.wait()
        if self._driver_log is not None:
            self.copy_driver_log()
            self._driver_log.close()
        if self.exit_code is None:
            self.exit_code = STOPPED_EXIT_CODE
        if self.phase != "failed":
            self.phase = "exited"
        self.write_status()


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "batch":
        exit_as(Batch(Cluster(argv[2])).run())  # the batch job's exit status, as Slurm records it
    if len(argv) == 4 and argv[1] == "node" and argv[3] in ("head", "worker"):
        return run_node(Cluster(argv[2]), argv[3])
    print("usage: rayslurm.py batch <config.json> | node <config.json> head|worker", file=sys.stderr)
    return 2


def exit_as(code: int) -> NoReturn:
    """Exit with ``code``; a code of 129..192 (a shell's "killed by signal N": 128 + N) by that
    signal itself, as Slurm records an exit status past 128 as that status less 128 (143 as 15),
    and a signal as itself (``0:15``, which the backend reads as 143)."""
    if 128 < code <= 128 + 64:
        sys.stdout.flush()
        signal.signal(code - 128, signal.SIG_DFL)
        os.kill(os.getpid(), code - 128)
        time.sleep(5)  # a signal that does not end a process by default (SIGCHLD...): exit below
    sys.exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
