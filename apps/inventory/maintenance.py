"""Node maintenance: cordon (no new work), drain (work moved off or waited out), back in service,
and maintenance windows announced ahead to the users whose work they affect.

The portal's maintenance of a node lives in its own columns (``Node.cordoned_at`` and the rest), apart
from the state the cluster reports, so that a discovery never undoes it; the scheduler's adapter
gives a cordoned node no free share. A drain evicts, through each kind's ``preempt`` hook and with
the preemption grace, the work that may be moved (preemptible jobs and Ray clusters: requeued);
asks an inference endpoint's replicas there to make way (make before break: the endpoint starts a
replacement elsewhere and stops each once its replacement serves, or at ``PORTAL_DRAIN_REPLACE_S``;
see apps/inference/scaling.py); and waits out the rest (instances and their notebooks, work its
owner marked not preemptible). It is done once nothing holds a device there and what it evicted
has stopped: then the node is "drained".

On Slurm the node is also drained in Slurm itself (``scontrol update state=drain``), so that Slurm
starts nothing there, and resumed when it comes back. Slurm is asked before anything is written
and never under a row lock: if Slurm refuses, the portal changes nothing.

``upkeep()``, run from the scheduler's loop, begins and ends the windows that are due and notes
the drains that are done.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.audit.actions import SYSTEM, Origin, do_log_event
from apps.audit.events import Event
from apps.errors import ActionError, Conflict
from apps.inventory.actions import ClusterUnavailable
from apps.inventory.models import GPU, Allocation, Cluster, MaintenanceWindow, Node
from apps.scheduling.trigger import request_cycle
from apps.workloads.kinds import scheduled
from apps.workloads.models import Workload
from workers.backends.base import BackendError

logger = logging.getLogger(__name__)

#: The state of an evicted workload that is still stopping (a job in its grace).
STOPPING = "PREEMPTED"


# --- Slurm's own view of the node ------------------------------------------------------------------


def _slurm(node: Node, verb: str, reason: str = "") -> None:
    """Drain or resume a Slurm cluster's node in Slurm too; nothing for other clusters (the portal's
    cordon is all the local backend needs). Slurm's refusal is an ``ActionError``, its silence
    ``ClusterUnavailable``."""
    cluster = node.pool.cluster
    if cluster.kind != Cluster.Kind.SLURM:
        return
    from workers.backends import slurm_power

    try:
        if verb == "drain":
            slurm_power.drain([node.name], f"gpuportal: {reason or 'maintenance'}")
        else:
            slurm_power.resume([node.name])
    except BackendError as exc:
        if exc.permanent:
            raise ActionError(exc.message) from None
        raise ClusterUnavailable(f"Could not reach Slurm cluster {cluster.name}: {exc.message}") from None


# --- Cordon, drain, back ---------------------------------------------------------------------------


def _locked(node: Node) -> Node:
    return Node.objects.select_for_update(of=("self",)).select_related("pool__cluster").get(pk=node.pk)


def do_cordon_node(node: Node, *, reason: str = "", acting_user: Any = None, origin: Origin = SYSTEM) -> Node:
    """Place no new work on the node; what runs there goes on. On Slurm, the node is drained in
    Slurm as well. Cordoning a cordoned node only changes its reason."""
    reason = " ".join(reason.split())[:300]
    _slurm(node, "drain", reason)
    with transaction.atomic():
        node = _locked(node)
        if node.cordoned_at is not None:
            if reason and reason != node.maintenance_reason:
                node.maintenance_reason = reason
                node.save(update_fields=["maintenance_reason", "updated_at"])
            return node
        node.cordoned_at, node.cordoned_by, node.maintenance_reason = timezone.now(), _user(acting_user), reason
        node.save(update_fields=["cordoned_at", "cordoned_by", "maintenance_reason", "updated_at"])
        do_log_event(Event.NODE_CORDON, node, acting_user=acting_user, origin=origin, data={"reason": reason})
    return node


def do_drain_node(
    node: Node,
    *,
    reason: str = "",
    grace_s: float | None = None,
    window: MaintenanceWindow | None = None,
    acting_user: Any = None,
    origin: Origin = SYSTEM,
) -> Node:
    """Cordon the node and move its work off: each workload holding a device there that its kind
    may preempt (and its owner allows) is evicted with `grace_s` (the preemption grace unless
    given) and requeued; an endpoint's replicas are replaced elsewhere, then stopped; the others
    are waited out. The drain is done, and the node "drained", once nothing holds a device there
    and what was evicted or replaced has stopped."""
    reason = " ".join(reason.split())[:300] or "maintenance"
    grace = float(settings.PORTAL_PREEMPTION_GRACE_S if grace_s is None else grace_s)
    _slurm(node, "drain", reason)
    with transaction.atomic():
        node = _locked(node)
        now = timezone.now()
        if node.cordoned_at is None:
            node.cordoned_at, node.cordoned_by = now, _user(acting_user)
        node.maintenance_reason = reason
        node.maintenance_window = window or node.maintenance_window
        draining = node.drain_requested_at is not None
        if not draining:
            node.drain_requested_at, node.drained_at = now, None
        node.save()
        why = f"node {node.name} is drained for maintenance: {reason}"
        evicted, replaced, waited = _evict(node, why, grace)
        node.drain_evicted.add(*evicted, *replaced)
        if not draining:
            data = {"reason": reason, "grace_s": grace, "evicted": [str(w) for w in evicted],
                    "replaced": [str(w) for w in replaced], "waited_out": [str(w) for w in waited],
                    "window": window.pk if window else None}  # fmt: skip
            do_log_event(Event.NODE_DRAIN, node, acting_user=acting_user, origin=origin, data=data)
        _finish_drain(node, now)
        request_cycle()
    return node


def _evict(node: Node, reason: str, grace_s: float) -> tuple[list[Workload], ...]:
    """Evict the node's movable work, and ask the kinds that replace theirs elsewhere before they
    stop (an endpoint's replicas, its minimum too) to make way; the evicted, the replaced and the
    waited-out workloads."""
    kinds = scheduled()
    holding = Workload.objects.filter(allocations__gpu__node=node).distinct().order_by("pk")
    evicted, replaced, waited = [], [], []
    making_way: dict[str, list[int]] = defaultdict(list)
    for workload in holding:
        scheduling = kinds.get(workload.kind)
        if scheduling is not None and scheduling.make_way is not None:
            making_way[workload.kind].append(workload.pk)
            replaced.append(workload)
        elif scheduling is not None and scheduling.preempt is not None and workload.preemptible:
            scheduling.preempt(workload.pk, reason, grace_s)
            evicted.append(workload)
        else:
            waited.append(workload)
    for kind, pks in making_way.items():
        make_way = kinds[kind].make_way
        assert make_way is not None
        make_way(pks, reason)
    return evicted, replaced, waited


def _finish_drain(node: Node, now: datetime) -> bool:
    """Note the drain done where nothing holds a device on the node any more and what it evicted has
    stopped; whether it is done."""
    if node.drain_requested_at is None or node.drained_at is not None:
        return node.drained_at is not None
    if Allocation.objects.filter(gpu__node=node).exists() or node.drain_evicted.filter(state=STOPPING).exists():
        return False
    node.drained_at = now
    node.save(update_fields=["drained_at", "updated_at"])
    node.drain_evicted.clear()
    do_log_event(Event.NODE_DRAINED, node, data={"requested_at": node.drain_requested_at.isoformat()})
    return True


def do_uncordon_node(node: Node, *, acting_user: Any = None, origin: Origin = SYSTEM) -> Node:
    """Bring the node back into service: work may be placed there again (a drain under way ends;
    what it waited out goes on). On Slurm, the node is resumed in Slurm."""
    _slurm(node, "resume")
    with transaction.atomic():
        node = _locked(node)
        if node.cordoned_at is None:
            return node
        was = node.maintenance
        node.cordoned_at = node.cordoned_by = node.drain_requested_at = node.drained_at = None
        node.maintenance_reason, node.maintenance_window = "", None
        node.save()
        node.drain_evicted.clear()
        _keep_replaced(node)
        do_log_event(Event.NODE_UNCORDON, node, acting_user=acting_user, origin=origin, data={"was": was})
        request_cycle()
    return node


def _keep_replaced(node: Node) -> None:
    """The node is back before the replacements of what made way there served: that work stays."""
    kinds = scheduled()
    staying: dict[str, list[int]] = defaultdict(list)
    for pk, kind in Workload.objects.filter(allocations__gpu__node=node).distinct().values_list("pk", "kind"):
        if kind in kinds and kinds[kind].stay is not None:
            staying[kind].append(pk)
    for kind, pks in staying.items():
        stay = kinds[kind].stay
        assert stay is not None
        stay(pks)


def _user(acting_user: Any) -> Any:
    return acting_user if getattr(acting_user, "is_authenticated", False) else None


# --- Maintenance windows ---------------------------------------------------------------------------


def check_save_window(
    window: MaintenanceWindow,
    fields: dict[str, Any],
    *,
    nodes: Iterable[Node] | None = None,
    acting_user: Any,
    origin: Origin = SYSTEM,
) -> MaintenanceWindow:
    """Announce a window (an unsaved one) or change a scheduled one. `fields`: cluster, start_at,
    end_at, reason; `nodes`: of that cluster (none: all of its nodes). A new window, or a new time or
    nodes of a scheduled one, is mailed to the users whose work it affects (running there, or queued
    and able to be placed there); a window under way may only have its end and reason changed."""
    created = window.pk is None
    if not created and window.state == "ended":
        raise Conflict("This maintenance window has ended.")
    if not created and window.state == "active" and set(fields) - {"end_at", "reason"}:
        raise Conflict("A maintenance window under way may only have its end and reason changed.")
    for name, value in fields.items():
        setattr(window, name, value)
    named = list(nodes) if nodes is not None else None
    _validate_window(window, named)
    with transaction.atomic():
        window.created_by = window.created_by if not created else _user(acting_user)
        window.save()
        if named is not None:
            window.nodes.set(named)
        data = {k: v.isoformat() if isinstance(v, datetime) else str(v) for k, v in fields.items()}
        if named is not None:
            data["nodes"] = ", ".join(n.name for n in named)
        do_log_event(Event.MAINTENANCE_CREATE if created else Event.MAINTENANCE_UPDATE, window,
                     acting_user=acting_user, origin=origin, data=data)  # fmt: skip
        if window.state == "scheduled":
            mail = _affected(window)
            window.workspaces.set({w.workspace_id for ws in mail.values() for w in ws})
            if created or named is not None or {"start_at", "end_at", "cluster"} & set(fields):
                window.announced_at = timezone.now()
                window.save(update_fields=["announced_at"])
                transaction.on_commit(lambda: _announce(window, mail, changed=not created))
    return window


def _validate_window(window: MaintenanceWindow, nodes: list[Node] | None) -> None:
    if window.end_at <= window.start_at:
        raise ActionError("The window must end after it starts.", field="end_at")
    if window.end_at <= timezone.now():
        raise ActionError("The window must end in the future.", field="end_at")
    if not window.reason.strip():
        raise ActionError("Say why: users read it.", field="reason")
    stray = [n.name for n in nodes or () if n.pool.cluster_id != window.cluster_id]
    if stray:
        raise ActionError(f"{', '.join(stray)} not in cluster {window.cluster.name}.", field="nodes")


def do_delete_window(window: MaintenanceWindow, *, acting_user: Any, origin: Origin = SYSTEM) -> None:
    """Withdraw a window; one under way ends first (its nodes come back)."""
    if window.state == "active":
        _end_window(window, acting_user=acting_user, origin=origin)
    with transaction.atomic():
        do_log_event(Event.MAINTENANCE_DELETE, window, acting_user=acting_user, origin=origin,
                     data={"reason": window.reason})  # fmt: skip
        window.delete()


def _affected(window: MaintenanceWindow) -> dict[Any, list[Workload]]:
    """The workloads a window affects, by the user who submitted each: those holding a device on its
    nodes, and those queued that may be placed there (for any cluster or its, of a GPU type its
    nodes have)."""
    nodes = window.target_nodes()
    running = Workload.objects.filter(allocations__gpu__node__in=nodes)
    types = set(GPU.objects.filter(node__in=nodes).values_list("gpu_type", flat=True))
    waiting = Q(pk__in=[])
    for kind, traits in scheduled().items():
        waiting |= Q(kind=kind, state=traits.queued)
    queued = Workload.objects.filter(waiting, podsets__gpu_type__in=types, podsets__gpus__gt=0).filter(
        Q(requested_cluster__isnull=True) | Q(requested_cluster=window.cluster)
    )
    rows = (running | queued).distinct().select_related("workspace", "created_by").order_by("pk")
    by_user: dict[Any, list[Workload]] = defaultdict(list)
    for workload in rows:
        if workload.created_by is not None:
            by_user[workload.created_by].append(workload)
    return by_user


def _fate(workload: Workload) -> str:
    """What the window's drain does to it, in the mail."""
    traits = scheduled().get(workload.kind)
    if traits is not None and workload.state == traits.queued:
        return "queued: it is not placed on these nodes during the window"
    if traits is not None and traits.make_way is not None:
        return "replaced at the start: it serves on until its replacement on another node serves"
    if traits is not None and traits.preempt is not None and workload.preemptible:
        return "stopped at the start, with the usual grace to checkpoint, and requeued elsewhere"
    return "left to run: the nodes wait for it to end (stop it before the window to let the work begin)"


def _when(moment: datetime) -> str:
    return f"{moment:%a %d %b %Y %H:%M} UTC"


def window_summary(window: MaintenanceWindow) -> str:
    """One line naming the window: what, when, why (no workload: the banner shows it to every user
    whose work it affects)."""
    named = list(window.nodes.values_list("name", flat=True))
    where = f"nodes {', '.join(named)} of cluster {window.cluster.name}" if named else f"cluster {window.cluster.name}"
    return f"Maintenance of {where} from {_when(window.start_at)} to {_when(window.end_at)}: {window.reason}"


def _announce(window: MaintenanceWindow, mail: dict[Any, list[Workload]], *, changed: bool = False) -> None:
    """Mail each affected user the window (`changed`: its new time or nodes) and their own work it
    affects (never anyone else's)."""
    for user, workloads in mail.items():
        if not user.email:
            continue
        lines = [f"- {w.kind} {w.name} #{w.pk} in workspace {w.workspace.name}: {_fate(w)}" for w in workloads]
        body = (f"{window_summary(window)}.\n\nYour work that it affects:\n" + "\n".join(lines) +
                "\n\nThe nodes take no new work from the start of the window and are back in service at its end.\n"
                f"\n{settings.PORTAL_PUBLIC_URL}/\n")  # fmt: skip
        subject = f"{'Changed: m' if changed else 'M'}aintenance of {window.cluster.name} from {_when(window.start_at)}"
        try:
            EmailMessage(subject=subject, body=body, to=[user.email]).send()
        except Exception:
            logger.warning("could not mail %s about maintenance window %s", user.get_username(), window.pk,
                           exc_info=True)  # fmt: skip


def upcoming_windows(workspaces: QuerySet[Any], now: datetime | None = None) -> QuerySet[MaintenanceWindow]:
    """The windows not yet over that affect work in `workspaces` (a subquery of workspace ids)."""
    now = now or timezone.now()
    return (
        MaintenanceWindow.objects.filter(ended_at__isnull=True, end_at__gt=now, workspaces__in=workspaces)
        .distinct()
        .select_related("cluster")
        .order_by("start_at", "id")
    )


# --- The scheduler loop's upkeep -------------------------------------------------------------------


def upkeep(now: datetime | None = None) -> dict[str, int]:
    """Begin the windows that are due (their nodes drained), end those that are over (their nodes
    back), and note the drains that are done. One window or node that fails does not stop the rest."""
    now = now or timezone.now()
    counts = {"started": 0, "ended": 0, "drained": 0}
    due = MaintenanceWindow.objects.filter(started_at__isnull=True, ended_at__isnull=True, start_at__lte=now)
    for window in due.select_related("cluster"):
        if _guarded(_start_window, window, now):
            counts["started"] += 1
    over = MaintenanceWindow.objects.filter(ended_at__isnull=True, end_at__lte=now)
    for window in over.select_related("cluster"):
        if _guarded(_end_window, window):
            counts["ended"] += 1
    for node in Node.objects.filter(drain_requested_at__isnull=False, drained_at__isnull=True):
        with transaction.atomic():
            if _finish_drain(_locked(node), now):
                counts["drained"] += 1
    return counts


def _guarded(step: Any, *args: Any) -> bool:
    try:
        step(*args)
    except Exception:
        logger.exception("maintenance window %s: %s failed", args[0].pk, step.__name__)
        return False
    return True


def _start_window(window: MaintenanceWindow, now: datetime | None = None) -> None:
    """Drain its nodes (each on its own: one Slurm refuses does not hold the others back)."""
    claimed = MaintenanceWindow.objects.filter(pk=window.pk, started_at__isnull=True).update(
        started_at=now or timezone.now()
    )
    if not claimed:  # another loop began it
        return
    window.refresh_from_db()
    with transaction.atomic():
        do_log_event(Event.MAINTENANCE_START, window, data={"nodes": window.target_nodes().count()})
    for node in window.target_nodes().select_related("pool__cluster"):
        try:
            do_drain_node(node, reason=window.reason, window=window)
        except ActionError as exc:
            logger.warning("maintenance window %s: could not drain %s: %s", window.pk, node.name, exc.message)


def _end_window(window: MaintenanceWindow, *, acting_user: Any = None, origin: Origin = SYSTEM) -> None:
    """Bring back the nodes it drained (not those an admin cordoned apart from it)."""
    claimed = MaintenanceWindow.objects.filter(pk=window.pk, ended_at__isnull=True).update(ended_at=timezone.now())
    if not claimed:
        return
    window.refresh_from_db()
    for node in Node.objects.filter(maintenance_window=window).select_related("pool__cluster"):
        try:
            do_uncordon_node(node, acting_user=acting_user, origin=origin)
        except ActionError as exc:
            logger.warning("maintenance window %s: could not bring %s back: %s", window.pk, node.name, exc.message)
    with transaction.atomic():
        do_log_event(Event.MAINTENANCE_END, window, acting_user=acting_user, origin=origin)
