"""What the two programs that run a Ray cluster's nodes share: workers/raypod.py (the local
backend's: every node on one machine, in one sandbox) and workers/rayslurm.py (the Slurm backend's:
a batch step that leads, and a program on each node).

``ray_start()`` and ``node_env()`` make a node's ``ray start --block`` and its environment alike on
both. ``Supervisor`` is the cluster as the program that leads it sees it: its phase, its status file
(``status.json``, ``version`` 1), the dashboard's HTTP API, and the entrypoint it runs as the
cluster's Ray job; each program says how it starts, watches and stops its nodes.

Standard library only, like the programs: it lies beside them wherever they run (bound read-only
into the local sandbox with raypod.py, copied into the Ray environment with rayslurm.py: see
workers/backends/raycluster.py and workers/backends/slurm_ray.py), and they import it from their own
directory.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO

STATUS_VERSION = 1
#: Exit codes of the cluster's program: stopped on request (SIGTERM), and a cluster that failed.
STOPPED_EXIT_CODE = 143
FAILED_EXIT_CODE = 1
#: The variables of a job's rendezvous (Slurm's and the local backend's), which mean nothing to a Ray node.
RENDEZVOUS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TERMINAL_JOB_STATES = ("SUCCEEDED", "FAILED", "STOPPED")
#: The program that runs (``raypod``, ``rayslurm``): its lines are marked with its name.
PROGRAM = Path(sys.argv[0]).stem


def log(message: str) -> None:
    print(f"{PROGRAM}: {message}", flush=True)


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


def shell_code(code: int) -> int:
    """An exit status as a shell reports it: a process killed by signal N as 128 + N."""
    return 128 - code if code < 0 else code


def ray_start(ray: str, *, name: str, address: str, temp_dir: str, shape: dict[str, Any]) -> list[str]:
    """``ray start --block`` for the node ``name`` at ``address``, with its ``--temp-dir``, the CPUs,
    GPUs, memory and object store of ``shape``, and a custom resource naming it (``{"worker-0": 1}``),
    so that work can be pinned to it; Ray picks its workers' ports. The caller adds the ports it
    fixes and how the node finds its cluster (``--head`` or ``--address``)."""
    argv = [ray, "start", "--block", f"--temp-dir={temp_dir}", f"--node-name={name}"]
    argv += [f"--node-ip-address={address}", "--disable-usage-stats", "--min-worker-port=0", "--max-worker-port=0"]
    argv += [f"--num-cpus={shape['num_cpus']}", f"--num-gpus={shape['num_gpus']}"]
    argv += [f"--memory={shape['memory_bytes']}", f"--object-store-memory={shape['object_store_bytes']}"]
    return [*argv, f"--resources={json.dumps({name: 1})}"]


def node_env(**extra: str) -> dict[str, str]:
    """A node's environment: this program's, less the rendezvous variables, with Ray's usage
    statistics off and ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0", **extra}


def nodes_of(answer: Any) -> list[dict[str, Any]]:
    """The node records of a State API answer (``{"data": {"result": {"result": [...]}}}``)."""
    data = answer.get("data", {}) if isinstance(answer, dict) else {}
    result = data.get("result", {}) if isinstance(data, dict) else {}
    nodes = result.get("result", []) if isinstance(result, dict) else []
    return [n for n in nodes if isinstance(n, dict)]


class Supervisor:
    """The cluster as the program that leads it sees it. ``run()`` catches the stopping signals, runs
    ``run_cluster()`` and then ``shutdown()``, and returns the program's exit code: the entrypoint's,
    ``FAILED_EXIT_CODE`` for a cluster that failed, ``STOPPED_EXIT_CODE`` for one stopped.

    A program overrides ``run_cluster()`` (start the nodes; once every node joined, ``set_phase("ready")``;
    then call ``follow_entrypoint()`` until ``exit_code`` is set or ``stopping``), ``stop_nodes()``,
    ``dashboard()`` (the dashboard's URL), ``node_dirs()`` (where a node's Ray session may hold the
    entrypoint's driver log) and, for what it adds to the status file, ``status()``."""

    def __init__(self, config: dict[str, Any], state_dir: Path, submission_id: str) -> None:
        self.config = config
        self.status_file = state_dir / "status.json"
        self.submission_id = submission_id
        self.phase = "starting"
        self.reason = ""
        self.ready_at: float | None = None
        self.exit_code: int | None = None
        self.job: dict[str, Any] = {}
        self.stopping = False
        self._driver_log: BinaryIO | None = None

    # -- what a program says -----------------------------------------------------------------

    def run_cluster(self) -> None:
        raise NotImplementedError

    def stop_nodes(self) -> None:
        raise NotImplementedError

    def dashboard(self) -> str:
        raise NotImplementedError

    def node_dirs(self) -> list[Path]:
        raise NotImplementedError

    def entrypoint_command(self, entrypoint: str) -> str:
        """The shell command of the entrypoint's Ray job."""
        return f"bash -c {shlex.quote(entrypoint)}"

    # -- the status file ---------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What the status file holds: the cluster's ``phase`` (``starting``, ``ready``, ``degraded``,
        ``failed``, ``stopping``, ``exited``), why (``reason``), when it first was ready, its
        entrypoint job and its exit code once it ended."""
        return {
            "version": STATUS_VERSION,
            "phase": self.phase,
            "reason": self.reason,
            "updated_at": time.time(),
            "ready_at": self.ready_at,
            "entrypoint": self.job or None,
            "exit_code": self.exit_code,
        }

    def write_status(self) -> None:
        write_json(self.status_file, self.status())

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

    # -- the dashboard -----------------------------------------------------------------------

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A call to the dashboard's HTTP API, with the cluster's token (``RAY_AUTH_TOKEN``)."""
        request = urllib.request.Request(
            self.dashboard() + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {os.environ.get('RAY_AUTH_TOKEN', '')}",
                     "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def alive_nodes(self) -> list[dict[str, Any]] | None:
        """The records of the nodes the dashboard lists as alive; None where it did not answer."""
        try:
            answer = self.api("GET", "/api/v0/nodes?limit=10000&detail=false")
        except (OSError, ValueError):
            return None
        return [node for node in nodes_of(answer) if node.get("state") == "ALIVE"]

    # -- the entrypoint ----------------------------------------------------------------------

    def follow_entrypoint(self) -> None:
        """Submit the entrypoint once the cluster is first ready; copy its driver log out; when it
        ends, end the cluster with its exit code."""
        entrypoint = self.config.get("entrypoint") or ""
        if not entrypoint or self.ready_at is None:
            return
        if not self.job:
            body = {"entrypoint": self.entrypoint_command(entrypoint), "submission_id": self.submission_id}
            try:
                self.api("POST", "/api/jobs/", body)
            except (OSError, ValueError) as exc:
                self.fail(f"the entrypoint could not be submitted: {exc}")
                return
            self.job = {"submission_id": self.submission_id, "status": "PENDING", "exit_code": None}
            log(f"submitted the entrypoint as Ray job {self.submission_id}")
            self.write_status()
        try:
            info = self.api("GET", f"/api/jobs/{self.submission_id}")
        except (OSError, ValueError):
            return
        self.copy_driver_log()
        status = str(info.get("status", ""))
        if status != self.job["status"]:
            self.job["status"] = status
            self.write_status()
        if status in TERMINAL_JOB_STATES:
            self.copy_driver_log()
            code = info.get("driver_exit_code")
            code = (0 if status == "SUCCEEDED" else FAILED_EXIT_CODE) if code is None else shell_code(int(code))
            self.job["exit_code"] = code
            log(f"the entrypoint ended: {status}, exit code {code}")
            self.exit_code = code

    def copy_driver_log(self) -> None:
        """Copy what the entrypoint's driver wrote since the last call to this program's output."""
        if self._driver_log is None:
            name = f"job-driver-{self.submission_id}.log"
            for node_dir in self.node_dirs():
                path = node_dir / "session_latest" / "logs" / name
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
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self.write_status()
        try:
            self.run_cluster()
        finally:
            self.shutdown()
        return STOPPED_EXIT_CODE if self.exit_code is None else self.exit_code

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def shutdown(self) -> None:
        """Stop the nodes (``stop_nodes()``), copy the rest of the entrypoint's log out, and write the
        status file a last time: ``exited``, or ``failed``."""
        if self.phase != "failed":
            ended = "the entrypoint ended" if self.job.get("exit_code") is not None else self.reason
            self.set_phase("stopping", "stopped on request" if self.stopping else ended)
        self.stop_nodes()
        if self._driver_log is not None:
            self.copy_driver_log()
            self._driver_log.close()
        if self.exit_code is None:
            self.exit_code = STOPPED_EXIT_CODE
        if self.phase != "failed":
            self.phase = "exited"
        self.write_status()
