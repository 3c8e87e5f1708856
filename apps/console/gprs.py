"""GPU requests for admins: the queue of requests waiting for a decision, by priority then age, each
with its earliest feasible start now and what approving it would displace (the running work on the
devices the calendar would give it that has not ended by then, and how much work of its GPU type
waits in other workspaces); Approve (as asked, or later, with fewer GPUs or shorter) and Reject
(with a reason, which the requester is mailed); extensions asked for after approval; and the
cluster's calendar of reservations (apps/web/gprs.py draws it for workspaces too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_POST

from apps.errors import ActionError, Conflict
from apps.provisioning import actions
from apps.provisioning.models import ProvisioningRequest
from apps.provisioning.slots import Found, find_slot
from apps.web import gpr_forms
from apps.web.common import Errors, action_kwargs, admin_only, page, refused
from apps.web.gprs import calendar_context, tone
from apps.workloads.kinds import scheduled
from apps.workloads.models import Workload

State = ProvisioningRequest.State
APPROVE_FIELDS = {"start_at", "gpus", "duration", "reason"}


@dataclass(frozen=True)
class Displaced:
    """Running work that approving a request would stop or keep off its devices."""

    name: str
    kind: str
    workspace: str
    ends_at: datetime | None  # its declared end; None: none declared


@dataclass
class Pending:
    """A request in the queue, with what the calendar says of it now."""

    gpr: ProvisioningRequest
    found: Found | None
    displaced: list[Displaced]
    queued_elsewhere: int
    errors: Errors = field(default_factory=dict)


def displaced_by(gpr: ProvisioningRequest, found: Found) -> list[Displaced]:
    """The running work on the devices `found` gives the request whose declared end (its start plus
    its runtime limit) is after the reservation's start, or that declares none."""
    holding = Q(pk__in=[])
    for kind, traits in scheduled().items():
        holding |= Q(kind=kind, state__in=traits.holding)
    rows = list(
        Workload.objects.filter(holding, allocations__gpu_id__in=found.gpu_ids)
        .exclude(reservation=gpr)
        .select_related("workspace")
        .distinct()
        .order_by("workspace__name", "name")
    )
    limits: dict[int, tuple[bool, float | None]] = {}
    for kind, traits in scheduled().items():
        if traits.details is not None:
            limits.update(traits.details(row.pk for row in rows if row.kind == kind))
    found_rows = []
    for row in rows:
        began = row.started_at or row.admitted_at
        limit = limits.get(row.pk, (False, None))[1]
        ends = began + timedelta(seconds=limit) if began is not None and limit is not None else None
        if ends is None or ends > found.start:
            found_rows.append(Displaced(row.name, row.kind, row.workspace.name, ends))
    return found_rows


def queued_elsewhere(gpr: ProvisioningRequest) -> int:
    """How many workloads of the request's GPU type wait for admission in other workspaces."""
    waiting = Q(pk__in=[])
    for kind, traits in scheduled().items():
        waiting |= Q(kind=kind, state=traits.queued)
    return (
        Workload.objects.filter(waiting, podsets__gpu_type=gpr.gpu_type)
        .exclude(workspace=gpr.workspace)
        .distinct()
        .count()
    )


def pending(gpr: ProvisioningRequest, now: datetime) -> Pending:
    found = find_slot(gpu_type=gpr.gpu_type, gpus=gpr.gpus, duration_s=gpr.duration_s,
                      not_before=max(gpr.start_at, now), cluster=gpr.cluster, ignoring=gpr)  # fmt: skip
    gpr.tone = tone(gpr)  # type: ignore[attr-defined]
    return Pending(gpr, found, displaced_by(gpr, found) if found else [], queued_elsewhere(gpr))


def queue_page(request: HttpRequest, *, errors: dict[int, Errors] | None = None, status: int = 200) -> HttpResponse:
    now = timezone.now()
    waiting = (
        ProvisioningRequest.objects.filter(state=State.REQUESTED)
        .select_related("workspace", "requested_by", "cluster")
        .order_by("-priority", "created_at", "pk")
    )
    rows = [pending(gpr, now) for gpr in waiting]
    for row in rows:
        row.errors = (errors or {}).get(row.gpr.pk, {})
    changes = list(
        ProvisioningRequest.objects.filter(state__in=ProvisioningRequest.HOLDING_STATES, pending_change__isnull=False)
        .select_related("workspace", "requested_by", "held_cluster")
        .order_by("created_at")
    )
    for gpr in changes:
        gpr.tone = tone(gpr)  # type: ignore[attr-defined]
        gpr.errors = (errors or {}).get(gpr.pk, {})  # type: ignore[attr-defined]
        gpr.asked_end = datetime.fromisoformat(gpr.pending_change["held_end"])  # type: ignore[attr-defined]
    context = {"rows": rows, "changes": changes, "now_input": gpr_forms.local_input(now), "live_workspaces": []}
    return page(request, "console/gprs.html", context, status=status)


@admin_only
def gpr_queue(request: HttpRequest) -> HttpResponse:
    return queue_page(request)


def _decided(request: HttpRequest, pk: int, decide: Any, done: str) -> HttpResponse:
    """Make an admin's decision: its message on success; a refusal shown beside the request's form
    (a 400), or a conflict (decided meanwhile) above the queue (a 409)."""
    gpr = get_object_or_404(ProvisioningRequest.objects.select_related("workspace"), pk=pk)
    try:
        decide(gpr)
    except Conflict as exc:
        messages.error(request, exc.message)
        return queue_page(request, status=409)
    except ActionError as exc:
        errors: Errors = {}
        refused(exc, errors, APPROVE_FIELDS | {"duration_s"})
        if "duration_s" in errors:
            errors["duration"] = errors.pop("duration_s")
        return queue_page(request, errors={pk: errors}, status=400)
    messages.success(request, done)
    return redirect("console:gprs")


@admin_only
@require_POST
def gpr_approve(request: HttpRequest, pk: int) -> HttpResponse:
    """Approve as asked, or from a later start, with fewer GPUs or for a shorter time; with a reason."""
    errors: Errors = {}
    start_at = gpr_forms.later_start(request.POST, errors)
    post = request.POST
    gpus = gpr_forms.gpu_count(post["gpus"], errors) if post.get("gpus", "").strip() else None
    duration_s = gpr_forms.duration_of(post, errors) if post.get("duration", "").strip() else None
    if errors:
        return queue_page(request, errors={pk: errors}, status=400)

    def approve(gpr: ProvisioningRequest) -> None:
        actions.do_approve(gpr, start_at=start_at, gpus=gpus, duration_s=duration_s,
                           reason=post.get("reason", "").strip(), **action_kwargs(request))  # fmt: skip

    return _decided(request, pk, approve, f"Request {pk} was approved; its requester was mailed.")


@admin_only
@require_POST
def gpr_reject(request: HttpRequest, pk: int) -> HttpResponse:
    reason = request.POST.get("reason", "").strip()
    return _decided(request, pk, lambda gpr: actions.do_reject(gpr, reason=reason, **action_kwargs(request)),
                    f"Request {pk} was rejected; its requester was mailed why.")  # fmt: skip


@admin_only
@require_POST
def gpr_change(request: HttpRequest, pk: int) -> HttpResponse:
    """Approve or refuse an extension asked for after approval."""
    approve = request.POST.get("decision") == "approve"

    def decide(gpr: ProvisioningRequest) -> None:
        actions.do_decide_change(gpr, approve=approve, reason=request.POST.get("reason", "").strip(),
                                 **action_kwargs(request))  # fmt: skip

    return _decided(request, pk, decide, f"The extension of request {pk} was {'approved' if approve else 'refused'}.")


@admin_only
def gpr_calendar(request: HttpRequest) -> HttpResponse:
    context = {**calendar_context(request), "live_workspaces": []}
    return page(request, "console/gprs_calendar.html", context)
