"""GPU reservations (provisioning requests, apps/provisioning): the workspace's requests, the form
that asks for GPUs ahead of time with its as-you-type estimate (the calendar's earliest feasible
start, and whether the workspace's policy approves it at once), a request's page (its timeline, the
use of what it holds, and Cancel / Release early / Extend or shrink), and the cluster's calendar of
reservations over the next two weeks, which the console shows too.

Every page finds the workspace, and the request in it, through the access layer: another tenant's
request is a 404, and a viewer, who sees the pages, is refused every change with a 403. Changes
go through the requests' actions (apps/provisioning/actions.py), as the API's do.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.db.models import Count, F, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_POST

from apps.errors import ActionError, Conflict
from apps.inventory.models import Allocation, Cluster
from apps.provisioning import actions
from apps.provisioning.models import ProvisioningRequest
from apps.web import gpr_forms
from apps.web.common import Errors, action_kwargs, get_for, may_change, page, refused, signed_in, workspace_for
from apps.workspaces.access import CHANGE
from apps.workspaces.models import Workspace

State = ProvisioningRequest.State
# The tone of each state's badge (the classes of web/_state.html's badges).
TONES = {
    State.REQUESTED: "wait", State.APPROVED: "done", State.ACTIVE: "ok", State.ENDED: "off", State.REJECTED: "bad",
    State.CANCELLED: "off", State.RELEASED: "off",
}  # fmt: skip
PAST_SHOWN = 50
CALENDAR_DAYS = 14
# The timeline's bars are drawn on this many units across (an SVG's viewBox: no inline style).
SCALE = 1000
MODIFY_FIELDS = {"gpus", "duration"}


def tone(gpr: ProvisioningRequest) -> str:
    return TONES.get(State(gpr.state), "off")


# -- the list ----------------------------------------------------------------------------------------


def with_use(gprs: list[ProvisioningRequest]) -> list[ProvisioningRequest]:
    """Each request with ``used`` (the GPUs its holder's work uses now, as `actions.in_use` counts
    them) in one query for the whole list; ``held`` comes annotated."""
    active = [g.pk for g in gprs if g.state == State.ACTIVE]
    used = dict(
        Allocation.objects.filter(workload__reservation_id__in=active, gpu__reservations=F("workload__reservation"))
        .values_list("workload__reservation")
        .annotate(n=Count("gpu", distinct=True))
        .values_list("workload__reservation", "n")
    )
    for gpr in gprs:
        gpr.used = used.get(gpr.pk, 0)  # type: ignore[attr-defined]
        gpr.tone = tone(gpr)  # type: ignore[attr-defined]
    return gprs


def listed(workspace: Workspace) -> QuerySet[ProvisioningRequest]:
    return (
        ProvisioningRequest.objects.filter(workspace=workspace)
        .select_related("requested_by", "cluster", "held_cluster")
        .annotate(held=Count("devices"))
    )


@signed_in
def gpr_list(request: HttpRequest, ws: str) -> HttpResponse:
    """The workspace's open requests, then its last finished ones."""
    workspace = workspace_for(request, ws)
    rows = listed(workspace)
    context = {
        "workspace": workspace,
        "may_change": may_change(request, workspace),
        "open": with_use(list(rows.filter(state__in=ProvisioningRequest.OPEN_STATES))),
        "past": with_use(list(rows.filter(state__in=ProvisioningRequest.FINAL_STATES)[:PAST_SHOWN])),
        "policy": actions.policy_of(workspace),
    }
    return page(request, "web/gprs/list.html", context)


# -- a new request, and its estimate --------------------------------------------------------------------


def auto_approves(workspace: Workspace, asked: actions.Asked) -> str | None:
    """Why the workspace's policy would leave these terms to an admin; None if it approves them at once."""
    return actions.auto_refusal(asked)


@signed_in
def gpr_new(request: HttpRequest, ws: str) -> HttpResponse:
    """Ask for GPUs: a type, how many, where (or any cluster), from when, for how long, how urgent
    and why. A refusal is shown beside its field, with a 400."""
    workspace = workspace_for(request, ws, CHANGE)
    errors: Errors = {}
    if request.method == "POST":
        values = {name: request.POST.get(name, "") for name in gpr_forms.FIELDS}
        gpr = _create(request, workspace, errors)
        if gpr is not None:
            messages.success(request, _created_message(gpr))
            return redirect("web:gpr", ws=workspace.name, pk=gpr.pk)
    else:
        values = {**dict.fromkeys(gpr_forms.FIELDS, ""), **gpr_forms.DEFAULTS}
        values.update({name: request.GET[name] for name in gpr_forms.FIELDS if name in request.GET})
    types = gpr_forms.gpu_types_for(workspace)
    values["gpu_type"] = values["gpu_type"] or (types[0] if types else "")
    context = {
        "workspace": workspace,
        "values": values,
        "errors": errors,
        "gpu_types": types,
        "clusters": list(gpr_forms.gpu_clusters()),
        "policy": actions.policy_of(workspace),
        "now_input": gpr_forms.local_input(timezone.now()),
    }
    return page(request, "web/gprs/new.html", context, status=400 if errors else 200)


def _create(request: HttpRequest, workspace: Workspace, errors: Errors) -> ProvisioningRequest | None:
    terms = gpr_forms.read_terms(request.POST, workspace, errors)
    if terms is None:
        return None
    try:
        asked = actions.check_request(workspace, **terms.asked())
        return actions.do_request(asked, priority=terms.priority, justification=terms.justification,
                                  **action_kwargs(request))  # fmt: skip
    except ActionError as exc:
        refused(exc, errors, set(gpr_forms.FIELDS) | {"duration_s"})
        if "duration_s" in errors:
            errors.setdefault("duration", []).extend(errors.pop("duration_s"))
    return None


def _created_message(gpr: ProvisioningRequest) -> str:
    if gpr.state == State.APPROVED:
        held = when(gpr.held_start)
        return f"Request {gpr.pk} was approved by the workspace's policy: its GPUs are held from {held}."
    return f"Request {gpr.pk} was sent: it waits for an admin's decision, and you will be mailed it."


@signed_in
def gpr_estimate(request: HttpRequest, ws: str) -> JsonResponse:
    """The form's terms (GET, as the form names them) checked as a request would be: the earliest
    feasible start and whether the policy approves it at once; or each field's refusal, with a 400."""
    workspace = workspace_for(request, ws, CHANGE)
    errors: Errors = {}
    terms = gpr_forms.read_terms(request.GET, workspace, errors, justified=False)
    if terms is not None:
        try:
            asked = actions.check_request(workspace, **terms.asked())
        except ActionError as exc:
            field = "duration" if exc.field == "duration_s" else exc.field
            errors.setdefault(field if field in gpr_forms.FIELDS else "form", []).append(exc.message)
        else:
            return JsonResponse(_estimate(workspace, asked))
    return JsonResponse({"ok": False, "errors": errors}, status=400)


def _estimate(workspace: Workspace, asked: actions.Asked) -> dict[str, Any]:
    found = asked.found
    why = auto_approves(workspace, asked)
    at_once = found.start <= timezone.now() + timedelta(minutes=2)
    start = "now" if at_once else when(found.start)
    said = f"Earliest feasible start: {start}, {found.gpus} {asked.gpu_type.upper()} on {found.cluster.name}."
    return {
        "ok": True,
        "start": found.start.isoformat(),
        "start_text": start,
        "cluster": found.cluster.name,
        "auto": why is None,
        "why": why,
        "text": said,
        "decision": "Approved at once by the workspace's policy." if why is None else f"Left to an admin: {why}.",
    }


# -- a request's page --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """One device a request holds, and the holder's work on it now."""

    name: str
    used_by: list[str]


def devices_of(gpr: ProvisioningRequest) -> list[Held]:
    devices = list(gpr.devices.select_related("node").order_by("node__name", "index"))
    users: dict[int, list[str]] = {}
    for gpu_id, name in Allocation.objects.filter(workload__reservation=gpr, gpu__in=devices).values_list(
        "gpu_id", "workload__name"
    ):
        users.setdefault(gpu_id, []).append(name)
    return [Held(f"{gpu.node.name}:{gpu.index}", sorted(set(users.get(gpu.pk, [])))) for gpu in devices]


def gpr_of(request: HttpRequest, workspace: Workspace, pk: int) -> ProvisioningRequest:
    """The request of the URL, through the access layer: another tenant's is a 404."""
    queryset = ProvisioningRequest.objects.select_related("workspace", "requested_by", "decided_by", "cluster",
                                                          "held_cluster")  # fmt: skip
    return get_for(request, queryset, pk=pk, workspace=workspace)  # type: ignore[no-any-return]


def buttons(gpr: ProvisioningRequest) -> dict[str, bool]:
    """Which changes its state allows (shown to those who may change the workspace's work)."""
    return {
        "cancel": gpr.state in (State.REQUESTED, State.APPROVED),
        "release": gpr.state == State.ACTIVE,
        "modify": gpr.state in ProvisioningRequest.OPEN_STATES and not gpr.pending_change,
    }


def detail_page(request: HttpRequest, workspace: Workspace, gpr: ProvisioningRequest, *, errors: Errors | None = None,
                status: int = 200, values: dict[str, str] | None = None) -> HttpResponse:  # fmt: skip
    gpr.tone = tone(gpr)  # type: ignore[attr-defined]
    devices = devices_of(gpr)
    pending_end = gpr.pending_change and datetime.fromisoformat(gpr.pending_change["held_end"])
    context = {
        "workspace": workspace,
        "gpr": gpr,
        "events": list(gpr.events.select_related("actor")),
        "devices": devices,
        "used": sum(1 for d in devices if d.used_by),
        "may_change": may_change(request, workspace),
        "can": buttons(gpr),
        "pending_end": pending_end,
        "errors": errors or {},
        "values": values or gpr_forms.duration_fields(gpr.duration_s) | {"gpus": str(gpr.gpus)},
    }
    return page(request, "web/gprs/detail.html", context, status=status)


@signed_in
def gpr_detail(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    workspace = workspace_for(request, ws)
    return detail_page(request, workspace, gpr_of(request, workspace, pk))


def _changed(request: HttpRequest, ws: str, pk: int, change: Any, done: str) -> HttpResponse:
    """Make a change of the request (POST; a member's): its message on success; a conflict (its
    state no longer allows it) is a 409 and any other refusal a 400, each shown on its page."""
    workspace = workspace_for(request, ws, CHANGE)
    gpr = gpr_of(request, workspace, pk)
    try:
        change(gpr)
    except Conflict as exc:
        return detail_page(request, workspace, gpr_of(request, workspace, pk), errors={"form": [exc.message]},
                           status=409)  # fmt: skip
    except ActionError as exc:
        errors: Errors = {}
        refused(exc, errors, MODIFY_FIELDS | {"duration_s"})
        if "duration_s" in errors:
            errors["duration"] = errors.pop("duration_s")
        return detail_page(request, workspace, gpr, errors=errors, status=400, values=request.POST.dict())
    messages.success(request, done)
    return redirect("web:gpr", ws=workspace.name, pk=gpr.pk)


# What each irreversible change asks first (GET), and says once done (POST).
CONFIRM = {
    "cancel": (
        "Cancel request #{pk}?",
        "It is withdrawn before it begins: the GPUs it would hold go back to the calendar at once. Ask again for "
        "another reservation.",
        "Cancel the request",
    ),
    "release": (
        "Release reservation #{pk} early?",
        "Its GPUs go back to everyone now, before its end. The workspace's work that runs there goes on as "
        "ordinary work, under the workspace's quota: it may wait or be preempted like any other.",
        "Release the GPUs",
    ),
}


def _confirm(request: HttpRequest, ws: str, pk: int, what: str) -> HttpResponse:
    """Ask before an irreversible change: a member's page with one button that posts it back."""
    workspace = workspace_for(request, ws, CHANGE)
    gpr = gpr_of(request, workspace, pk)
    question, text, button = CONFIRM[what]
    context = {"workspace": workspace, "gpr": gpr, "question": question.format(pk=gpr.pk), "text": text,
               "button": button}  # fmt: skip
    return page(request, "web/gprs/confirm.html", context)


@signed_in
def gpr_cancel(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    if request.method != "POST":
        return _confirm(request, ws, pk, "cancel")
    return _changed(request, ws, pk, lambda gpr: actions.do_cancel(gpr, **action_kwargs(request)),
                    f"Request {pk} was cancelled.")  # fmt: skip


@signed_in
def gpr_release(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    if request.method != "POST":
        return _confirm(request, ws, pk, "release")
    return _changed(request, ws, pk, lambda gpr: actions.do_release(gpr, **action_kwargs(request)),
                    f"Reservation {pk} was released: its GPUs went back to everyone.")  # fmt: skip


@signed_in
@require_POST
def gpr_modify(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """Fewer GPUs, or another length (longer may wait for an admin: the page says so)."""
    errors: Errors = {}
    gpus = gpr_forms.gpu_count(request.POST.get("gpus", ""), errors)
    duration_s = gpr_forms.duration_of(request.POST, errors)
    if errors:
        workspace = workspace_for(request, ws, CHANGE)
        gpr = gpr_of(request, workspace, pk)
        return detail_page(request, workspace, gpr, errors=errors, status=400, values=request.POST.dict())

    def modify(gpr: ProvisioningRequest) -> None:
        actions.do_modify(gpr, gpus=gpus, duration_s=duration_s, **action_kwargs(request))

    return _changed(request, ws, pk, modify, f"Request {pk} was changed: its timeline says how.")


# -- the calendar ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One reservation on the calendar: who holds what, when, and where its bar lies (in SCALE units)."""

    gpr: ProvisioningRequest
    devices: list[str]
    x: int
    width: int
    mine: bool


def calendar_context(request: HttpRequest, *, mine: Workspace | None = None) -> dict[str, Any]:
    """The chosen cluster's (?cluster=, else the default) approved and active reservations over the
    next CALENDAR_DAYS days, for the workspace's calendar and the console's. `mine`: the workspace
    whose requests link to their page (the console's link to all)."""
    clusters = list(gpr_forms.gpu_clusters())
    chosen = next((c for c in clusters if c.name == request.GET.get("cluster")), clusters[0] if clusters else None)
    now = timezone.now()
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)  # the days are whole UTC days
    end = start + timedelta(days=CALENDAR_DAYS)
    return {
        "clusters": clusters,
        "cluster": chosen,
        "bars": bars(chosen, start, end, mine) if chosen else [],
        "days": [start + timedelta(days=i) for i in range(CALENDAR_DAYS)],
        "day_lines": [round(SCALE * i / CALENDAR_DAYS) for i in range(1, CALENDAR_DAYS)],
        "now_x": round(SCALE * (now - start).total_seconds() / (end - start).total_seconds()),
        "calendar_end": end,
        "scale": SCALE,
    }


def bars(cluster: Cluster, start: datetime, end: datetime, mine: Workspace | None) -> list[Bar]:
    rows = (
        ProvisioningRequest.objects.filter(state__in=ProvisioningRequest.HOLDING_STATES, held_cluster=cluster,
                                           held_start__lt=end, held_end__gt=start)
        .select_related("workspace")
        .prefetch_related("devices__node")
        .order_by("held_start", "pk")
    )  # fmt: skip
    span = (end - start).total_seconds()
    found = []
    for gpr in rows:
        assert gpr.held_start is not None and gpr.held_end is not None
        left = max(0.0, (gpr.held_start - start).total_seconds()) / span
        right = min(1.0, (gpr.held_end - start).total_seconds() / span)
        gpr.tone = tone(gpr)  # type: ignore[attr-defined]
        names = [f"{d.node.name}:{d.index}" for d in sorted(gpr.devices.all(), key=lambda d: (d.node.name, d.index))]
        x = round(left * SCALE)
        found.append(Bar(gpr, names, x, max(2, round(right * SCALE) - x), mine is None or gpr.workspace_id == mine.pk))
    return found


@signed_in
def gpr_calendar(request: HttpRequest, ws: str) -> HttpResponse:
    """Who holds which GPUs of a cluster, and when, over the next two weeks: every workspace's
    reservations (their size and time, never their justification)."""
    workspace = workspace_for(request, ws)
    context = {"workspace": workspace, **calendar_context(request, mine=workspace)}
    return page(request, "web/gprs/calendar.html", context)


def when(moment: datetime | None) -> str:
    """A moment as the requests' timeline and mails say it: "Fri 27 Nov 2026 14:00 UTC"."""
    return f"{moment:%a %d %b %Y %H:%M} UTC" if moment is not None else "—"
