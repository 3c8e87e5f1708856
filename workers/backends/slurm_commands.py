"""Slurm's command line, for the Slurm backend: running its tools and reading what they print.

Every command goes through :func:`run_command` (BatchSpawner's one place): no shell, a timeout, and
Slurm's errors turned into ``BackendError`` / ``PolicyRefusal`` by what Slurm said. The rest are
pure functions over the text ``squeue``, ``sacct`` and ``scontrol`` print.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Literal

from workers.backends.base import (
    STOPPED_EXIT_CODE,
    TIMEOUT_EXIT_CODE,
    UNKNOWN_EXIT_CODE,
    BackendError,
    GpuInfo,
    NodeInfo,
    PolicyRefusal,
    RunAs,
    Status,
)

COMMAND_TIMEOUT_S = 20.0

#: States in which the job (or its teardown) may still have processes.
LIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)

# Slurm's refusals that retrying cannot fix. The first group is about what the user asked for
# (more GPUs or nodes than exist, a limit of their account): they can change the request.
_POLICY_ERRORS = (
    "Requested node configuration is not available",
    "Node count specification invalid",
    "Requested time limit is invalid",
    "Job violates accounting/QOS policy",
    "Memory required by task is not available",
    "More processors requested than permitted",
)
# ... and the second is about how the backend or cluster is set up: fail the workload.
_PERMANENT_ERRORS = (
    "Invalid generic resource",
    "Invalid partition name",
    "Invalid account",
    "Invalid qos",
    "Unable to open file",
    "unrecognized option",
    "invalid option",
    "Requested reservation is invalid",  # a job's reservation that Slurm does not have (or no longer)
    "Access denied to requested reservation",  # ... that is not its account's
)


def run_command(argv: list[str], timeout: float = COMMAND_TIMEOUT_S, env: dict[str, str] | None = None) -> str:
    """Run ``argv`` (no shell) and return its stdout; ``env`` replaces the worker's environment.

    A timeout or a non-zero exit raises ``BackendError`` (transient), except when the error text
    is a refusal that retrying cannot change: ``PolicyRefusal`` for a request the user can fix,
    ``BackendError(permanent=True)`` for a configuration problem. A missing executable is
    permanent too.
    """
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        raise BackendError(f"{argv[0]} timed out after {timeout:g}s", permanent=False) from exc
    except OSError as exc:
        raise BackendError(f"could not run {argv[0]}: {exc}", permanent=True) from exc
    if proc.returncode == 0:
        return proc.stdout
    error = (proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}")[-2000:]
    message = f"{os.path.basename(argv[0])} failed: {error}"
    if any(text in error for text in _POLICY_ERRORS):
        raise PolicyRefusal(f"Slurm refused the job: {error.removeprefix('sbatch: error: ')}")
    permanent = any(text.lower() in error.lower() for text in _PERMANENT_ERRORS)
    raise BackendError(message, permanent=permanent)


def master_port(job_id: str) -> int:
    """The rendezvous port of a job: 20000..39999, the same formula as in the batch script."""
    return 20000 + int(job_id) % 20000


def parse_exit(state: str, exit_code: str, stopped: bool = False) -> Status:
    """Turn sacct's ``State`` (``CANCELLED by 0``) and ``ExitCode`` (``code:signal``) into a Status."""
    word = state.split()[0] if state.strip() else "UNKNOWN"
    code_s, _, signal_s = exit_code.partition(":")
    code = int(code_s) if code_s.isdigit() else 0
    sig = int(signal_s) if signal_s.isdigit() else 0
    if code == 0 and sig:
        code = 128 + sig
    if stopped:
        return Status("exited", code or STOPPED_EXIT_CODE, "stopped on request")
    if word == "COMPLETED":
        return Status("exited", code, "exited" if code == 0 else f"exited with code {code}")
    if word == "TIMEOUT":
        return Status("exited", TIMEOUT_EXIT_CODE, "killed by Slurm after exceeding its time limit")
    if word == "CANCELLED":
        return Status("exited", code or STOPPED_EXIT_CODE, f"cancelled in Slurm ({state.strip()})")
    if word == "OUT_OF_MEMORY":
        return Status("exited", code or 137, "killed by Slurm for exceeding its memory limit")
    if word == "NODE_FAIL":
        return Status("exited", code or UNKNOWN_EXIT_CODE, "a node of the job failed")
    return Status("exited", code or UNKNOWN_EXIT_CODE, f"{word.lower()} with exit code {code or UNKNOWN_EXIT_CODE}")


# Node states (``scontrol show node``'s State=, e.g. ``IDLE+DRAIN``, ``DOWN*``) that keep work off a node.
_DOWN_STATES = frozenset({"DOWN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "FUTURE",
                          "UNKNOWN"})  # fmt: skip
_DRAINED_STATES = frozenset({"DRAIN", "DRAINED", "DRAINING", "FAILING", "MAINTENANCE", "REBOOT_REQUESTED",
                             "REBOOT_ISSUED"})  # fmt: skip


def parse_scontrol_nodes(out: str) -> list[dict[str, str]]:
    """Every node of ``scontrol show node -o`` (one line per node), as its ``Key=Value`` fields."""
    nodes = []
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("NodeName"):
            nodes.append(fields)
    return nodes


def node_partitions(fields: dict[str, str]) -> list[str]:
    """The partitions a node of :func:`parse_scontrol_nodes` is in."""
    return [p for p in fields.get("Partitions", "").split(",") if p and p != "(null)"]


def node_state(state: str) -> Literal["ready", "drained", "down"]:
    """'IDLE' -> ready; 'MIXED+DRAIN' -> drained; 'DOWN*', 'IDLE*' (not responding) -> down."""
    flags = set(state.upper().replace("*", "+NOT_RESPONDING").split("+"))
    if flags & _DOWN_STATES:
        return "down"
    if flags & _DRAINED_STATES:
        return "drained"
    return "ready"


def node_info(fields: dict[str, str], pool: str) -> NodeInfo:
    """A node of :func:`parse_scontrol_nodes`: CPUs (``CPUTot``), memory (``RealMemory``, MB), state."""
    cpus, memory_mb = fields.get("CPUTot", "0"), fields.get("RealMemory", "0")
    return NodeInfo(
        name=fields["NodeName"],
        cpu_cores=int(cpus) if cpus.isdigit() else 0,
        memory_mb=int(memory_mb) if memory_mb.isdigit() else 0,
        state=node_state(fields.get("State", "UNKNOWN")),
        pool=pool,
    )


def node_gpus(nodes: list[dict[str, str]]) -> list[GpuInfo]:
    """The GPUs of nodes of :func:`parse_scontrol_nodes`: one ``GpuInfo`` per GRES gpu, index ``<node>:<i>``,
    named by the GRES type (``gpu:h100:4``: four ``h100``)."""
    gpus: list[GpuInfo] = []
    for fields in nodes:
        for gres in fields.get("Gres", "").split(","):
            gres = re.sub(r"\(.*\)$", "", gres)  # gpu:h100:4(S:0-1)
            parts = gres.split(":")
            if parts[0] != "gpu" or not parts[-1].isdigit():
                continue
            kind = parts[1] if len(parts) == 3 else "gpu"
            node = fields["NodeName"]
            gpus.extend(GpuInfo(index=f"{node}:{i}", name=kind, memory_mb=0) for i in range(int(parts[-1])))
    return sorted(gpus, key=lambda g: (_natural(g.index.split(":")[0]), int(g.index.split(":")[1])))


def _natural(name: str) -> tuple[str, int]:
    match = re.match(r"^(.*?)(\d*)$", name)
    assert match is not None
    return match.group(1), int(match.group(2) or 0)


def leader_id(listed: str) -> str:
    """The job id in squeue's or sacct's ``JobID`` column: ``123``, or ``123+1`` (a component of the
    heterogeneous job 123); '' for anything else (a step, a job array's task)."""
    match = re.fullmatch(r"(\d+)(?:\+\d+)?", listed.strip())
    return match.group(1) if match else ""


def slurm_time(text: str) -> float | None:
    """A Slurm timestamp (``2026-11-24T11:27:41``, local time) as seconds since the epoch."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def user_env() -> dict[str, str]:
    """The environment of a Slurm command run as a workspace's account: only what Slurm's tools need."""
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "SLURM_CONF")
    return {k: os.environ[k] for k in keep if k in os.environ} | {"HOME": "/nonexistent"}


def as_user(run_as: RunAs | None) -> list[str]:
    """The prefix that runs a Slurm command as the workspace's account (``sbatch`` submits as
    whoever runs it: the job then runs as that account on every node)."""
    if run_as is None:
        return []
    return ["setpriv", f"--reuid={run_as.uid}", f"--regid={run_as.gid}", "--clear-groups", "--"]
