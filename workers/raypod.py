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

Standard library only (it runs on the Python of the environment that holds ``ray``), with what it
shares with the Slurm backend's program beside it (workers/raynode.py, bound into the sandbox with
it: ``raycluster.POD_FILES``); it is given one argument, its configuration as JSON (built by
workers/backends/raycluster.py: ``pod_config()``).
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
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from workers import raynode
else:  # raynode.py lies beside this program, which python -I runs without its directory on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import raynode

_SUBMISSION_ID = "portal-entrypoint"


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


class Pod(raynode.Supervisor):
    """The cluster: its nodes, its status file, its entrypoint job."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.nodes = [Node(spec) for spec in config["nodes"]]
        self.state_dir = Path(config["state_dir"])
        super().__init__(config, self.state_dir, _SUBMISSION_ID)

    def status(self) -> dict[str, Any]:
        """The status file (``raynode.Supervisor.status()``), with the cluster's addresses on its
        loopback and each node."""
        return super().status() | {
            "gcs_address": f"127.0.0.1:{self.config['gcs_port']}",
            "dashboard_port": self.config["dashboard_port"],
            "nodes": [node.to_json() for node in self.nodes],
        }

    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.config['dashboard_port']}"

    def node_dirs(self) -> list[Path]:
        return [self.temp_dir(node) for node in self.nodes]

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
        argv = raynode.ray_start(config["ray"], name=node.name, address="127.0.0.1", temp_dir=link, shape=spec)
        argv += [f"--dashboard-agent-listen-port={config['agent_port_base'] + spec['slot']}"]
        if spec["role"] == "head":
            argv += ["--head", f"--port={config['gcs_port']}", "--include-dashboard=true"]
            argv += ["--dashboard-host=127.0.0.1", f"--dashboard-port={config['dashboard_port']}"]
        else:
            argv += [f"--address=127.0.0.1:{config['gcs_port']}"]
        env = raynode.node_env(CUDA_VISIBLE_DEVICES=",".join(spec["devices"]))
        node.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: signalled as one, apart from the others
        )  # fmt: skip
        node.exit_code, node.node_id = None, ""
        threading.Thread(target=_prefix_lines, args=(node.proc.stdout, node.name), daemon=True).start()
        raynode.log(f"started {node.name} (pid {node.proc.pid}): {shlex.join(argv[1:])}")

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
                node.exit_code = raynode.shell_code(node.proc.returncode)
                raynode.log(f"{node.name} exited with code {node.exit_code}")
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
        alive = self.alive_nodes()
        if alive is None:
            return
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

    # -- the whole ---------------------------------------------------------------------------

    def run(self) -> int:
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return super().run()

    def run_cluster(self) -> None:
        Forwarder(self.config["socket"], self.config["dashboard_port"]).start()
        self.start_cluster()
        self.supervise()

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

    def stop_nodes(self) -> None:
        """Stop every node (workers first, then the head) and remove their temporary directories
        and the socket."""
        grace_s = float(self.config["grace_s"])
        threads = [threading.Thread(target=self.kill_node, args=(n, grace_s)) for n in self.nodes[1:]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.kill_node(self.nodes[0], grace_s)
        for node in self.nodes:
            shutil.rmtree(self.temp_dir(node), ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(self.temp_link(node))
        with contextlib.suppress(OSError):
            os.unlink(self.config["socket"])


def _prefix_lines(stream: BinaryIO, name: str) -> None:
    """Copy a node's own output (``ray start``'s) to this program's, each line marked with the node."""
    prefix = f"[{name}] ".encode()
    for line in stream:
        sys.stdout.buffer.write(prefix + line)
        sys.stdout.buffer.flush()


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
