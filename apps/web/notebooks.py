"""Notebooks: the list (ready or still deploying), create on an instance, open, delete."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.catalog.models import NotebookProfile
from apps.compute import actions
from apps.compute.api import NotebookSerializer
from apps.compute.models import Instance, Notebook
from apps.errors import ActionError
from apps.web.common import (
    Errors,
    action_kwargs,
    is_fragment,
    is_member,
    may_change,
    page,
    refused,
    serializer_context,
    shared_for,
    signed_in,
    validated,
    workspace_for,
)
from apps.web.telemetry import gpu_panel
from apps.workspaces.access import CHANGE, USE, may, restrict
from apps.workspaces.models import Workspace

PER_PAGE = 50
FIELDS = {"name", "description", "profile", "instance"}
# Instances a notebook can be put on (the launch action refuses the others).
HOSTS = (Instance.State.QUEUED, Instance.State.PROVISIONING, Instance.State.RUNNING)


@signed_in
def notebook_list(request: HttpRequest, ws: str) -> HttpResponse:
    workspace = workspace_for(request, ws)
    show = request.GET.get("show", "live")
    rows = Notebook.objects.filter(workspace=workspace).select_related("instance", "profile")
    if show != "all":  # what runs, what failed, and what the portal stopped (culled: it can start again)
        rows = rows.filter(Q(state__in=[*Notebook.LIVE_STATES, Notebook.State.FAILED]) | ~Q(stop_reason=""))
    context = {
        "workspace": workspace,
        "page_obj": Paginator(rows, PER_PAGE).get_page(request.GET.get("page")),
        "show": show,
        "may_change": may_change(request, workspace),
        "has_hosts": Instance.objects.filter(workspace=workspace, state__in=HOSTS).exists(),
    }
    template = "web/notebooks/_table.html" if is_fragment(request) else "web/notebooks/list.html"
    return page(request, template, context)


@signed_in
def notebook_new(request: HttpRequest, ws: str) -> HttpResponse:
    """Start a notebook on one of the workspace's instances: for its members, and for those an
    instance is shared with, read-write, on that instance."""
    source = request.POST if request.method == "POST" else request.GET
    values = {k: source.get(k, "").strip() for k in FIELDS}
    workspace, hosts = _hosts(request, ws)
    errors: Errors = {}
    if request.method == "POST":
        data = {k: v for k, v in values.items() if v or k == "description"}
        serializer = NotebookSerializer(data=data, context=serializer_context(request))
        checked = validated(serializer, errors)
        if checked is not None and not may(request.user, checked["instance"], USE):
            errors["instance"] = [f"Your access to {checked['instance'].name} does not allow starting notebooks."]
        elif checked is not None:
            instance = checked.pop("instance")
            try:
                notebook = actions.check_launch_notebook(
                    instance.workspace, instance=instance, **checked, **action_kwargs(request)
                )
            except ActionError as exc:
                refused(exc, errors, FIELDS)
            else:
                messages.success(request, f"Notebook {notebook.name} is starting.")
                return redirect("web:notebook", ws=notebook.workspace.name, pk=notebook.pk)
    context = {
        "workspace": workspace,
        "member": is_member(request, workspace),
        "values": values,
        "errors": errors,
        "profiles": NotebookProfile.objects.visible_to(request.user).filter(published=True).order_by("name"),
        "hosts": hosts,
    }
    return page(request, "web/notebooks/new.html", context, status=400 if errors else 200)


def _hosts(request: HttpRequest, ws: str) -> tuple[Workspace, QuerySet[Instance]]:
    """The workspace and the instances in it the user may start a notebook on. A member needs a
    member's role (a viewer: 403); someone with nothing shared here gets a 404, as if it did not exist."""
    workspace = Workspace.objects.filter(name=ws).first()
    if workspace is not None and is_member(request, workspace):
        workspace = workspace_for(request, ws, CHANGE)
    elif workspace is None or not may_start_on(request, workspace, Instance.objects.filter(workspace=workspace)):
        raise Http404("No such workspace.")
    hosts = restrict(Instance.objects.filter(workspace=workspace, state__in=HOSTS), request.user, USE)
    return workspace, hosts.select_related("profile")


def may_start_on(request: HttpRequest, workspace: Workspace, instances: QuerySet[Instance]) -> bool:
    """Whether any of `instances` is shared with the user; a read-only share is refused (403)."""
    if not restrict(instances, request.user).exists():
        return False
    if not restrict(instances, request.user, USE).exists():
        raise PermissionDenied(f"Your access to {workspace.name}'s instances is read-only.")
    return True


@signed_in
def notebook_detail(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """A notebook, for its workspace and for those its instance is shared with: who may use it
    (a member, a read-write collaborator) sees its token and may stop it."""
    queryset = Notebook.objects.select_related("workspace", "instance", "profile", "created_by")
    workspace, notebook = shared_for(request, ws, queryset, pk)
    member = is_member(request, workspace)
    context = {
        "workspace": workspace,
        "notebook": notebook,
        "member": member,
        "may_change": may(request.user, notebook, USE),
        "absolute_url": request.build_absolute_uri(notebook.url) if notebook.url else "",
    }
    if not member:  # a collaborator's page hears its instance alone
        context["live_workspaces"] = [f"instance:{notebook.instance_id}"]
    fragment = is_fragment(request)
    if not fragment and notebook.instance.gpus_per_replica:
        url = reverse("web:notebook-gpu", kwargs={"ws": workspace.name, "pk": notebook.pk})
        context.update(gpu_panel(workload_id=notebook.instance_id, url=url))
    template = "web/notebooks/_status.html" if fragment else "web/notebooks/detail.html"
    return page(request, template, context)


@signed_in
def notebook_delete(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """GET asks for confirmation; POST stops the notebook for good."""
    workspace, notebook = shared_for(request, ws, Notebook.objects.select_related("workspace", "instance"), pk, USE)
    errors: Errors = {}
    if request.method == "POST":
        try:
            actions.do_delete_notebook(notebook, **action_kwargs(request))
        except ActionError as exc:
            errors["form"] = [exc.message]
        else:
            messages.success(request, f"Notebook {notebook.name} was deleted.")
            if not is_member(request, workspace):
                return redirect("web:instance", ws=workspace.name, pk=notebook.instance_id)
            return redirect("web:notebooks", ws=workspace.name)
    context = {"workspace": workspace, "notebook": notebook, "errors": errors}
    return page(request, "web/notebooks/delete.html", context, status=409 if errors else 200)


@signed_in
@require_POST
def notebook_start(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """Start a stopped notebook again: who may use it (a member, a read-write collaborator)."""
    workspace, notebook = shared_for(request, ws, Notebook.objects.select_related("workspace"), pk, USE)
    try:
        actions.do_start_notebook(notebook, **action_kwargs(request))
    except ActionError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Notebook {notebook.name} is starting again.")
    return redirect("web:notebook", ws=workspace.name, pk=notebook.pk)
