"""Notebooks: the list (ready or still deploying), create on an instance, open, delete."""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from apps.catalog.models import NotebookProfile
from apps.compute import actions
from apps.compute.api import NotebookSerializer
from apps.compute.models import Instance, Notebook
from apps.errors import ActionError
from apps.web.common import (
    Errors,
    action_kwargs,
    get_for,
    is_fragment,
    may_change,
    page,
    refused,
    serializer_context,
    signed_in,
    validated,
    workspace_for,
)
from apps.workspaces.access import CHANGE

PER_PAGE = 50
FIELDS = {"name", "description", "profile", "instance"}
# Instances a notebook can be put on (the launch action refuses the others).
HOSTS = (Instance.State.QUEUED, Instance.State.PROVISIONING, Instance.State.RUNNING)


@signed_in
def notebook_list(request: HttpRequest, ws: str) -> HttpResponse:
    workspace = workspace_for(request, ws)
    show = request.GET.get("show", "live")
    rows = Notebook.objects.filter(workspace=workspace).select_related("instance", "profile")
    if show != "all":
        rows = rows.filter(state__in=[*Notebook.LIVE_STATES, Notebook.State.FAILED])
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
    workspace = workspace_for(request, ws, CHANGE)
    source = request.POST if request.method == "POST" else request.GET
    values = {k: source.get(k, "").strip() for k in FIELDS}
    errors: Errors = {}
    if request.method == "POST":
        data = {k: v for k, v in values.items() if v or k == "description"}
        serializer = NotebookSerializer(data=data, context=serializer_context(request))
        checked = validated(serializer, errors)
        if checked is not None:
            instance = checked.pop("instance")
            try:
                notebook = actions.check_launch_notebook(
                    instance.workspace, instance=instance, **checked, **action_kwargs(request)
                )
            except ActionError as exc:
                refused(exc, errors, FIELDS)
            else:
                messages.success(request, f"Notebook {notebook.name} is starting.")
                return redirect("web:notebook", ws=workspace.name, pk=notebook.pk)
    context = {
        "workspace": workspace,
        "values": values,
        "errors": errors,
        "profiles": NotebookProfile.objects.visible_to(request.user).filter(published=True).order_by("name"),
        "hosts": Instance.objects.filter(workspace=workspace, state__in=HOSTS).select_related("profile"),
    }
    return page(request, "web/notebooks/new.html", context, status=400 if errors else 200)


@signed_in
def notebook_detail(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    workspace = workspace_for(request, ws)
    notebook = get_for(
        request, Notebook.objects.select_related("instance", "profile", "created_by"), pk=pk, workspace=workspace
    )
    context = {
        "workspace": workspace,
        "notebook": notebook,
        "may_change": may_change(request, workspace),
        "absolute_url": request.build_absolute_uri(notebook.url) if notebook.url else "",
    }
    template = "web/notebooks/_status.html" if is_fragment(request) else "web/notebooks/detail.html"
    return page(request, template, context)


@signed_in
def notebook_delete(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """GET asks for confirmation; POST stops the notebook for good."""
    workspace = workspace_for(request, ws, CHANGE)
    notebook = get_for(request, Notebook.objects.select_related("instance"), pk=pk, workspace=workspace)
    errors: Errors = {}
    if request.method == "POST":
        try:
            actions.do_delete_notebook(notebook, **action_kwargs(request))
        except ActionError as exc:
            errors["form"] = [exc.message]
        else:
            messages.success(request, f"Notebook {notebook.name} was deleted.")
            return redirect("web:notebooks", ws=workspace.name)
    context = {"workspace": workspace, "notebook": notebook, "errors": errors}
    return page(request, "web/notebooks/delete.html", context, status=409 if errors else 200)
