"""State changes of GPU provisioning requests: asked, decided, changed, begun, ended.

``check_request`` refuses what could never be held (more GPUs than any cluster has, a start in the
past, longer than the workspace's policy allows, a GPU type it may not use, more at once than its
policy allows with its other requests); ``do_request`` records it with its earliest feasible start
and approves it at once where the policy says so. An approved request holds whole devices from its
start: the scheduler (apps/scheduling/adapter.py) hands it to the engine as a reservation, and
``upkeep`` (in the scheduler's loop) begins and ends it on time, warns its holder before the end and
reports it when it stands idle. Every action writes an audit event and a step of its timeline.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import Sum
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from apps.audit.actions import SYSTEM, Origin, do_log_event
from apps.audit.events import Event
from apps.errors import ActionError, Conflict
from apps.inventory.models import GPU, Allocation, Cluster, Node
from apps.provisioning.models import ProvisioningEvent, ProvisioningPolicy, ProvisioningRequest
from apps.provisioning.slots import Found, find_slot
from apps.scheduling.trigger import request_cycle
from apps.workloads.kinds import scheduled
from apps.workloads.models import Workload
from apps.workspaces.models import GPUQuota, Workspace

logger = logging.getLogger(__name__)

State = ProvisioningRequest.State
#: How far in the past a start may lie and still count as "now" (the form's clock, a slow request).
START_SLACK_S = 120
#: How far ahead a start may lie.
MAX_AHEAD_DAYS = 366


@dataclass(frozen=True)
class Policy:
    auto_approve_max_s: int | None  # None: an admin decides each request
    max_duration_s: int
    max_gpus: int | None  # reserved GPUs at once, all its requests together; None: no cap of its own


def policy_of(workspace: Workspace) -> Policy:
    """The workspace's own policy, or the portal's defaults."""
    row = ProvisioningPolicy.objects.filter(workspace=workspace).first()
    if row is not None:
        return Policy(row.auto_approve_max_s, row.max_duration_s, row.max_gpus)
    auto = settings.PORTAL_GPR_AUTO_APPROVE_MAX_S
    return Policy(auto or None, settings.PORTAL_GPR_MAX_DURATION_S, None)


def do_set_policy(
    workspace: Workspace,
    *,
    auto_approve_max_s: int | None,
    max_duration_s: int,
    max_gpus: int | None,
    acting_user: Any,
    origin: Origin = SYSTEM,
) -> ProvisioningPolicy:
    """An admin sets how the workspace's requests are decided (requests already decided stay so)."""
    if auto_approve_max_s is not None and auto_approve_max_s > max_duration_s:
        raise ActionError(
            "Requests are approved by themselves only up to the longest a request may be.", field="auto_approve_max_s"
        )
    with transaction.atomic():
        policy, _ = ProvisioningPolicy.objects.update_or_create(
            workspace=workspace,
            defaults={"auto_approve_max_s": auto_approve_max_s, "max_duration_s": max_duration_s, "max_gpus": max_gpus},
        )
        do_log_event(Event.GPR_POLICY_SET, policy, acting_user=acting_user, origin=origin, workspace=workspace,
                     data={"auto_approve_max_s": auto_approve_max_s, "max_duration_s": max_duration_s,
                           "max_gpus": max_gpus})  # fmt: skip
    return policy


def nominal_gpus(workspace: Workspace, gpu_type: str) -> int:
    quota = GPUQuota.objects.filter(workspace=workspace, gpu_type=gpu_type).values_list("gpus", flat=True).first()
    return int(quota or 0)


# --- Asking --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Asked:
    """A request's terms, checked: what `do_request` records and the form's estimate shows."""

    workspace: Workspace
    gpu_type: str
    gpus: int
    cluster: Cluster | None
    asap: bool
    start_at: datetime
    duration_s: int
    found: Found


def check_request(
    workspace: Workspace,
    *,
    gpu_type: str,
    gpus: int,
    duration_s: int,
    start_at: datetime | None = None,
    cluster: Cluster | None = None,
    ignoring: ProvisioningRequest | None = None,
    now: datetime | None = None,
) -> Asked:
    """Check a request's terms and find its earliest feasible start; ActionError (naming the field)
    for what can never be held. `start_at` None: as soon as possible."""
    now = now or timezone.now()
    allowed = workspace.allowed_gpu_types or []
    if allowed and gpu_type not in allowed:
        raise ActionError(
            f"Workspace {workspace.name} may not use {gpu_type} GPUs (it may use {', '.join(allowed)}).",
            field="gpu_type",
        )
    devices = GPU.objects.filter(gpu_type=gpu_type, node__pool__cluster__enabled=True)
    if cluster is not None:
        devices = devices.filter(node__pool__cluster=cluster)
    if not devices.exists():
        where = f"Cluster {cluster.name}" if cluster is not None else "No cluster"
        raise ActionError(f"{where} has no {gpu_type} GPUs." if cluster else f"No cluster has {gpu_type} GPUs.",
                          field="gpu_type")  # fmt: skip
    if start_at is not None and start_at < now - timedelta(seconds=START_SLACK_S):
        raise ActionError("The start lies in the past; leave it out to start as soon as possible.", field="start_at")
    if start_at is not None and start_at > now + timedelta(days=MAX_AHEAD_DAYS):
        raise ActionError(f"The start lies more than {MAX_AHEAD_DAYS} days ahead.", field="start_at")
    rules = policy_of(workspace)
    if duration_s > rules.max_duration_s:
        raise ActionError(
            f"At most {_hours(rules.max_duration_s)} for workspace {workspace.name}; ask an admin for a longer one.",
            field="duration_s",
        )
    begin = max(start_at or now, now)
    found = find_slot(
        gpu_type=gpu_type, gpus=gpus, duration_s=duration_s, not_before=begin, cluster=cluster, ignoring=ignoring
    )
    if found is None:
        raise ActionError(_too_many(gpu_type, gpus, cluster), field="gpus")
    if rules.max_gpus is not None:
        overlapping = _reserved_at_once(workspace, gpu_type, found.start, found.start + timedelta(seconds=duration_s),
                                        ignoring)  # fmt: skip
        if overlapping + gpus > rules.max_gpus:
            raise ActionError(
                f"Workspace {workspace.name} may hold at most {rules.max_gpus} {gpu_type} GPUs at once; its other "
                f"requests over that time hold {overlapping}.",
                field="gpus",
            )
    return Asked(workspace, gpu_type, gpus, cluster, start_at is None, start_at or now, duration_s, found)


def _too_many(gpu_type: str, gpus: int, cluster: Cluster | None) -> str:
    counts = (
        GPU.objects.filter(gpu_type=gpu_type, node__pool__cluster__enabled=True, node__state=Node.State.READY)
        .values("node__pool__cluster__name")
        .annotate(n=Sum(1))
    )
    most = max((row["n"] for row in counts if cluster is None or row["node__pool__cluster__name"] == cluster.name),
               default=0)  # fmt: skip
    where = f"cluster {cluster.name}" if cluster is not None else "any one cluster"
    return f"{gpus} {gpu_type} GPUs is more than {where} could ever hold (at most {most} ready)."


def _reserved_at_once(
    workspace: Workspace, gpu_type: str, start: datetime, end: datetime, ignoring: ProvisioningRequest | None
) -> int:
    """The most GPUs the workspace's other open requests of the type hold at one moment of [start, end)."""
    others = ProvisioningRequest.objects.filter(
        workspace=workspace, gpu_type=gpu_type, state__in=ProvisioningRequest.OPEN_STATES
    )
    if ignoring is not None and ignoring.pk:
        others = others.exclude(pk=ignoring.pk)
    spans = []
    for other in others:
        s, e = (other.held_start, other.held_end) if other.held_start else (other.earliest_start or other.start_at,
                                                                              None)  # fmt: skip
        e = e or (s + timedelta(seconds=other.duration_s))
        if s < end and e > start:
            spans.append((max(s, start), min(e, end), other.gpus))
    most = 0
    for moment, _, _ in spans:  # the most at once is reached where one of them begins
        most = max(most, sum(g for s, e, g in spans if s <= moment < e))
    return most


def _hours(seconds: int) -> str:
    hours = seconds / 3600
    return f"{hours:g} hour{'s' if hours != 1 else ''}" if hours < 48 else f"{hours / 24:g} days"


def do_request(
    asked: Asked, *, priority: int, justification: str, acting_user: Any, origin: Origin = SYSTEM
) -> ProvisioningRequest:
    """Record a checked request; approve it at once where the workspace's policy says so."""
    with transaction.atomic():
        gpr = ProvisioningRequest.objects.create(
            workspace=asked.workspace,
            requested_by=acting_user if getattr(acting_user, "pk", None) else None,
            gpu_type=asked.gpu_type,
            gpus=asked.gpus,
            cluster=asked.cluster,
            asap=asked.asap,
            start_at=asked.start_at,
            duration_s=asked.duration_s,
            priority=priority,
            justification=justification,
            earliest_start=asked.found.start,
        )
        _log(Event.GPR_REQUEST, gpr, acting_user, origin, "requested",
             f"Asked for {gpr.gpus} {gpr.gpu_type} for {_hours(gpr.duration_s)}, "
             f"{'as soon as possible' if gpr.asap else 'from ' + _when(gpr.start_at)}; "
             f"earliest feasible start {_when(asked.found.start)}.")  # fmt: skip
        why = _auto_refusal(gpr, asked.found)
        if why is None:
            _hold(gpr, asked.found, acting_user=None, auto=True)
            _log(Event.GPR_APPROVE, gpr, None, SYSTEM, "approved",
                 f"Approved by the workspace's policy: {gpr.gpus} {gpr.gpu_type} on {asked.found.cluster.name}, "
                 f"{_when(gpr.held_start)} to {_when(gpr.held_end)}.")  # fmt: skip
        else:
            _step(gpr, "pending", f"Waits for an admin: {why}.", None)
    if gpr.state == State.APPROVED:
        _mail_decision(gpr)
        request_cycle()
    return gpr


def auto_refusal(asked: Asked) -> str | None:
    """Why the workspace's policy would leave these terms to an admin; None if it would approve them at
    once (the check `do_request` makes, for terms not saved: the form's and the API's estimate)."""
    unsaved = ProvisioningRequest(workspace=asked.workspace, gpu_type=asked.gpu_type, gpus=asked.gpus,
                                  duration_s=asked.duration_s)  # fmt: skip
    return _auto_refusal(unsaved, asked.found)


def _auto_refusal(gpr: ProvisioningRequest, found: Found) -> str | None:
    """Why the policy leaves the request to an admin; None if it approves it."""
    rules = policy_of(gpr.workspace)
    if rules.auto_approve_max_s is None:
        return "workspace policy has every request decided by an admin"
    if gpr.duration_s > rules.auto_approve_max_s:
        return f"longer than the {_hours(rules.auto_approve_max_s)} the policy approves by itself"
    nominal = nominal_gpus(gpr.workspace, gpr.gpu_type)
    end = found.start + timedelta(seconds=gpr.duration_s)
    held = _reserved_at_once(gpr.workspace, gpr.gpu_type, found.start, end, gpr)
    if held + gpr.gpus > nominal:
        return f"{held + gpr.gpus} {gpr.gpu_type} reserved at once would exceed the workspace's quota of {nominal}"
    return None


# --- Deciding ------------------------------------------------------------------------------------


def do_approve(
    gpr: ProvisioningRequest,
    *,
    acting_user: Any,
    origin: Origin = SYSTEM,
    start_at: datetime | None = None,
    gpus: int | None = None,
    duration_s: int | None = None,
    reason: str = "",
) -> ProvisioningRequest:
    """An admin approves a pending request, as asked or with changes (a later start, fewer GPUs, a
    shorter time): it holds the earliest devices the calendar finds from that start on."""
    with transaction.atomic():
        gpr = _locked(gpr, (State.REQUESTED,), "approved")
        changes = []
        if gpus is not None and gpus != gpr.gpus:
            if gpus > gpr.gpus:
                raise ActionError(f"An approval may give fewer GPUs than asked ({gpr.gpus}), not more.", field="gpus")
            changes.append(f"{gpus} GPUs instead of {gpr.gpus}")
            gpr.gpus = gpus
        if duration_s is not None and duration_s != gpr.duration_s:
            if duration_s > gpr.duration_s:
                raise ActionError("An approval may shorten the time asked for, not lengthen it.", field="duration_s")
            changes.append(f"{_hours(duration_s)} instead of {_hours(gpr.duration_s)}")
            gpr.duration_s = duration_s
        now = timezone.now()
        begin = max(gpr.start_at, now)
        if start_at is not None:
            if start_at < begin - timedelta(seconds=START_SLACK_S):
                raise ActionError("An approval may move the start later, not earlier than asked.", field="start_at")
            if start_at > now + timedelta(days=MAX_AHEAD_DAYS):
                raise ActionError(f"The start lies more than {MAX_AHEAD_DAYS} days ahead.", field="start_at")
            changes.append(f"from {_when(start_at)}")
            begin = max(start_at, now)
        found = find_slot(gpu_type=gpr.gpu_type, gpus=gpr.gpus, duration_s=gpr.duration_s, not_before=begin,
                          cluster=gpr.cluster, ignoring=gpr)  # fmt: skip
        if found is None:
            raise ActionError(_too_many(gpr.gpu_type, gpr.gpus, gpr.cluster), field="gpus")
        _hold(gpr, found, acting_user=acting_user, auto=False, reason=reason)
        what = f"{gpr.gpus} {gpr.gpu_type} on {found.cluster.name}, {_when(gpr.held_start)} to {_when(gpr.held_end)}"
        said = f"Approved{' with changes (' + '; '.join(changes) + ')' if changes else ''}: {what}."
        _log(Event.GPR_APPROVE, gpr, acting_user, origin, "approved", said + (f" {reason}" if reason else ""),
             {"changes": changes})  # fmt: skip
    _mail_decision(gpr)
    request_cycle()
    return gpr


def do_reject(gpr: ProvisioningRequest, *, reason: str, acting_user: Any, origin: Origin = SYSTEM) -> None:
    if not reason.strip():
        raise ActionError("Say why it is rejected: the requester reads it.", field="reason")
    with transaction.atomic():
        gpr = _locked(gpr, (State.REQUESTED,), "rejected")
        gpr.state, gpr.decided_by, gpr.decided_at, gpr.decision_reason = (
            State.REJECTED,
            acting_user,
            timezone.now(),
            reason,
        )
        gpr.ended_at = gpr.decided_at
        gpr.save()
        _log(Event.GPR_REJECT, gpr, acting_user, origin, "rejected", f"Rejected: {reason}")
    _mail_decision(gpr)


def _hold(gpr: ProvisioningRequest, found: Found, *, acting_user: Any, auto: bool, reason: str = "") -> None:
    gpr.state = State.APPROVED
    gpr.held_cluster = found.cluster
    gpr.held_start = found.start
    gpr.held_end = found.start + timedelta(seconds=gpr.duration_s)
    gpr.decided_by = acting_user if getattr(acting_user, "pk", None) else None
    gpr.decided_at = timezone.now()
    gpr.auto_approved = auto
    gpr.decision_reason = reason
    gpr.save()
    gpr.devices.set(found.gpu_ids)


# --- Changing --------------------------------------------------------------------------------------


def do_modify(
    gpr: ProvisioningRequest,
    *,
    acting_user: Any,
    origin: Origin = SYSTEM,
    gpus: int | None = None,
    duration_s: int | None = None,
    start_at: datetime | None = None,
) -> ProvisioningRequest:
    """Change a request. Pending: any of its terms, checked again. Approved or active: fewer GPUs (the
    rest go back at once), a shorter time, or a longer one: that needs its devices free until the new
    end and, beyond what the policy approves by itself, an admin's approval (`pending_change`)."""
    with transaction.atomic():
        gpr = _locked(gpr, ProvisioningRequest.OPEN_STATES, "changed")
        if gpr.state == State.REQUESTED:
            asked = check_request(
                gpr.workspace, gpu_type=gpr.gpu_type, gpus=gpus or gpr.gpus,
                duration_s=duration_s or gpr.duration_s,
                start_at=start_at if start_at is not None else (None if gpr.asap else gpr.start_at),
                cluster=gpr.cluster, ignoring=gpr,
            )  # fmt: skip
            gpr.gpus, gpr.duration_s, gpr.earliest_start = asked.gpus, asked.duration_s, asked.found.start
            if start_at is not None:
                gpr.start_at, gpr.asap = start_at, False
            gpr.save()
            _log(Event.GPR_MODIFY, gpr, acting_user, origin, "changed",
                 f"Changed to {gpr.gpus} {gpr.gpu_type} for {_hours(gpr.duration_s)}; earliest feasible start "
                 f"{_when(asked.found.start)}.")  # fmt: skip
            return gpr
        if start_at is not None:
            raise ActionError("An approved request's start cannot move; cancel it and ask again.", field="start_at")
        said = []
        if gpus is not None and gpus != gpr.gpus:
            said.append(_shrink(gpr, gpus))
        if duration_s is not None and duration_s != gpr.duration_s:
            said.append(_retime(gpr, duration_s, acting_user))
        if not said:
            raise ActionError("Nothing to change: give fewer GPUs or another duration.", field="gpus")
        gpr.save()
        _log(Event.GPR_MODIFY, gpr, acting_user, origin, "changed", " ".join(said))
    request_cycle()
    return gpr


def _shrink(gpr: ProvisioningRequest, gpus: int) -> str:
    if gpus > gpr.gpus:
        raise ActionError(
            f"An approved request cannot grow ({gpr.gpus} held); ask for the others in a new request.", field="gpus"
        )
    if gpr.held_cluster is not None and gpr.held_cluster.kind != Cluster.Kind.LOCAL:
        raise ActionError(f"A reservation on {gpr.held_cluster.get_kind_display()} holds whole nodes: it cannot "
                          f"shrink; release it instead.",
                          field="gpus")  # fmt: skip
    # Keep the devices its work runs on; give back the others, the last ones first.
    held = list(gpr.devices.order_by("node__name", "index"))
    busy = set(Allocation.objects.filter(workload__reservation=gpr, gpu__in=held).values_list("gpu_id", flat=True))
    drop = [gpu for gpu in reversed(held) if gpu.pk not in busy][: len(held) - gpus]
    if len(held) - len(drop) > gpus:
        raise ActionError(f"Its work runs on {len(busy)} of its GPUs: it cannot shrink below that.", field="gpus")
    gpr.devices.remove(*drop)
    before, gpr.gpus = gpr.gpus, gpus
    return f"Shrunk from {before} to {gpus} {gpr.gpu_type}: the others went back at once."


def _retime(gpr: ProvisioningRequest, duration_s: int, acting_user: Any) -> str:
    assert gpr.held_start is not None and gpr.held_end is not None
    now = timezone.now()
    new_end = gpr.held_start + timedelta(seconds=duration_s)
    if new_end <= now:
        raise ActionError("That end has passed already: release it instead.", field="duration_s")
    if duration_s < gpr.duration_s:
        gpr.duration_s, gpr.held_end, gpr.warned_at = duration_s, new_end, None
        return f"Shortened: it now ends {_when(new_end)}."
    rules = policy_of(gpr.workspace)
    if duration_s > rules.max_duration_s:
        raise ActionError(f"At most {_hours(rules.max_duration_s)} for workspace {gpr.workspace.name}.",
                          field="duration_s")  # fmt: skip
    clash = (
        ProvisioningRequest.objects.filter(
            state__in=ProvisioningRequest.HOLDING_STATES, devices__in=gpr.devices.all(),
            held_start__lt=new_end, held_end__gt=gpr.held_end,
        ).exclude(pk=gpr.pk).select_related("workspace").first()
    )  # fmt: skip
    if clash is not None:
        raise ActionError(
            f"Its GPUs are reserved for {clash.workspace.name} from {_when(clash.held_start)}: it can be extended "
            f"until then at most.",
            field="duration_s",
        )
    if is_admin(acting_user) or (rules.auto_approve_max_s is not None and duration_s <= rules.auto_approve_max_s):
        gpr.duration_s, gpr.held_end, gpr.warned_at, gpr.pending_change = duration_s, new_end, None, None
        return f"Extended: it now ends {_when(new_end)}."
    gpr.pending_change = {"duration_s": duration_s, "held_end": new_end.isoformat()}
    return f"Asked to extend it until {_when(new_end)}: waits for an admin's approval."


def do_decide_change(gpr: ProvisioningRequest, *, approve: bool, acting_user: Any, origin: Origin = SYSTEM,
                     reason: str = "") -> ProvisioningRequest:  # fmt: skip
    """An admin approves or refuses an extension asked for after approval."""
    with transaction.atomic():
        gpr = _locked(gpr, ProvisioningRequest.HOLDING_STATES, "changed")
        change = gpr.pending_change
        if not change:
            raise Conflict("No change of this request waits for a decision.")
        gpr.pending_change = None
        if approve:
            said = _retime(gpr, int(change["duration_s"]), acting_user)
        else:
            said = f"The extension until {_when(datetime.fromisoformat(change['held_end']))} was refused. {reason}"
        gpr.save()
        _log(Event.GPR_MODIFY, gpr, acting_user, origin, "changed", said.strip())
    _mail(gpr, f"GPR {gpr.pk}: {said.split(':')[0]}", said)
    return gpr


def do_cancel(gpr: ProvisioningRequest, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    """Withdraw a request that has not begun."""
    with transaction.atomic():
        gpr = _locked(gpr, (State.REQUESTED, State.APPROVED), "cancelled")
        _finish(gpr, State.CANCELLED)
        _log(Event.GPR_CANCEL, gpr, acting_user, origin, "cancelled", "Cancelled before it began.")
    request_cycle()


def do_release(gpr: ProvisioningRequest, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    """End an active reservation now: its GPUs go back to everyone at once. The holder's work that
    runs there goes on as ordinary work, under its quota."""
    with transaction.atomic():
        gpr = _locked(gpr, (State.ACTIVE,), "released")
        left = _unused(gpr)
        _finish(gpr, State.RELEASED)
        _log(Event.GPR_RELEASE, gpr, acting_user, origin, "released", f"Released early, {left} before its end.")
    request_cycle()


def _unused(gpr: ProvisioningRequest) -> str:
    if gpr.held_end is None:
        return "nothing"
    left = max(0, int((gpr.held_end - timezone.now()).total_seconds()))
    return f"{left // 3600} h {left % 3600 // 60} min"


def _finish(gpr: ProvisioningRequest, state: str) -> None:
    now = timezone.now()
    gpr.state, gpr.ended_at, gpr.pending_change = state, now, None
    if gpr.held_end is not None and gpr.held_end > now:
        gpr.held_end = max(now, gpr.held_start or now)
    gpr.save()
    # Its work goes on as ordinary work: the engine counts it against the quota from now on.
    Workload.objects.filter(reservation=gpr).update(reservation=None)


# --- Upkeep (the scheduler's loop) ----------------------------------------------------------------


def upkeep(now: datetime | None = None) -> None:
    """Begin what is due, end what is over, warn before ends, report idle reservations; then keep
    Slurm's reservations like the portal's (apps/provisioning/slurm.py)."""
    now = now or timezone.now()
    changed = False
    for gpr in ProvisioningRequest.objects.filter(state=State.APPROVED, held_start__lte=now).select_related(
        "workspace"
    ):
        with transaction.atomic():
            if ProvisioningRequest.objects.filter(pk=gpr.pk, state=State.APPROVED).update(
                state=State.ACTIVE, activated_at=now
            ):
                gpr.refresh_from_db()
                _log(Event.GPR_BEGIN, gpr, None, SYSTEM, "began",
                     f"Began: {gpr.gpus} {gpr.gpu_type} held for workspace {gpr.workspace.name} until "
                     f"{_when(gpr.held_end)}.")  # fmt: skip
                changed = True
    for gpr in ProvisioningRequest.objects.filter(state=State.ACTIVE, held_end__lte=now).select_related("workspace"):
        with transaction.atomic():
            if ProvisioningRequest.objects.filter(pk=gpr.pk, state=State.ACTIVE).update(
                state=State.ENDED, ended_at=now
            ):
                Workload.objects.filter(reservation=gpr).update(reservation=None)
                _log(Event.GPR_END, gpr, None, SYSTEM, "ended", "Ended: its GPUs went back to everyone.")
                changed = True
        _mail(gpr, f"GPR {gpr.pk} has ended", f"Your reservation of {gpr.gpus} {gpr.gpu_type} has ended.")
    _warn(now)
    _watch_idle(now)
    if changed:
        request_cycle()


def _warn(now: datetime) -> None:
    due = now + timedelta(seconds=settings.PORTAL_GPR_WARN_BEFORE_S)
    for gpr in ProvisioningRequest.objects.filter(state=State.ACTIVE, held_end__lte=due, warned_at__isnull=True):
        if not ProvisioningRequest.objects.filter(pk=gpr.pk, warned_at__isnull=True).update(warned_at=now):
            continue
        assert gpr.held_end is not None
        left = _minutes(gpr.held_end - now)
        _step(gpr, "warned", f"Ends in {left}: its holder was warned.", None)
        _mail(
            gpr,
            f"GPR {gpr.pk} ends in {left}",
            f"Your reservation of {gpr.gpus} {gpr.gpu_type} in workspace {gpr.workspace.name} ends at "
            f"{_when(gpr.held_end)}. Work still running there then goes on under the workspace's quota (and may "
            f"wait or be preempted). Extend it from its page if you need more time.",
        )


def in_use(gpr: ProvisioningRequest) -> int:
    """How many of its GPUs the holder's work uses now."""
    return (
        Allocation.objects.filter(workload__reservation=gpr, gpu__in=gpr.devices.all())
        .values("gpu_id")
        .distinct()
        .count()
    )


def _watch_idle(now: datetime) -> None:
    """An active reservation its holder runs nothing on is idle from when it began or its work last
    ended; idle for PORTAL_GPR_IDLE_S it is reported, once per idle stretch."""
    for gpr in ProvisioningRequest.objects.filter(state=State.ACTIVE).select_related("workspace"):
        busy = Workload.objects.filter(reservation=gpr, state__in=_holding_states()).exists()
        if busy:
            if gpr.idle_since is not None:
                ProvisioningRequest.objects.filter(pk=gpr.pk).update(idle_since=None, idle_reported_at=None)
            continue
        if gpr.idle_since is None:
            ProvisioningRequest.objects.filter(pk=gpr.pk).update(idle_since=now)
            continue
        if gpr.idle_reported_at is None and (now - gpr.idle_since).total_seconds() >= settings.PORTAL_GPR_IDLE_S:
            ProvisioningRequest.objects.filter(pk=gpr.pk).update(idle_reported_at=now)
            idle = _minutes(now - gpr.idle_since)
            _step(gpr, "idle", f"Idle for {idle}: the workspace runs nothing on its {gpr.gpus} GPUs.", None)
            _mail(gpr, f"GPR {gpr.pk} stands idle",
                  f"Your reservation of {gpr.gpus} {gpr.gpu_type} has run nothing for {idle}. Release it from its "
                  f"page if you no longer need it: others are waiting for GPUs.")  # fmt: skip


def _holding_states() -> set[str]:
    return {state for traits in scheduled().values() for state in traits.holding}


# --- Helpers ---------------------------------------------------------------------------------------


def is_admin(user: Any) -> bool:
    return bool(getattr(user, "is_staff", False))


def _locked(gpr: ProvisioningRequest, states: tuple[str, ...], verb: str) -> ProvisioningRequest:
    rows = ProvisioningRequest.objects.select_for_update(of=("self",)).select_related("workspace", "held_cluster")
    row = rows.get(pk=gpr.pk)
    if row.state not in states:
        raise Conflict(f"GPR {row.pk} is {row.get_state_display().lower()}: it cannot be {verb}.")
    return row


def _log(event: Event, gpr: ProvisioningRequest, acting_user: Any, origin: Origin, kind: str, message: str,
         data: dict[str, Any] | None = None) -> None:  # fmt: skip
    do_log_event(event, gpr, acting_user=acting_user, origin=origin, workspace=gpr.workspace,
                 data={"state": gpr.state, **(data or {})})  # fmt: skip
    _step(gpr, kind, message, acting_user)


def _step(gpr: ProvisioningRequest, kind: str, message: str, acting_user: Any) -> None:
    actor = acting_user if getattr(acting_user, "pk", None) else None
    ProvisioningEvent.objects.create(request=gpr, kind=kind, message=message[:1000], actor=actor)


def _when(moment: datetime | None) -> str:
    return f"{moment:%a %d %b %Y %H:%M} UTC" if moment is not None else "-"


def _minutes(delta: timedelta) -> str:
    minutes = max(0, round(delta.total_seconds() / 60))
    return f"{minutes} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def page_url(gpr: ProvisioningRequest) -> str:
    try:
        path = reverse("web:gpr", kwargs={"ws": gpr.workspace.name, "pk": gpr.pk})
    except NoReverseMatch:  # the web pages are not installed
        path = f"/api/v1/gprs/{gpr.pk}/"
    return settings.PORTAL_PUBLIC_URL.rstrip("/") + path


def _mail_decision(gpr: ProvisioningRequest) -> None:
    if gpr.state == State.APPROVED:
        how = "by the workspace's policy" if gpr.auto_approved else "by an admin"
        body = (
            f"Your request for {gpr.gpus} {gpr.gpu_type} in workspace {gpr.workspace.name} was approved {how}.\n"
            f"It holds them on {gpr.held_cluster.name if gpr.held_cluster else '-'} from {_when(gpr.held_start)} "
            f"until {_when(gpr.held_end)}; the workspace's work runs there first, without counting against its "
            f"quota."
        )
        if gpr.decision_reason:
            body += f"\n\n{gpr.decision_reason}"
        _mail(gpr, f"GPR {gpr.pk} approved: {gpr.gpus} {gpr.gpu_type} from {_when(gpr.held_start)}", body)
    elif gpr.state == State.REJECTED:
        _mail(gpr, f"GPR {gpr.pk} rejected", f"Your request for {gpr.gpus} {gpr.gpu_type} in workspace "
              f"{gpr.workspace.name} was rejected:\n\n{gpr.decision_reason}")  # fmt: skip


def _mail(gpr: ProvisioningRequest, subject: str, body: str) -> None:
    """Mail the requester; a failure is logged (the request's page says the same)."""
    user = gpr.requested_by
    if user is None or not user.email:
        return
    message = EmailMessage(subject=subject, body=f"{body}\n\n{page_url(gpr)}\n", to=[user.email])
    try:
        message.send()
    except Exception:
        logger.warning("could not mail the requester of GPR %s", gpr.pk, exc_info=True)
