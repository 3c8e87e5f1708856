"""Slurm reservations for GPU provisioning requests (GPRs): an approved GPR on a Slurm cluster is a real
Slurm reservation, ``gpuportal-gpr-<id>``, of whole nodes for the workspace's Slurm account.

Slurm 22.05 reserves nodes (or cores), never a count of a GRES alone: a reservation holds every GPU of
its nodes, so the portal reserves the nodes that hold the GPR's devices, whole. Jobs of the account
submitted with ``--reservation=<name>`` (a spec's ``reservation``, see workers/backends/slurm.py) run
on those nodes; no other job starts there while it is active (they pend with reason
``ReqNodeNotAvail``, or run on other nodes). When it ends (its end time, or an early release), Slurm
ends the jobs still running in it as if they had reached their time limit.

Every reservation is made with ``Flags=IGNORE_JOBS``: the portal's calendar has already decided that
the nodes are the GPR's from its start, so jobs Slurm runs there now (which may have no time limit)
do not stop the reservation from being made; they keep running into it.

Each function runs ``scontrol`` through :func:`run_command` (no shell, a timeout) and raises
``BackendError``: permanent where Slurm refused what was asked (an unknown node or account, an end
before the start, nodes another reservation holds), transient where Slurm did not answer. Times are
timezone-aware datetimes, passed to ``scontrol`` in the worker's local time, as Slurm reads them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from workers.backends.base import BackendError, PolicyRefusal
from workers.backends.slurm_commands import COMMAND_TIMEOUT_S, run_command

#: The names of the portal's reservations start with this (the reconcile sweep lists them by it).
RESERVATION_PREFIX = "gpuportal-gpr-"
#: The flags of every reservation the portal makes (see the module's docstring).
RESERVATION_FLAGS = "IGNORE_JOBS"
#: A start at most this far ahead is "now": by the time slurmctld reads it, it would be in the past.
NOW_SLACK = timedelta(seconds=5)

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# What scontrol says, to stderr with exit status 1, for ...
_NOT_FOUND = "Requested reservation is invalid"  # ... an update or delete of a reservation it does not have
_IN_USE = "Requested reservation is in use"  # ... a delete while jobs run in it
# Refusals about what was asked, which asking again cannot change.
_REFUSALS = (
    "Invalid node name",
    "Invalid account",
    "Invalid user",
    "Invalid time",
    "Start time cannot be after end time",
    "overlaps with another reservation",
    "Reservation already started",
    "Requested nodes are busy",
    "Invalid partition",
)


def reservation_name(gpr_id: int) -> str:
    """The Slurm reservation of GPR ``gpr_id``: ``gpuportal-gpr-<id>``."""
    return f"{RESERVATION_PREFIX}{int(gpr_id)}"


def create_reservation(
    name: str,
    *,
    account: str,
    nodes: Sequence[str],
    start: datetime,
    end: datetime,
    users: Iterable[str] = (),
    scontrol_path: str = "scontrol",
    timeout: float = COMMAND_TIMEOUT_S,
) -> dict[str, str]:
    """Reserve the whole ``nodes`` (Slurm node names, as the portal's inventory names them) from
    ``start`` (a start in the past or now: at once) to ``end`` for the jobs of Slurm ``account``,
    and of those only ``users``' where given (Slurm asks both of a job; each user must belong to the
    account). The account must exist in Slurm's accounting: the backend makes a workspace's with its
    first job (``SlurmBackend.ensure_account``). Returns the reservation as
    :func:`show_reservation` does.

    Idempotent: where ``name`` exists already it is updated to what is asked (its start only while
    it has not begun: Slurm cannot move the start of an active reservation).
    """
    _check_name(name)
    users = list(users)
    if not account and not users:
        raise BackendError(f"reservation {name}: a Slurm account (or users) must be named", permanent=True)
    _check_times(name, start, end)
    args = _target_args(name, account=account, nodes=nodes, users=users)
    current = show_reservation(name, scontrol_path=scontrol_path, timeout=timeout)
    if current is None:
        create = [
            scontrol_path,
            "create",
            "reservation",
            f"ReservationName={name}",
            f"StartTime={_slurm_time(start)}",
            f"EndTime={_slurm_time(end, timedelta(0))}",
            *args,
            f"Flags={RESERVATION_FLAGS}",
        ]
        try:
            _scontrol(create, f"create reservation {name} of {','.join(nodes)} for account {account!r}", timeout)
        except BackendError as exc:
            # Made meanwhile (Slurm then says that the name is taken, or that it overlaps itself): updated below.
            current = show_reservation(name, scontrol_path=scontrol_path, timeout=timeout)
            if current is None:
                raise exc from None
        else:
            return _shown(name, scontrol_path, timeout)
    update = [f"EndTime={_slurm_time(end, timedelta(0))}", *args]
    if current.get("State") != "ACTIVE":
        update.insert(0, f"StartTime={_slurm_time(start)}")
    _update(name, update, scontrol_path, timeout)
    return _shown(name, scontrol_path, timeout)


def update_reservation(
    name: str,
    *,
    end: datetime | None = None,
    nodes: Sequence[str] | None = None,
    start: datetime | None = None,
    scontrol_path: str = "scontrol",
    timeout: float = COMMAND_TIMEOUT_S,
) -> dict[str, str]:
    """Change what is given of reservation ``name``: its end (extend or shorten), its nodes, its start
    (only before it begins). ``BackendError`` (permanent) where Slurm has no such reservation or
    refuses the change. Returns the reservation as :func:`show_reservation` does."""
    _check_name(name)
    if start is not None or end is not None:
        current = show_reservation(name, scontrol_path=scontrol_path, timeout=timeout)
        if current is None:
            raise BackendError(f"Slurm has no reservation {name} to update", permanent=True)
        start_at = start or _parse_time(current.get("StartTime", ""))
        end_at = end or _parse_time(current.get("EndTime", ""))
        if start_at is not None and end_at is not None and end_at <= start_at:
            raise BackendError(
                f"reservation {name}: its end ({end_at}) must be after its start ({start_at})", permanent=True
            )
    update = []
    if start is not None:
        update.append(f"StartTime={_slurm_time(start)}")
    if end is not None:
        update.append(f"EndTime={_slurm_time(end, timedelta(0))}")
    if nodes is not None:
        update.append(f"Nodes={_node_list(name, nodes)}")
    if update:
        _update(name, update, scontrol_path, timeout)
    return _shown(name, scontrol_path, timeout)


def delete_reservation(name: str, *, scontrol_path: str = "scontrol", timeout: float = COMMAND_TIMEOUT_S) -> None:
    """Release reservation ``name`` now. A reservation Slurm does not have is not an error. One that
    jobs still run in cannot be deleted: it is ended now instead, and Slurm ends those jobs as at its
    end and then removes it."""
    _check_name(name)
    try:
        _scontrol([scontrol_path, "delete", f"ReservationName={name}"], f"delete reservation {name}", timeout)
    except BackendError as exc:
        if _NOT_FOUND in exc.message:
            return
        if _IN_USE not in exc.message:
            raise
        _update(name, ["EndTime=now"], scontrol_path, timeout)


def show_reservation(
    name: str, *, scontrol_path: str = "scontrol", timeout: float = COMMAND_TIMEOUT_S
) -> dict[str, str] | None:
    """Reservation ``name`` as ``scontrol show reservation -o`` prints it, by field (``ReservationName``,
    ``StartTime``, ``EndTime``, ``Nodes`` (a Slurm host list: ``node[3-4]``), ``Accounts``, ``Users``,
    ``Flags``, ``State`` (``ACTIVE``/``INACTIVE``)...; ``(null)`` for none); ``None`` where Slurm has none."""
    _check_name(name)
    try:
        out = _scontrol([scontrol_path, "show", "reservation", "-o", name], f"show reservation {name}", timeout)
    except BackendError as exc:
        if f"Reservation {name} not found" in exc.message:
            return None
        raise
    found = [fields for fields in parse_reservations(out) if fields["ReservationName"] == name]
    return found[0] if found else None


def list_reservations(
    prefix: str = RESERVATION_PREFIX, *, scontrol_path: str = "scontrol", timeout: float = COMMAND_TIMEOUT_S
) -> list[dict[str, str]]:
    """Every reservation whose name starts with ``prefix`` (the portal's, by default), as
    :func:`show_reservation` gives each, for a reconcile sweep."""
    out = _scontrol([scontrol_path, "show", "reservation", "-o"], "list reservations", timeout)
    return [fields for fields in parse_reservations(out) if fields["ReservationName"].startswith(prefix)]


def reservation_nodes(
    fields: dict[str, str], *, scontrol_path: str = "scontrol", timeout: float = COMMAND_TIMEOUT_S
) -> list[str]:
    """The node names of a reservation's ``Nodes`` host list (``node[3-4]`` -> node3, node4)."""
    nodelist = fields.get("Nodes", "")
    if not nodelist or nodelist == "(null)":
        return []
    return _scontrol([scontrol_path, "show", "hostnames", nodelist], "expand a host list", timeout).split()


def parse_reservations(out: str) -> list[dict[str, str]]:
    """Every reservation of ``scontrol show reservation -o`` (one line each), as its ``Key=Value`` fields."""
    found = []
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("ReservationName"):
            found.append(fields)
    return found


def _scontrol(argv: list[str], what: str, timeout: float) -> str:
    """Run ``argv``; Slurm's refusal as ``BackendError`` saying what could not be done and why."""
    try:
        return run_command(argv, timeout)
    except PolicyRefusal as exc:
        raise BackendError(f"Slurm refused to {what}: {exc}", permanent=True) from None
    except BackendError as exc:
        detail = exc.message.removeprefix(f"{argv[0].rsplit('/', 1)[-1]} failed: ")
        detail = " ".join(line.strip() for line in detail.splitlines() if line.strip())
        refused = exc.permanent or any(text.lower() in detail.lower() for text in _REFUSALS)
        raise BackendError(f"Slurm could not {what}: {detail}", permanent=refused) from None


def _update(name: str, args: list[str], scontrol_path: str, timeout: float) -> None:
    try:
        _scontrol([scontrol_path, "update", f"ReservationName={name}", *args], f"update reservation {name}", timeout)
    except BackendError as exc:
        if _NOT_FOUND in exc.message:
            raise BackendError(f"Slurm has no reservation {name} to update", permanent=True) from None
        raise


def _shown(name: str, scontrol_path: str, timeout: float) -> dict[str, str]:
    fields = show_reservation(name, scontrol_path=scontrol_path, timeout=timeout)
    if fields is None:  # deleted meanwhile (or ended and purged): the caller's reconcile makes it again
        raise BackendError(f"Slurm reservation {name} vanished as it was made", permanent=False)
    return fields


def _target_args(name: str, *, account: str, nodes: Sequence[str], users: list[str]) -> list[str]:
    """``Nodes=``, ``Accounts=`` and ``Users=`` of a reservation, checked so that no value can add a field."""
    args = [f"Nodes={_node_list(name, nodes)}"]
    for key, values in (("Accounts", [account] if account else []), ("Users", users)):
        for value in values:
            if not _NAME_RE.match(value):
                raise BackendError(
                    f"reservation {name}: {key.lower()[:-1]} {value!r} is not a Slurm name", permanent=True
                )
        if values:
            args.append(f"{key}={','.join(values)}")
    return args


def _node_list(name: str, nodes: Sequence[str]) -> str:
    if isinstance(nodes, str) or not nodes:
        raise BackendError(f"reservation {name}: a list of one or more node names is needed", permanent=True)
    bad = [node for node in nodes if not _NAME_RE.match(node)]
    if bad:
        raise BackendError(f"reservation {name}: {', '.join(map(repr, bad))} are not Slurm node names", permanent=True)
    return ",".join(dict.fromkeys(nodes))


def _check_name(name: str) -> None:
    if not _NAME_RE.match(name):
        raise BackendError(f"{name!r} is not a Slurm reservation name", permanent=True)


def _check_times(name: str, start: datetime, end: datetime) -> None:
    for when in (start, end):
        if when.tzinfo is None:
            raise BackendError(f"reservation {name}: times must be timezone-aware, not {when}", permanent=True)
    if end <= start:
        raise BackendError(f"reservation {name}: its end ({end}) must be after its start ({start})", permanent=True)
    if end <= datetime.now(UTC):
        raise BackendError(f"reservation {name}: its end ({end}) has passed", permanent=True)


def _slurm_time(when: datetime, slack: timedelta = NOW_SLACK) -> str:
    """``now`` for a time that has come (or comes within ``slack``); else the local time Slurm reads."""
    if when.tzinfo is None:
        raise BackendError(f"times must be timezone-aware, not {when}", permanent=True)
    if when <= datetime.now(UTC) + slack:
        return "now"
    return when.astimezone().strftime(_TIME_FORMAT)


def _parse_time(text: str) -> datetime | None:
    """A time of ``scontrol show reservation`` (local time) as an aware datetime."""
    try:
        return datetime.strptime(text, _TIME_FORMAT).astimezone()
    except ValueError:
        return None
