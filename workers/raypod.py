"""The supervisor of a Ray cluster on one machine: run inside the cluster's sandbox, as its command.

The local backend runs a whole Ray cluster as one sandboxed process (workers/backends/raycluster.py):
this program. It starts the head (``ray start --head --block``) and then each worker
(``ray start --address=127.0.0.1:<gcs> --block``), each node in its own process group with its
own ``--temp-dir``, its own GPUs (``CUDA_VISIBLE_DEVICES``), CPUs, memory and a custom resource
naming it (``{"worker-0": 1}``), so that work can be pinned to a node. The sandbox has a network of
its own with only loopback: every port Ray opens is out of reach of every other process on the
machine. The one way in is a Unix socket (``socket`` in the configuration, in a directory the
portal's proxy reaches) that this program forwards to the dashboard's ``127.0.0.1:8265``: the
dashboard and the Jobs API, which want the cluster's token (``RAY_AUTH_TOKEN``, in the
environment only).

It supervises the nodes and writes what it sees to ``<state_dir>/status.json`` (atomically, see
``Pod.status()``): a worker that dies makes the cluster ``degraded`` and is started again, up to
``max_restarts`` times, after which the cluster ``failed``; a dead head fails it at once. A failed
cluster ends. With an ``entrypoint``, once every node joined it is submitted as the cluster's Ray
job (the Jobs API); its driver log is copied to this program's output, and when it ends the whole
cluster ends with its exit code. On SIGTERM every node's group gets SIGTERM, then SIGKILL after
``grace_s``, and the nodes' temporary directories are removed. ``ray stop`` is never called: it
stops every Ray process on the machine.

Standard library only (it runs on the Python of the environment that holds ``ray``); it is given
one argument, its configuration as JSON (built by workers/backends/raycluster.py: ``pod_config()``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO

STATUS_VERSION = 1
#: Exit codes of the pod itself: stopped on request (SIGTERM), and a cluster that failed.
STOPPED_EXIT_CODE = 143
FAILED_EXIT_CODE = 1
#: The variables of a job's rendezvous, which mean nothing to a Ray node.
_RENDEZVOUS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_TERMINAL_JOB_STATES = ("SUCCEEDED", "FAILED", "STOPPED")
_SUBMISSION_ID = "portal-entrypoint"


def log(message: str) -> None:
    print(f"raypod: {message}", flush=True)


class Node:
    """One ``ray start --block`` process and what the pod knows of it."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.node_id = ""  # its registration in the cluster, once it joined
        self.stale_ids: set[str] = set()  # registrations of its earlier runs, maybe not yet marked dead
        self.exit_code: int | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "name": self.name,
            "role": spec["role"],
            "index": spec["index"],
            "resource": self.name,
            "pid": self.proc.pid if self.proc else None,
            "alive": self.alive,
            "joined": bool(self.node_id) and self.alive,
            "node_id": self.node_id,
            "restarts": self.restarts,
            "exit_code": self.exit_code,
            "devices": spec["devices"],
            "num_gpus": spec["num_gpus"],
            "num_cpus": spec["num_cpus"],
            "memory_bytes": spec["memory_bytes"],
        }


class Forwarder:
    """Accepts connections on a Unix socket and relays each, byte for byte, to a TCP port on
    loopback (HTTP and WebSocket alike)."""

    def __init__(self, path: str, port: int) -> None:
        self.path, self.port = path, port
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self.listener.listen(64)
        threading.Thread(target=self._accept, name="forwarder", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        client.close()
        upstream.close()


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            target.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


class Pod:
    """The cluster: its nodes, its status file, its entrypoint job."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.nodes = [Node(spec) for spec in config["nodes"]]
        self.state_dir = Path(config["state_dir"])
        self.token = os.environ.get("RAY_AUTH_TOKEN", "")
        self.phase = "starting"
        self.reason = ""
        self.ready_at: float | None = None
        self.exit_code: int | None = None
        self.job: dict[str, Any] = {}
        self.stopping = False
        self._driver_log: BinaryIO | None = None

    # -- the status file ----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What the status file holds (``version`` 1): the cluster's ``phase`` (``starting``,
        ``ready``, ``degraded``, ``failed``, ``stopping``, ``exited``), why (``reason``), when it first
        was ready, its entrypoint job, its exit code once it ended, and each node."""
        return {
            "version": STATUS_VERSION,
            "phase": self.phase,
            "reason": self.reason,
            "updated_at": time.time(),
            "ready_at": self.ready_at,
            "gcs_address": f"127.0.0.1:{self.config['gcs_port']}",
            "dashboard_port": self.config["dashboard_port"],
            "entrypoint": self.job or None,
            "exit_code": self.exit_code,
            "nodes": [node.to_json() for node in self.nodes],
        }

    def write_status(self) -> None:
        partial = self.state_dir / f".status.json.{os.getpid()}"
        partial.write_text(json.dumps(self.status(), indent=1))
        os.replace(partial, self.state_dir / "status.json")

    def set_phase(self, phase: str, reason: str = "") -> None:
        if (phase, reason) != (self.phase, self.reason):
            log(f"cluster {phase}" + (f": {reason}" if reason else ""))
        self.phase, self.reason = phase, reason
        if phase == "ready" and self.ready_at is None:
            self.ready_at = time.time()
        self.write_status()

    # -- nodes --------------------------------------------------------------------------------

    def temp_link(self, node: Node) -> str:
        """The node's ``--temp-dir``: a short link in the sandbox's private /tmp to its directory
        under the cluster's (Ray's socket paths under it must fit a Unix socket's 107 bytes)."""
        return f"/tmp/ray-{node.name}"

    def temp_dir(self, node: Node) -> Path:
        return self.state_dir / node.name

    def start_node(self, node: Node) -> None:
        config, spec = self.config, node.spec
        target, link = self.temp_dir(node), self.temp_link(node)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(mode=0o700, parents=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(link)
        os.symlink(target, link)
        argv = [config["ray"], "start", "--block", f"--temp-dir={link}", f"--node-name={node.name}"]
        argv += ["--node-ip-address=127.0.0.1", "--disable-usage-stats", "--min-worker-port=0", "--max-worker-port=0"]
        argv += [f"--num-cpus={spec['num_cpus']}", f"--num-gpus={spec['num_gpus']}"]
        argv += [f"--memory={spec['memory_bytes']}", f"--object-store-memory={spec['object_store_bytes']}"]
        argv += [f"--resources={json.dumps({node.name: 1})}"]
        argv += [f"--dashboard-agent-listen-port={config['agent_port_base'] + spec['slot']}"]
        if spec["role"] == "head":
            argv += ["--head", f"--port={config['gcs_port']}", "--include-dashboard=true"]
            argv += ["--dashboard-host=127.0.0.1", f"--dashboard-port={config['dashboard_port']}"]
        else:
            argv += [f"--address=127.0.0.1:{config['gcs_port']}"]
        env = {k: v for k, v in os.environ.items() if k not in _RENDEZVOUS}
        env.update(CUDA_VISIBLE_DEVICES=",".join(spec["devices"]), RAY_USAGE_STATS_ENABLED="0")
        node.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: signalled as one, apart from the others
        )  # fmt: skip
        node.exit_code, node.node_id = None, ""
        threading.Thread(target=_prefix_lines, args=(node.proc.stdout, node.name), daemon=True).start()
        log(f"started {node.name} (pid {node.proc.pid}): {shlex.join(argv[1:])}")

    def kill_node(self, node: Node, grace_s: float) -> None:
        """SIGTERM the node's process group, SIGKILL it after ``grace_s``; return once it is empty."""
        if node.proc is None:
            return
        pgid = node.proc.pid
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            if _wait_group_gone(node.proc, pgid, wait_s):
                break
        node.proc.poll()

    # -- supervision --------------------------------------------------------------------------

    def check_nodes(self) -> None:
        """Act on nodes that ended: a head fails the cluster; a worker is started again while it
        has restarts left, else it fails the cluster."""
        for node in self.nodes:
            if node.proc is None or node.alive:
                continue
            if node.exit_code is None:
                code = node.proc.returncode
                node.exit_code = 128 - code if code < 0 else code  # killed by a signal: as a shell says it
                log(f"{node.name} exited with code {node.exit_code}")
            if node.spec["role"] == "head":
                self.fail(f"the head node exited with code {node.exit_code}")
                return
            if node.restarts >= self.config["max_restarts"]:
                self.fail(f"{node.name} exited {node.restarts + 1} times")
                return
            if node.node_id:
                node.stale_ids.add(node.node_id)
            self.kill_node(node, 0.0)  # what is left of its group, which holds its ports
            node.restarts += 1
            self.set_phase("degraded", f"{node.name} exited with code {node.exit_code}; restarting it")
            self.start_node(node)

    def check_joined(self) -> None:
        """Ask the dashboard which nodes are alive; a node joined once a registration of its
        current run (not one of its earlier runs) carries its resource."""
        try:
            answer = self.api("GET", "/api/v0/nodes?limit=10000&detail=false")
        except (OSError, ValueError):
            return
        alive = [n for n in _nodes_of(answer) if n.get("state") == "ALIVE"]
        for node in self.nodes:
            if not node.alive:
                continue
            ids = [n.get("node_id", "") for n in alive if node.name in (n.get("resources_total") or {})]
            fresh = [i for i in ids if i and i not in node.stale_ids]
            node.node_id = fresh[0] if fresh else ""
        if all(node.alive and node.node_id for node in self.nodes):
            if self.phase in ("starting", "degraded"):
                self.set_phase("ready")
        elif self.phase == "ready":
            self.set_phase("degraded", "a node left the cluster")

    def fail(self, reason: str) -> None:
        self.set_phase("failed", reason)
        self.exit_code = FAILED_EXIT_CODE

    # -- the dashboard ------------------------------------------------------------------------

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A call to the dashboard's HTTP API on loopback, with the cluster's token."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.config['dashboard_port']}{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    # -- the entrypoint -----------------------------------------------------------------------

    def follow_entrypoint(self) -> None:
        """Submit the entrypoint once the cluster is first ready; copy its driver log out; when it
        ends, end the cluster with its exit code."""
        entrypoint = self.config.get("entrypoint") or ""
        if not entrypoint or self.ready_at is None:
            return
        if not self.job:
            body = {"entrypoint": f"bash -c {shlex.quote(entrypoint)}", "submission_id": _SUBMISSION_ID}
            try:
                self.api("POST", "/api/jobs/", body)
            except (OSError, ValueError) as exc:
                self.fail(f"the entrypoint could not be submitted: {exc}")
                return
            self.job = {"submission_id": _SUBMISSION_ID, "status": "PENDING", "exit_code": None}
            log(f"submitted the entrypoint as Ray job {_SUBMISSION_ID}")
        try:
            info = self.api("GET", f"/api/jobs/{_SUBMISSION_ID}")
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
            log(f"the entrypoint job ended: {status}, exit code {code}")
            self.exit_code = code

    def copy_driver_log(self) -> None:
        """Copy what the entrypoint's driver wrote since the last call to this program's output."""
        if self._driver_log is None:
            name = f"job-driver-{_SUBMISSION_ID}.log"
            for node in self.nodes:
                path = self.temp_dir(node) / "session_latest" / "logs" / name
                if path.is_file():
                    self._driver_log = open(path, "rb")  # noqa: SIM115 (kept open while it grows)
                    break
            else:
                return
        while chunk := self._driver_log.read(1 << 16):
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()

    # -- the whole ---------------------------------------------------------------------------

    def run(self) -> int:
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self.write_status()
        try:
            Forwarder(self.config["socket"], self.config["dashboard_port"]).start()
            self.start_cluster()
            self.supervise()
        finally:
            self.shutdown()
        return STOPPED_EXIT_CODE if self.exit_code is None else self.exit_code

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def start_cluster(self) -> None:
        """The head, and the workers once its GCS answers."""
        head, workers = self.nodes[0], self.nodes[1:]
        self.start_node(head)
        deadline = time.monotonic() + self.config["start_timeout_s"]
        while not self.stopping and not _port_open(self.config["gcs_port"]):
            if not head.alive or time.monotonic() > deadline:
                return  # supervise() says why
            time.sleep(0.2)
        for node in workers:
            if not self.stopping:
                self.start_node(node)

    def supervise(self) -> None:
        deadline = time.monotonic() + self.config["start_timeout_s"]
        while not self.stopping and self.exit_code is None:
            self.check_nodes()
            if self.exit_code is not None:
                break
            self.check_joined()
            if self.ready_at is None and time.monotonic() > deadline:
                self.fail(f"not every node joined within {self.config['start_timeout_s']:g}s")
                break
            self.follow_entrypoint()
            time.sleep(0.5)

    def shutdown(self) -> None:
        """Stop every node (workers first, then the head) and remove their temporary directories."""
        if self.phase != "failed":
            self.set_phase("stopping", "stopped on request" if self.stopping else self.reason)
        grace_s = float(self.config["grace_s"])
        threads = [threading.Thread(target=self.kill_node, args=(n, grace_s)) for n in self.nodes[1:]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.kill_node(self.nodes[0], grace_s)
        if self._driver_log is not None:
            self.copy_driver_log()
            self._driver_log.close()
        for node in self.nodes:
            shutil.rmtree(self.temp_dir(node), ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(self.temp_link(node))
        with contextlib.suppress(OSError):
            os.unlink(self.config["socket"])
        if self.exit_code is None:
            self.exit_code = STOPPED_EXIT_CODE
        if self.phase != "failed":
            self.phase = "exited"
        self.write_status()


def _prefix_lines(stream: BinaryIO, name: str) -> None:
    """Copy a node's own output (``ray start``'s) to this program's, each line marked with the node."""
    prefix = f"[{name}] ".encode()
    for line in stream:
        sys.stdout.buffer.write(prefix + line)
        sys.stdout.buffer.flush()


def _nodes_of(answer: Any) -> list[dict[str, Any]]:
    """The node records of a State API answer (``{"data": {"result": {"result": [...]}}}``)."""
    data = answer.get("data", {}) if isinstance(answer, dict) else {}
    result = data.get("result", {}) if isinstance(data, dict) else {}
    nodes = result.get("result", []) if isinstance(result, dict) else []
    return [n for n in nodes if isinstance(n, dict)]


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _wait_group_gone(leader: subprocess.Popen[bytes], pgid: int, timeout_s: float) -> bool:
    """Wait until no process is left in the group ``pgid`` (its leader reaped); False at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        leader.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: raypod.py <configuration as JSON>", file=sys.stderr)
        return 2
    return Pod(json.loads(argv[1])).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
