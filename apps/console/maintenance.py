"""Node maintenance for admins: every node with its state and the portal's maintenance of it
(cordon, drain, back: one button each), and the maintenance windows, announced with a form
(apps/inventory/maintenance.py does each change; the API's serializer checks the form as it checks a
request)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from apps.console.forms import form_data, save
from apps.errors import ActionError
from apps.inventory import maintenance
from apps.inventory.api import MaintenanceWindowSerializer
from apps.inventory.models import Allocation, Cluster, MaintenanceWindow, Node
from apps.web.common import Errors, action_kwargs, admin_only, page

STATE_TONES = {"ready": "ok", "drained": "warn", "down": "bad", "failed": "bad", "powered_down": "off",
               "powering_up": "busy", "powering_down": "busy"}  # fmt: skip
MAINTENANCE_TONES = {"cordoned": "warn", "draining": "busy", "drained": "off"}
WINDOW_TONES = {"scheduled": "warn", "active": "busy", "ended": "off"}
TEXT = ("cluster", "start_at", "end_at", "reason")
VERBS = {"cordon": "cordoned", "drain": "being drained", "uncordon": "back in service"}


def _render(
    request: HttpRequest, *, values: dict[str, Any] | None = None, errors: Errors | None = None
) -> HttpResponse:
    nodes = list(Node.objects.select_related("pool__cluster", "cordoned_by").annotate(devices=Count("gpus"))
                 .order_by("pool__cluster__name", "name"))  # fmt: skip
    busy = dict(Allocation.objects.values_list("gpu__node_id").annotate(n=Count("workload", distinct=True)))
    for node in nodes:
        node.workloads = busy.get(node.pk, 0)  # type: ignore[attr-defined]
    windows = MaintenanceWindow.objects.select_related("cluster", "created_by").prefetch_related("nodes")
    context = {
        "nodes": nodes,
        "windows": list(windows.order_by("-start_at", "-id")[:50]),
        "clusters": Cluster.objects.order_by("name"),
        "values": values or {},
        "errors": errors or {},
        "state_tones": STATE_TONES,
        "maintenance_tones": MAINTENANCE_TONES,
        "window_tones": WINDOW_TONES,
        "now": timezone.now(),
        "live_workspaces": [],
    }
    return page(request, "console/maintenance.html", context, status=400 if errors else 200)


@admin_only
def maintenance_page(request: HttpRequest) -> HttpResponse:
    return _render(request)


@admin_only
@require_POST
def node_action(request: HttpRequest, pk: int, verb: str) -> HttpResponse:
    """Cordon, drain or bring back one node; Slurm's refusal is shown as the page's message."""
    if verb not in VERBS:
        raise Http404("No such maintenance action.")
    node = get_object_or_404(Node.objects.select_related("pool__cluster"), pk=pk)
    reason = request.POST.get("reason", "").strip()[:300]
    try:
        if verb == "cordon":
            maintenance.do_cordon_node(node, reason=reason, **action_kwargs(request))
        elif verb == "drain":
            maintenance.do_drain_node(node, reason=reason, **action_kwargs(request))
        else:
            maintenance.do_uncordon_node(node, **action_kwargs(request))
        messages.success(request, f"Node {node.name} is {VERBS[verb]}.")
    except ActionError as exc:
        messages.error(request, exc.message)
    return HttpResponseRedirect(f"{reverse('console:maintenance')}#node-{node.pk}")


@admin_only
@require_POST
def window_create(request: HttpRequest) -> HttpResponse:
    """Announce a window: the users whose work it affects are mailed."""
    data = form_data(request, TEXT, lists=("nodes",))

    def perform(checked: dict[str, Any]) -> MaintenanceWindow:
        nodes = checked.pop("node_list", None)
        return maintenance.check_save_window(MaintenanceWindow(), checked, nodes=nodes, **action_kwargs(request))

    saved, errors = save(request, MaintenanceWindowSerializer, data, perform, fields={*TEXT, "nodes"})
    if saved is None:
        return _render(request, values={**{n: request.POST.get(n, "") for n in TEXT},
                                        "nodes": request.POST.getlist("nodes")}, errors=errors)  # fmt: skip
    messages.success(request, f"Maintenance window announced to {saved.workspaces.count()} workspace(s).")
    return HttpResponseRedirect(f"{reverse('console:maintenance')}#window-{saved.pk}")


@admin_only
@require_POST
def window_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """Withdraw a window (one under way ends first: its nodes come back)."""
    window = get_object_or_404(MaintenanceWindow, pk=pk)
    maintenance.do_delete_window(window, **action_kwargs(request))
    messages.success(request, "Maintenance window withdrawn.")
    return HttpResponseRedirect(reverse("console:maintenance"))
