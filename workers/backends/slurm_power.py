"""Slurm's power saving, for elastic node pools: the portal powers a Slurm cluster's nodes up when
pending work does not fit and down when they stay empty, through Slurm's own mechanism. Slurm runs
its ``ResumeProgram`` / ``SuspendProgram`` (deploy/slurm-power.sh on the development cluster) and
tracks each node's power in its state, so Slurm never places work on a node it knows is off.

A node's ``State`` in ``scontrol show node -o`` is a base state and flags joined by ``+``, as seen on
Slurm 22.05: ``IDLE+POWERED_DOWN`` (off), ``IDLE+POWER_UP+POWERED_DOWN`` (power-up asked for),
``IDLE+NOT_RESPONDING+POWERING_UP`` (booting), ``IDLE`` / ``MIXED`` / ``ALLOCATED`` (up),
``IDLE+POWER_DOWN`` (power-down asked for), ``IDLE+POWERING_DOWN`` (shutting down, for
SuspendTimeout), ``MIXED+POWERED_DOWN`` (off, allocated to a job Slurm is about to power it up for),
``DOWN+POWERED_DOWN+NOT_RESPONDING`` with reason ``ResumeTimeout reached`` (a power-up that failed:
the node did not register within ResumeTimeout). :func:`node_power` reads these as a
:class:`NodePower`.

The portal's order of calls: to grow, :func:`power_up` then wait until ``powered == "up"`` (then
submit: the job starts at once); to shrink, :func:`drain` (no new work), wait until ``busy`` is
false, :func:`power_down`, then :func:`resume` once ``powered == "down"`` (so that the node may be
powered up again, by the portal or by Slurm for a job that needs it). A failed node is brought back
with :func:`resume` (Slurm then counts it powered down) and a new :func:`power_up`.

Each function runs ``scontrol`` through :func:`run_command` (no shell, a timeout) and raises
``BackendError``: permanent where Slurm refused what was asked (an unknown node, powering down a
node that runs jobs), transient where Slurm did not answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from workers.backends.base import BackendError, PolicyRefusal
from workers.backends.slurm_commands import COMMAND_TIMEOUT_S, parse_scontrol_nodes, run_command

PowerState = Literal["up", "down", "powering_up", "powering_down", "failed"]

#: The drain reason :func:`drain` sets when none is given.
DRAIN_REASON = "gpuportal: powering down"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# What scontrol says, to stderr with exit status 1, for a node it does not have.
_NOT_FOUND = ("Invalid node name", "not found")
# State flags (after the base state) that mean the node is on its way up or down.
_POWERING_UP = frozenset({"POWER_UP", "POWERING_UP"})
_POWERING_DOWN = frozenset({"POWER_DOWN", "POWERING_DOWN", "POWER_DOWN_ASAP", "POWER_DOWN_FORCE"})
# Base states and flags of a node that jobs run on (or are being cleaned up from).
_BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
_DRAINED = frozenset({"DRAIN", "DRAINED", "DRAINING"})


@dataclass(frozen=True)
class NodePower:
    """A node's power as Slurm reports it.

    ``powered``: ``up``, ``down`` (powered down), ``powering_up`` (asked for or booting),
    ``powering_down`` (asked for or shutting down), ``failed`` (DOWN or FAIL: a power-up that did
    not come up within ResumeTimeout, or a node that stopped responding). ``busy``: jobs are
    allocated on it (``ALLOCATED``, ``MIXED``, ``COMPLETING``; also while Slurm powers it up for a
    job). ``drained``: Slurm starts no new job on it. ``reason``: Slurm's reason for a down or
    drained node ('' for none). ``state``: Slurm's ``State`` as printed."""

    name: str
    state: str
    powered: PowerState
    busy: bool
    drained: bool
    reason: str


def parse_node_power(name: str, state: str, reason: str = "") -> NodePower:
    """A node's :class:`NodePower` from its ``State`` (``IDLE+POWERED_DOWN``, ``DOWN*``...)."""
    words = state.upper().replace("*", "+NOT_RESPONDING").split("+")
    base, flags = words[0], set(words[1:])
    powered: PowerState
    if base in {"DOWN", "FAIL"} or "FAIL" in flags:
        powered = "failed"
    elif flags & _POWERING_UP:
        powered = "powering_up"
    elif flags & _POWERING_DOWN:
        powered = "powering_down"
    elif "POWERED_DOWN" in flags:
        powered = "down"
    else:
        powered = "up"
    busy = base in _BUSY or "COMPLETING" in flags
    return NodePower(name, state, powered, busy, bool(flags & _DRAINED), reason)


def node_power(
    nodes: Sequence[str] | None = None, *, scontrol_path: str = "scontrol", timeout: float = COMMAND_TIMEOUT_S
) -> dict[str, NodePower]:
    """The power of ``nodes`` (every node of the cluster where ``None``), by node name.
    ``BackendError`` (permanent) naming any of ``nodes`` that Slurm does not have."""
    wanted = _check_nodes(nodes) if nodes is not None else None
    out = _scontrol([scontrol_path, "show", "node", "-o"], "list nodes", timeout)
    found = {}
    for line in out.splitlines():
        fields = parse_scontrol_nodes(line)
        if not fields:
            continue
        name = fields[0]["NodeName"]
        if wanted is None or name in wanted:
            found[name] = parse_node_power(name, fields[0].get("State", "UNKNOWN"), _reason(line))
    missing = [node for node in wanted or () if node not in found]
    if missing:
        raise BackendError(f"Slurm has no node {', '.join(missing)}", permanent=True)
    return found


def power_up(nodes: Sequence[str], *, scontrol_path: str = "scontrol", timeout: float = COMMAND_TIMEOUT_S) -> None:
    """Ask Slurm to power ``nodes`` up (``State=POWER_UP``): it runs its ResumeProgram and has each
    node ``up`` once its slurmd registers, or ``failed`` after ResumeTimeout. Nodes already up or on
    their way up are left alone, so calling it again is harmless. A drained node comes up drained:
    :func:`resume` it for work to start there."""
    todo = [p.name for p in node_power(nodes, scontrol_path=scontrol_path, timeout=timeout).values()
            if p.powered in {"down", "powering_down"}]  # fmt: skip
    if todo:
        _update(todo, ["State=POWER_UP"], "power up", scontrol_path, timeout)


def power_down(nodes: Sequence[str], *, scontrol_path: str = "scontrol", timeout: float = COMMAND_TIMEOUT_S) -> None:
    """Ask Slurm to power ``nodes`` down (``State=POWER_DOWN``): it runs its SuspendProgram and
    counts each node ``down`` after SuspendTimeout. Refused (``BackendError``, permanent, nothing
    done) while any of them is ``busy``: the portal never powers a node down under running work.
    :func:`drain` the nodes first, so that no job starts there between this check and Slurm's power
    down. Nodes already down or on their way down are left alone."""
    power = node_power(nodes, scontrol_path=scontrol_path, timeout=timeout)
    busy = [p.name for p in power.values() if p.busy]
    if busy:
        raise BackendError(
            f"not powering down {', '.join(busy)}: jobs run there (drain the nodes and wait for them to end)",
            permanent=True,
        )
    todo = [p.name for p in power.values() if p.powered not in {"down", "powering_down"}]
    if todo:
        _update(todo, ["State=POWER_DOWN"], "power down", scontrol_path, timeout)


def drain(
    nodes: Sequence[str],
    reason: str = DRAIN_REASON,
    *,
    scontrol_path: str = "scontrol",
    timeout: float = COMMAND_TIMEOUT_S,
) -> None:
    """Drain ``nodes``: Slurm starts no new job there; jobs running there go on (``busy`` stays
    true until they end). ``reason`` is shown by ``sinfo -R`` and in :class:`NodePower`."""
    reason = " ".join(reason.split())
    if not reason:
        raise BackendError("a reason is needed to drain nodes", permanent=True)
    _update(_check_nodes(nodes), ["State=DRAIN", f"Reason={reason}"], "drain", scontrol_path, timeout)


def resume(nodes: Sequence[str], *, scontrol_path: str = "scontrol", timeout: float = COMMAND_TIMEOUT_S) -> None:
    """Return ``nodes`` to service (``State=RESUME``): undrained, and a failed node back in Slurm's
    count (a failed power-up becomes ``down``, to be powered up again). Nodes neither drained nor
    failed are left alone."""
    power = node_power(nodes, scontrol_path=scontrol_path, timeout=timeout)
    todo = [p.name for p in power.values() if p.drained or p.powered == "failed"]
    if todo:
        _update(todo, ["State=RESUME"], "resume", scontrol_path, timeout)


def _reason(line: str) -> str:
    """``Reason=`` of a node's line: its value has spaces (``ResumeTimeout reached [root@...]``) and
    runs to the next ``Key=`` field or the end of the line."""
    match = re.search(r"(?:^|\s)Reason=(.*?)(?=\s+[A-Za-z]+=|\s*$)", line)
    reason = match.group(1).strip() if match else ""
    return "" if reason in {"", "(null)", "none"} else reason


def _check_nodes(nodes: Iterable[str]) -> list[str]:
    if isinstance(nodes, str):
        raise BackendError("a list of node names is needed, not one string", permanent=True)
    names = list(dict.fromkeys(nodes))
    if not names:
        raise BackendError("no nodes named", permanent=True)
    bad = [node for node in names if not _NAME_RE.match(node)]
    if bad:
        raise BackendError(f"{', '.join(map(repr, bad))} are not Slurm node names", permanent=True)
    return names


def _update(nodes: list[str], args: list[str], what: str, scontrol_path: str, timeout: float) -> None:
    argv = [scontrol_path, "update", f"NodeName={','.join(_check_nodes(nodes))}", *args]
    try:
        _scontrol(argv, f"{what} {','.join(nodes)}", timeout)
    except BackendError as exc:
        if any(text in exc.message for text in _NOT_FOUND):
            raise BackendError(exc.message, permanent=True) from None
        raise


def _scontrol(argv: list[str], what: str, timeout: float) -> str:
    """Run ``argv``; Slurm's refusal as ``BackendError`` saying what could not be done and why."""
    try:
        return run_command(argv, timeout)
    except PolicyRefusal as exc:
        raise BackendError(f"Slurm refused to {what}: {exc}", permanent=True) from None
    except BackendError as exc:
        detail = exc.message.removeprefix(f"{argv[0].rsplit('/', 1)[-1]} failed: ")
        detail = " ".join(line.strip() for line in detail.splitlines() if line.strip())
        permanent = exc.permanent or "Invalid node state" in detail or "Invalid node name" in detail
        raise BackendError(f"Slurm could not {what}: {detail}", permanent=permanent) from None
