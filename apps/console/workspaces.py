"""Workspaces for admins: limits, policies, cohort and fair share, assignment, GPU quotas; cohorts."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from apps.catalog.models import ComputeProfile
from apps.console.forms import form_data, save
from apps.errors import ActionError
from apps.scheduling.limits import borrowing
from apps.web.common import action_kwargs, admin_only, page
from apps.web.usage import quota_use
from apps.workspaces import actions
from apps.workspaces.api import CohortSerializer, GPUQuotaSerializer, WorkspaceSerializer
from apps.workspaces.disks import disk_summary
from apps.workspaces.models import Cohort, GPUQuota, Workspace, WorkspaceDisk

TEXT = (
    "name",
    "display_name",
    "description",
    "assigned_group",
    "assigned_user",
    "max_instances",
    "max_notebooks",
    "cpu_cores",
    "memory_gb",
    "disk_gb",
    "max_runtime_s",
    "max_idle_s",
    "fair_share_weight",
    "cohort",
)
NULLABLE = ("assigned_group", "assigned_user", "max_runtime_s", "max_idle_s", "cohort")
FIELDS = {*TEXT, "assignee_kind", "allowed_profiles", "allowed_gpu_types", "can_borrow"}


@admin_only
def workspace_list(request: HttpRequest) -> HttpResponse:
    workspaces = list(
        Workspace.objects.select_related("cohort", "assigned_group", "assigned_user")
        .prefetch_related(Prefetch("gpu_quotas", queryset=GPUQuota.objects.order_by("gpu_type")))
        .order_by("kind", "name")
    )
    usage: dict[int, list[Any]] = {}
    for row in quota_use(workspaces):
        usage.setdefault(row.workspace_id, []).append(row)
    context = {
        "rows": [(w, usage.get(w.pk, [])) for w in workspaces],
        "cohorts": Cohort.objects.prefetch_related("workspaces").order_by("name"),
        "cohort_values": {},
        "cohort_errors": {},
        "live_workspaces": [],
    }
    return page(request, "console/workspaces.html", context)


def _quotas(workspace: Workspace) -> list[GPUQuota]:
    """The workspace's quotas, each with what it may borrow in the words a refusal uses
    (limits.borrowing: "no borrowing", "2 borrowable")."""
    quotas = list(workspace.gpu_quotas.order_by("gpu_type"))
    for quota in quotas:
        quota.may_borrow = borrowing(workspace, quota)[1]  # type: ignore[attr-defined]
    return quotas


def _values(workspace: Workspace) -> dict[str, Any]:
    values: dict[str, Any] = {name: getattr(workspace, name, "") for name in TEXT}
    values.update(
        assignee_kind=workspace.assignee_kind,
        assigned_group=workspace.assigned_group.name if workspace.assigned_group else "",
        assigned_user=workspace.assigned_user.get_username() if workspace.assigned_user else "",
        cohort=workspace.cohort.name if workspace.cohort else "",
        allowed_profiles=[p.name for p in workspace.allowed_profiles.all()] if workspace.pk else [],
        allowed_gpu_types=", ".join(workspace.allowed_gpu_types),
        can_borrow=workspace.can_borrow,
        max_runtime_s=workspace.max_runtime_s or "",
        max_idle_s=workspace.max_idle_s or "",
    )
    return values


def _submitted(request: HttpRequest, creating: bool) -> dict[str, Any]:
    text = TEXT if creating else tuple(t for t in TEXT if t != "name")
    data = form_data(request, text, lists=("allowed_profiles",), flags=("can_borrow",), nullable=NULLABLE)
    data["assignee_kind"] = request.POST.get("assignee_kind", "")
    data["allowed_gpu_types"] = [t.strip() for t in request.POST.get("allowed_gpu_types", "").split(",") if t.strip()]
    return data


@admin_only
def workspace_edit(request: HttpRequest, name: str | None = None) -> HttpResponse:
    """Create a shared workspace (no name in the URL) or change one's limits and policies."""
    workspace = get_object_or_404(Workspace, name=name) if name else Workspace()
    errors: dict[str, list[str]] = {}
    values = _values(workspace)
    if request.method == "POST":
        data = _submitted(request, workspace.pk is None)
        values = {
            **values,
            **{k: request.POST.get(k, "") for k in TEXT},
            "assignee_kind": data["assignee_kind"],
            "allowed_profiles": data["allowed_profiles"],
            "can_borrow": data["can_borrow"],
            "allowed_gpu_types": request.POST.get("allowed_gpu_types", ""),
        }

        def perform(checked: dict[str, Any]) -> Workspace:
            if workspace.pk is None:
                return actions.do_create_workspace(**checked, **action_kwargs(request))
            return actions.do_update_workspace(workspace, **checked, **action_kwargs(request))

        saved, errors = save(
            request, WorkspaceSerializer, data, perform, instance=workspace if workspace.pk else None, fields=FIELDS
        )
        if saved is not None:
            messages.success(request, f"Workspace {saved.name} saved.")
            return redirect("console:workspace", name=saved.name)
    context = {
        "workspace": workspace if workspace.pk else None,
        "editing": workspace,
        "values": values,
        "errors": errors,
        "quotas": _quotas(workspace) if workspace.pk else [],
        "usage": {row.gpu_type: row for row in quota_use([workspace])} if workspace.pk else {},
        "disk_help": disk_summary(WorkspaceDisk.objects.filter(workspace=workspace).first() if workspace.pk else None),
        "quota_values": {},
        "quota_errors": {},
        "groups": Group.objects.order_by("name"),
        "users": get_user_model().objects.filter(is_active=True).order_by("username"),
        "profiles": ComputeProfile.objects.order_by("name"),
        "cohorts": Cohort.objects.order_by("name"),
        "assignees": Workspace.Assignee.choices,
        "live_workspaces": [],
    }
    return page(request, "console/workspace_form.html", context, status=400 if errors else 200)


@admin_only
@require_POST
def quota_set(request: HttpRequest, name: str) -> HttpResponse:
    """Set one GPU type's quota: nominal GPUs, and how much may be borrowed and lent."""
    workspace = get_object_or_404(Workspace, name=name)
    data = form_data(
        request, ("gpu_type", "gpus", "borrowing_limit", "lending_limit"), nullable=("borrowing_limit", "lending_limit")
    )
    data["workspace"] = workspace.name

    def perform(checked: dict[str, Any]) -> GPUQuota:
        return actions.do_set_gpu_quota(
            workspace,
            checked["gpu_type"],
            gpus=checked["gpus"],
            borrowing_limit=checked.get("borrowing_limit"),
            lending_limit=checked.get("lending_limit"),
            **action_kwargs(request),
        )

    saved, errors = save(
        request, GPUQuotaSerializer, data, perform, fields={"gpu_type", "gpus", "borrowing_limit", "lending_limit"}
    )
    if saved is not None:
        messages.success(request, f"Quota of {workspace.name}: {saved.gpus.normalize():f} × {saved.gpu_type}.")
    else:
        detail = "; ".join(
            f"{k.replace('_', ' ')}: {' '.join(v)}" if k != "form" else " ".join(v) for k, v in errors.items()
        )
        messages.error(request, f"The quota was not saved. {detail}")
    return redirect("console:workspace", name=workspace.name)


@admin_only
@require_POST
def quota_delete(request: HttpRequest, name: str, gpu_type: str) -> HttpResponse:
    quota = get_object_or_404(GPUQuota, workspace__name=name, gpu_type=gpu_type)
    actions.do_delete_gpu_quota(quota, **action_kwargs(request))
    messages.success(request, f"Quota of {name} for {gpu_type} removed.")
    return redirect("console:workspace", name=name)


@admin_only
@require_POST
def cohort_create(request: HttpRequest) -> HttpResponse:
    data = form_data(request, ("name", "description"))
    saved, errors = save(
        request,
        CohortSerializer,
        data,
        lambda checked: actions.do_save_cohort(None, **checked, **action_kwargs(request)),
        fields={"name", "description"},
    )
    if saved is not None:
        messages.success(request, f"Cohort {saved.name} created; put workspaces in it from their page.")
    else:
        messages.error(request, "The cohort was not created. " + " ".join(m for v in errors.values() for m in v))
    return redirect("console:workspaces")


@admin_only
@require_POST
def cohort_delete(request: HttpRequest, name: str) -> HttpResponse:
    cohort = get_object_or_404(Cohort, name=name)
    try:
        actions.do_delete_cohort(cohort, **action_kwargs(request))
    except ActionError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Cohort {name} deleted; its workspaces no longer lend to each other.")
    return redirect("console:workspaces")
