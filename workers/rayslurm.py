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

Standard library only; it runs on the Python of the environment that holds ``ray``, with what it
shares with the local backend's program beside it (workers/raynode.py, copied into the Ray
environment with it: ``slurm_ray.install_program()``). Usage:
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
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from workers import raynode
else:  # raynode.py lies beside this program, which python -I runs without its directory on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import raynode

_PR_SET_PDEATHSIG = 1
#: How long a node stopped with SIGTERM lets Ray drain it (its default, 30 s, is for Ray Serve's
#: rolling upgrades; here the whole cluster is going away). The spec's ``env`` may set another.
DRAIN_TIMEOUT_S = "2"
#: Where each node's short link to its Ray directory lies (not ``$TMPDIR``, which a cluster's
#: environment may set to a path too long for Ray's sockets).
LINK_PARENT = "/tmp"


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
        status = raynode.read_json(target.parent / "status.json") or {}
        if not target.is_dir() or status.get("phase") in ("exited", "failed"):
            shutil.rmtree(entry, ignore_errors=True)


def node_argv(cluster: Cluster, role: str, name: str, address: str, temp_dir: str) -> list[str]:
    """``ray start --block`` for the node ``name`` at ``address``, on ports free here; the head
    publishes its own (``head.json``), which a worker reads to join it."""
    shape = cluster.config["head" if role == "head" else "workers"]
    ray = str(Path(sys.executable).parent / "ray")
    argv = raynode.ray_start(ray, name=name, address=address, temp_dir=temp_dir, shape=shape)
    if role == "head":
        gcs, dashboard, client, agent = free_ports(4)
        argv += ["--head", f"--port={gcs}", "--include-dashboard=true", f"--ray-client-server-port={client}"]
        argv += [f"--dashboard-host={address}", f"--dashboard-port={dashboard}"]
        published = {"address": address, "gcs_port": gcs, "dashboard_port": dashboard, "client_port": client}
        raynode.write_json(
            cluster.ray_dir / "head.json", published | {"slurm_node": os.environ.get("SLURMD_NODENAME", "")}
        )
    else:
        (agent,) = free_ports(1)
        head = raynode.read_json(cluster.ray_dir / "head.json") or {}
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
    raynode.write_json(
        cluster.ray_dir / f"node-{name}.json", {"name": name, "slurm_node": slurm_node, "address": address}
    )
    env = raynode.node_env()
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", DRAIN_TIMEOUT_S)
    raynode.log(f"{name} on {slurm_node}: {shlex.join(argv[1:])}")
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
    raynode.log(f"{name} exited with code {code}" + (" (stopped on request)" if stopping else ""))
    if stopping:
        return raynode.STOPPED_EXIT_CODE
    return raynode.shell_code(code)


# -- the batch step --------------------------------------------------------------------------------


class Batch(raynode.Supervisor):
    """The batch step: starts the nodes' steps, says when the cluster is ready, runs the entrypoint."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster.config, cluster.ray_dir, cluster.config["submission_id"])
        self.cluster = cluster
        self.steps: dict[str, subprocess.Popen[bytes]] = {}

    def status(self) -> dict[str, Any]:
        """The status file (``raynode.Supervisor.status()``), with the Slurm job, the head's
        addresses and the nodes' names."""
        return super().status() | {
            "job_id": os.environ.get("SLURM_JOB_ID", ""),
            "head": self.head(),
            "nodes": ["head", *(f"worker-{i}" for i in range(self.config["workers"]["replicas"]))],
        }

    def head(self) -> dict[str, Any]:
        """What the head published of itself (``head.json``): its address and ports."""
        return raynode.read_json(self.cluster.ray_dir / "head.json") or {}

    def dashboard(self) -> str:
        head = self.head()
        return f"http://{head.get('address', '127.0.0.1')}:{head.get('dashboard_port', 0)}"

    def node_dirs(self) -> list[Path]:
        return [self.cluster.ray_dir / "head"]

    def entrypoint_command(self, entrypoint: str) -> str:
        """The entrypoint, run in the cluster's job directory."""
        return f"cd {shlex.quote(str(self.cluster.job_dir))} && exec {super().entrypoint_command(entrypoint)}"

    def alive_names(self) -> set[str]:
        """The nodes the dashboard lists as alive, by the name of their resource (``head``, ``worker-0``)."""
        return {str(node.get("node_name", "")) for node in self.alive_nodes() or []}

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
        secrets = raynode.read_json(Path(self.config["secrets"])) or {}
        os.environ.update({str(k): str(v) for k, v in secrets.items()})
        os.environ["RAY_AUTH_MODE"] = "token"
        return super().run()

    def run_cluster(self) -> None:
        if self.start():
            self.supervise()

    def start(self) -> bool:
        """The head, then the workers once the head's dashboard answers; True once every node joined."""
        deadline = time.monotonic() + float(self.config["start_timeout_s"])
        self.steps["head"] = self.srun("head")
        if not self.wait_for(lambda: "head" in self.alive_names(), deadline, "the head to answer"):
            return False
        if self.config["workers"]["replicas"]:
            self.steps["workers"] = self.srun("worker")
        expected = {"head", *(f"worker-{i}" for i in range(self.config["workers"]["replicas"]))}
        if not self.wait_for(lambda: expected <= self.alive_names(), deadline, "every node to join"):
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
            if code == raynode.STOPPED_EXIT_CODE:  # its nodes were stopped on request (scancel --signal=TERM)
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

    def stop_nodes(self) -> None:
        """SIGTERM every task of the nodes' steps (``scancel --signal=TERM``, which leaves the batch
        step alone: srun itself would end its step at once on a signal), then after ``grace_s`` end
        the steps (SIGKILL to srun: Slurm kills what is left when the batch step ends)."""
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
