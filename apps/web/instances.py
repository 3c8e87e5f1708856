"""Instances: the list, the three-step launch wizard, an instance's page and its collaborators,
delete, kubeconfig. The list, the page and the delete confirmation are the generic ones
(apps/web/generic.py), described here."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from apps.catalog.models import ComputeProfile
from apps.compute import actions, collaborators
from apps.compute.api import InstanceSerializer
from apps.compute.kubeconfig import read_kubeconfig
from apps.compute.models import Collaborator, Instance, Notebook
from apps.errors import ActionError
from apps.invitations import actions as invitations
from apps.invitations.models import Invitation
from apps.web import generic
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
from apps.web.templatetags.portal import size
from apps.workspaces.access import CHANGE, USE, may
from apps.workspaces.models import Workspace

STEP_FIELDS = {1: {"name", "description"}, 2: {"profile"}}


LISTING = generic.Listing(
    kind="instance",
    title="Instances",
    intro="Your slices of GPUs, CPU and memory. Notebooks run on them.",
    url_name="web:instances",
    rows=lambda workspace: Instance.objects.filter(workspace=workspace).select_related("profile"),
    new_url_name="web:instance-new",
    new_label="Launch an instance",
    tab_param="show",
    tabs=(
        generic.Tab("live", "Live", (*Instance.LIVE_STATES, Instance.State.FAILED), "No instances running"),
        generic.Tab("all", "All, deleted too", None, "No instances"),
    ),
    empty="<p>Launch one from a size your admin has published: GPUs, CPU and memory reserved for you.</p>"
    '{% if may_change %}<a class="btn btn-primary" href="{% url \'web:instance-new\' workspace.name %}">Launch an '
    "instance</a>{% else %}<p>Your role in this workspace lets you look, not launch.</p>{% endif %}",
    columns=(
        generic.Column(
            "Name",
            "<a href=\"{% url 'web:instance' workspace.name obj.pk %}\">{{ obj.name }}</a>"
            '{% if obj.description %}<div class="muted small">{{ obj.description|truncatechars:80 }}</div>{% endif %}',
        ),
        generic.Column(
            "Size",
            "{{ obj.profile.display_name|default:obj.profile.name }}"
            '<div class="muted small">{{ obj.profile|size }}</div>',
        ),
        generic.Column(
            "Status",
            '{% include "web/_state.html" with state=obj.state label=obj.get_state_display %}'
            '{% if obj.state == "QUEUED" and obj.wait_reason %}<div class="muted small">{{ obj.wait_reason }}</div>'
            "{% endif %}",
        ),
        generic.Column(
            "Launched",
            '<time datetime="{{ obj.created_at|date:\'c\' }}">{{ obj.created_at|date:"j M Y, H:i" }}</time>',
        ),
    ),
)


@signed_in
def instance_list(request: HttpRequest, ws: str) -> HttpResponse:
    return generic.list_page(request, ws, LISTING)


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


# -- an instance's page ---------------------------------------------------------------------------


STATUS = generic.Panel(
    title="Status",
    live=True,
    shows_state=True,
    lead='{% include "web/_start_progress.html" %}',
    facts=(
        generic.Fact("Size", "{{ obj.profile.display_name|default:obj.profile.name }} · {{ obj.profile|size }}"),
        generic.Fact("Launched", '<time datetime="{{ obj.launched_at|date:\'c\' }}">'
                     '{{ obj.launched_at|date:"j M Y, H:i" }}</time>'
                     "{% if obj.created_by %} by {{ obj.created_by.get_username }}{% endif %}"),
        generic.Fact("Running for", "{{ obj.running_for|duration }}"),
        generic.Fact("Cluster", "{% if obj.cluster %}{{ obj.cluster.name }}{% endif %}"),
        generic.Fact("Why it waits", '{% if obj.state == "QUEUED" %}'
                     '{{ obj.wait_reason|default:"waiting for the next scheduling cycle" }}{% endif %}',
                     id="instance-reason"),
        generic.Fact("Queue position", '{% if obj.state == "QUEUED" %}{{ obj.workspace_queue_position|default:"—" }} '
                     'in the workspace, {{ obj.cluster_queue_position|default:"—" }} in the cluster{% endif %}'),
        generic.Fact("Estimated start", '{% if obj.state == "QUEUED" %}{{ obj.estimated_start_at|until }}{% endif %}'),
        generic.Fact("Failure", "{{ obj.failure_reason }}"),
        generic.Fact("Ended by the portal", "{% if obj.stop_reason %}<span data-stop-reason>"
                     "{{ obj.stop_reason }}</span>{% endif %}"),
        generic.Fact("Ended", '{% if obj.finished_at %}{{ obj.finished_at|date:"j M Y, H:i" }}{% endif %}'),
    ),
)  # fmt: skip

DETAIL = generic.Detail(
    kind="instance",
    list_title="Instances",
    list_url_name="web:instances",
    url_name="web:instance",
    crumb='{% if not member %}Shared with you · {{ workspace.display_name|default:workspace.name }}{% endif %}',
    subtitle="{% if not member %}Shared with you, {% if may_use %}read-write: open and start its notebooks, take its "
    "kubeconfig{% else %}read-only: you see it and its notebooks{% endif %}.{% endif %}",
    panels=(
        STATUS,
        generic.Panel(title="Notebooks on this instance", template="web/instances/_notebooks.html", live=True),
        generic.Panel(title="GPU utilisation", template="web/_gpu_panel.html", wide=True, needs="gpu_panel"),
        generic.Panel(title="Collaborators", template="web/instances/_collaborators.html", wide=True, needs="member"),
        generic.Panel(title="Description", template="web/instances/_description.html", wide=True, needs="describes"),
    ),
    actions=(
        generic.Action("New notebook on it", url=lambda workspace, instance: reverse(
            "web:notebook-new", args=[workspace.name]) + f"?instance={instance.pk}",
            when=lambda instance: instance.state not in (Instance.State.DELETED, Instance.State.FAILED)),
        generic.Action("Download kubeconfig", url=generic.object_url("web:instance-kubeconfig"), download=True,
                       when=lambda instance: instance.state != Instance.State.DELETED, needs="has_kubeconfig"),
        generic.Action("Delete…", url=generic.object_url("web:instance-delete"), role=CHANGE, style="danger",
                       when=lambda instance: instance.state != Instance.State.DELETED),
    ),
)  # fmt: skip


@signed_in
def instance_detail(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """An instance, for its workspace and for those it is shared with; its members see and change
    its collaborators here too (`instance_collaborators`)."""
    queryset = Instance.objects.select_related("workspace", "profile", "cluster", "created_by")
    workspace, instance = shared_for(request, ws, queryset, pk)
    return generic.detail_page(request, workspace, instance, DETAIL, **_detail_context(request, workspace, instance))


def _detail_context(request: HttpRequest, workspace: Workspace, instance: Instance, **extra: Any) -> dict[str, Any]:
    """What the page's panels read beside the instance: its live notebooks, and, for its members,
    its collaborators and the invitations to it."""
    member = is_member(request, workspace)
    changes = member and may_change(request, workspace)
    context = {
        "member": member,
        "may_change": changes,
        "may_use": may(request.user, instance, USE),
        "describes": changes and instance.state != Instance.State.DELETED,
        "notebooks": instance.notebooks.filter(state__in=Notebook.LIVE_STATES).select_related("profile"),
        # Only a running instance has one; read from its backend (kubeconfig_of).
        "has_kubeconfig": instance.state == Instance.State.RUNNING and kubeconfig_of(instance) is not None,
        **extra,
    }
    if not member:  # a collaborator's page hears this instance alone
        context["live_workspaces"] = [f"instance:{instance.pk}"]
    if is_fragment(request):  # the live part: the status and the notebooks
        return context
    context.update(
        collaborators=instance.collaborators.select_related("user").order_by("user__username") if member else [],
        accesses=Collaborator.Access.choices,
        shared_invitations=_pending_invitations(instance) if changes else [],
        invitation_days=settings.PORTAL_INVITATION_DAYS,
    )
    context.setdefault("errors", {})
    context.setdefault("values", {"email": "", "access": Collaborator.Access.WRITE})
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
    return generic.detail_page(request, workspace, instance, DETAIL, status=400, **context)


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
    stops = f" and stops its {live_notebooks} notebook{'s' if live_notebooks != 1 else ''}" if live_notebooks else ""
    text = format_html(
        "Deleting <strong>{}</strong> releases its GPUs ({}) at once{}. It is irreversible: the instance cannot be "
        "started again.",
        instance.name,
        size(instance.profile),
        stops,
    )
    return generic.confirm_page(
        request,
        workspace,
        instance,
        DETAIL,
        question=f"Delete instance {instance.name}?",
        text=text,
        button="Delete permanently",
        errors=errors,
        refused_status=409,
        member=True,
    )


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
