"""Instances: the list, the three-step launch wizard, the detail page and its collaborators,
delete, kubeconfig."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.catalog.models import ComputeProfile
from apps.compute import actions, collaborators
from apps.compute.api import InstanceSerializer
from apps.compute.kubeconfig import read_kubeconfig
from apps.compute.models import Collaborator, Instance, Notebook
from apps.errors import ActionError
from apps.invitations import actions as invitations
from apps.invitations.models import Invitation
from apps.web.common import (
    Errors,
    action_kwargs,
    get_for,
    is_fragment,
    is_member,
    may_change,
    page,
    posted_email,
    refused,
    resend_or_withdraw,
    sent_message,
    serializer_context,
    shared_for,
    signed_in,
    validated,
    workspace_for,
)
from apps.web.telemetry import gpu_panel
from apps.workspaces.access import CHANGE, USE, may
from apps.workspaces.models import Workspace

PER_PAGE = 50
STEP_FIELDS = {1: {"name", "description"}, 2: {"profile"}}


@signed_in
def instance_list(request: HttpRequest, ws: str) -> HttpResponse:
    workspace = workspace_for(request, ws)
    show = request.GET.get("show", "live")
    rows = Instance.objects.filter(workspace=workspace).select_related("profile")
    if show != "all":
        rows = rows.filter(state__in=[*Instance.LIVE_STATES, Instance.State.FAILED])
    page_obj = Paginator(rows, PER_PAGE).get_page(request.GET.get("page"))
    context = {"workspace": workspace, "page_obj": page_obj, "show": show, "may_change": may_change(request, workspace)}
    template = "web/instances/_table.html" if is_fragment(request) else "web/instances/list.html"
    return page(request, template, context)


def allowed_profiles(request: HttpRequest, workspace: Workspace) -> list[ComputeProfile]:
    """The profiles the user may launch here: what the catalog shows them, narrowed by the workspace's policy.

    The launch action checks both again; this only decides which cards to show.
    """
    profiles = ComputeProfile.objects.visible_to(request.user).filter(published=True)
    allowed = list(workspace.allowed_profiles.values_list("pk", flat=True))
    if allowed:
        profiles = profiles.filter(pk__in=allowed)
    return list(profiles.order_by("gpu_count", "cpu_cores", "name"))


def _step_of(errors: Errors, default: int) -> int:
    """The first wizard step that has a field with an error."""
    for step, fields in sorted(STEP_FIELDS.items()):
        if fields & set(errors):
            return step
    return default


@signed_in
def instance_new(request: HttpRequest, ws: str) -> HttpResponse:
    """Launch in three steps: 1. name and description, 2. size, 3. review and launch."""
    workspace = workspace_for(request, ws, CHANGE)
    profiles = allowed_profiles(request, workspace)
    values = {k: request.POST.get(k, request.GET.get(k, "")).strip() for k in ("name", "description", "profile")}
    errors: Errors = {}
    step = 1
    if request.method == "POST":
        current = int(request.POST.get("step", "1") or 1)
        goto = int(request.POST.get("goto", current + 1) or current + 1)
        data = {"workspace": workspace.name, **{k: v for k, v in values.items() if v or k != "profile"}}
        if goto <= current:
            step = max(1, goto)
        else:
            serializer = InstanceSerializer(data=data, partial=current < 2, context=serializer_context(request))
            checked = validated(serializer, errors)
            if current == 1:
                errors = {k: v for k, v in errors.items() if k in STEP_FIELDS[1]}
            if current == 2 and not errors:
                size = next((p for p in profiles if p.name == values["profile"]), None)
                reason = actions.why_not_launchable(workspace, size) if size is not None else ""
                if reason:  # refused at the step that offers it, not at the last one
                    errors["profile"] = [reason]
            if errors:
                step = _step_of(errors, current)
            elif current < 3:
                step = current + 1
            else:
                assert checked is not None
                checked.pop("workspace")
                try:
                    instance = actions.check_launch_instance(workspace, **checked, **action_kwargs(request))
                except ActionError as exc:
                    refused(exc, errors, STEP_FIELDS[1] | STEP_FIELDS[2])
                    step = _step_of(errors, 3)
                else:
                    messages.success(request, f"Instance {instance.name} is launching.")
                    return redirect("web:instance", ws=workspace.name, pk=instance.pk)
    chosen = next((p for p in profiles if p.name == values["profile"]), None)
    if step == 2:  # sizes the workspace could never hold are shown, disabled, with the launch's reason
        for profile in profiles:
            profile.unavailable = actions.why_not_launchable(workspace, profile)  # type: ignore[attr-defined]
    context = {
        "workspace": workspace,
        "step": step,
        "steps": [(1, "Name"), (2, "Size"), (3, "Launch")],
        "values": values,
        "errors": errors,
        "profiles": profiles,
        "chosen": chosen,
    }
    return page(request, "web/instances/new.html", context, status=400 if errors else 200)


def kubeconfig_of(instance: Instance) -> str | None:
    """The instance's kubeconfig, where its backend has one now (a Kubernetes namespace); else None."""
    try:
        return read_kubeconfig(instance)
    except ActionError:
        return None


@signed_in
def instance_detail(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """An instance, for its workspace and for those it is shared with; its members see and change
    its collaborators here too (`instance_collaborators`)."""
    queryset = Instance.objects.select_related("workspace", "profile", "cluster", "created_by")
    workspace, instance = shared_for(request, ws, queryset, pk)
    if is_fragment(request):
        return page(request, "web/instances/_status.html", {"workspace": workspace, "instance": instance})
    return page(request, "web/instances/detail.html", _detail_context(request, workspace, instance))


def _detail_context(request: HttpRequest, workspace: Workspace, instance: Instance, **extra: Any) -> dict[str, Any]:
    member = is_member(request, workspace)
    changes = member and may_change(request, workspace)
    context = {
        "workspace": workspace,
        "instance": instance,
        "member": member,
        "notebooks": instance.notebooks.filter(state__in=Notebook.LIVE_STATES).select_related("profile"),
        "has_kubeconfig": kubeconfig_of(instance) is not None,
        "may_change": changes,
        "may_use": may(request.user, instance, USE),
        "collaborators": instance.collaborators.select_related("user").order_by("user__username"),
        "accesses": Collaborator.Access.choices,
        "shared_invitations": _pending_invitations(instance) if changes else [],
        "invitation_days": settings.PORTAL_INVITATION_DAYS,
        "errors": {},
        "values": {"email": "", "access": Collaborator.Access.WRITE},
        **extra,
    }
    if not member:  # a collaborator's page hears this instance alone
        context["live_workspaces"] = [f"instance:{instance.pk}"]
    if instance.gpus_per_replica:
        url = reverse("web:instance-gpu", kwargs={"ws": workspace.name, "pk": instance.pk})
        context.update(gpu_panel(workload_id=instance.pk, url=url))
    return context


def _pending_invitations(instance: Instance) -> list[Invitation]:
    rows = Invitation.objects.filter(instance=instance, accepted_at__isnull=True, withdrawn_at__isnull=True)
    return list(rows.select_related("invited_by").order_by("-created_at")[:200])


@signed_in
@require_POST
def instance_collaborators(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """Share the instance by email, change a collaborator's access, remove one; resend or withdraw
    an invitation. For the workspace's members and owners: a collaborator gets a 403 here, anyone
    else a 404."""
    workspace, instance = shared_for(request, ws, Instance.objects.select_related("workspace"), pk)
    if not (is_member(request, workspace) and may_change(request, workspace)):
        raise PermissionDenied(f"Your role in workspace {workspace.name} does not allow this.")
    errors: Errors = {}
    done = _collaborator_change(request, instance, errors)
    if done is not None:
        messages.success(request, done)
        return redirect("web:instance", ws=workspace.name, pk=instance.pk)
    values = {"email": request.POST.get("email", ""), "access": request.POST.get("access", "write")}
    context = _detail_context(request, workspace, instance, errors=errors, values=values)
    return page(request, "web/instances/detail.html", context, status=400)


def _collaborator_change(request: HttpRequest, instance: Instance, errors: Errors) -> str | None:
    """Apply one change from the Collaborators panel; the message once done, or None with `errors`."""
    what = request.POST.get("action", "")
    access = request.POST.get("access", "")
    base_url = request.build_absolute_uri("/")
    try:
        if what == "invite":
            email = posted_email(request, errors)
            if email is None:
                return None
            invited = invitations.do_invite(
                instance.workspace,
                email,
                "",
                base_url=base_url,
                instance=instance,
                access=access,
                **action_kwargs(request),
            )
            return sent_message(invited, f"{email} was invited to {instance.name}, {_access_label(access)}")
        if what in ("resend", "withdraw"):
            invitation = get_object_or_404(Invitation, pk=request.POST.get("invitation") or 0, instance=instance)
            return resend_or_withdraw(request, invitation, what)
        collaborator = get_object_or_404(Collaborator, pk=request.POST.get("collaborator") or 0, instance=instance)
        name = collaborator.user.get_username()
        if what == "access":
            collaborators.do_set_collaborator(instance, collaborator.user, access, **action_kwargs(request))
            return f"{name} now has {_access_label(access)} access to {instance.name}."
        if what == "remove":
            collaborators.do_remove_collaborator(collaborator, **action_kwargs(request))
            return f"{name} no longer has access to {instance.name}."
    except ActionError as exc:
        errors[exc.field if what == "invite" and exc.field in ("email", "access") else "form"] = [exc.message]
        return None
    errors["form"] = ["Unknown change."]
    return None


def _access_label(access: str) -> str:
    return "read-write" if access == Collaborator.Access.WRITE else "read-only"


@signed_in
def instance_delete(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """GET asks for confirmation (deleting is irreversible); POST deletes."""
    workspace = workspace_for(request, ws, CHANGE)
    instance = get_for(request, Instance.objects.select_related("profile"), pk=pk, workspace=workspace)
    errors: Errors = {}
    if request.method == "POST":
        try:
            actions.do_delete_instance(instance, **action_kwargs(request))
        except ActionError as exc:
            errors["form"] = [exc.message]
        else:
            messages.success(request, f"Instance {instance.name} was deleted.")
            return redirect("web:instances", ws=workspace.name)
    live_notebooks = instance.notebooks.filter(state__in=Notebook.LIVE_STATES).count()
    context = {"workspace": workspace, "instance": instance, "errors": errors, "live_notebooks": live_notebooks}
    return page(request, "web/instances/delete.html", context, status=409 if errors else 200)


@signed_in
@require_POST
def instance_describe(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """Change the description, the one thing that changes on a launched instance."""
    workspace = workspace_for(request, ws, CHANGE)
    instance = get_for(request, Instance.objects.all(), pk=pk, workspace=workspace)
    description = request.POST.get("description", "")
    serializer = InstanceSerializer(
        instance, data={"description": description}, partial=True, context=serializer_context(request)
    )
    errors: Errors = {}
    data = validated(serializer, errors)
    if data is not None:
        actions.do_update_instance(instance, **data, **action_kwargs(request))
        messages.success(request, "Description saved.")
    else:
        messages.error(request, " ".join(errors.get("description", ["The description was not saved."])))
    return redirect("web:instance", ws=workspace.name, pk=instance.pk)


@signed_in
def instance_kubeconfig(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """The kubeconfig: for members, and for collaborators with write access."""
    workspace, instance = shared_for(request, ws, Instance.objects.select_related("workspace", "cluster"), pk, USE)
    config = kubeconfig_of(instance)
    if config is None:
        raise Http404("This instance has no kubeconfig.")
    response = HttpResponse(config, content_type="application/yaml")
    response["Content-Disposition"] = f'attachment; filename="{workspace.name}-{instance.name}.kubeconfig"'
    response["Cache-Control"] = "no-store"  # a credential
    return response
