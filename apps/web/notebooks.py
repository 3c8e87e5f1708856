"""Notebooks: the list (ready or still deploying), create on an instance, a notebook's page (open
it, start it again), delete. The list, the page and the delete confirmation are the generic ones
(apps/web/generic.py), described here."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
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
from apps.web import generic
from apps.web.common import (
    Errors,
    action_kwargs,
    is_fragment,
    is_member,
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

FIELDS = {"name", "description", "profile", "instance"}
# Instances a notebook can be put on (the launch action refuses the others).
HOSTS = (Instance.State.QUEUED, Instance.State.PROVISIONING, Instance.State.RUNNING)


LISTING = generic.Listing(
    kind="notebook",
    title="Notebooks",
    intro="Jupyter on your instances, opened in the browser with your portal sign-in.",
    url_name="web:notebooks",
    rows=lambda workspace: Notebook.objects.filter(workspace=workspace).select_related("instance", "profile"),
    new_url_name="web:notebook-new",
    new_label="New notebook",
    tab_param="show",
    tabs=(
        # What runs, what failed, and what the portal stopped (culled: it can start again).
        generic.Tab(
            "live",
            "Live",
            None,
            "No notebooks running",
            where=Q(state__in=[*Notebook.LIVE_STATES, Notebook.State.FAILED]) | ~Q(stop_reason=""),
        ),
        generic.Tab("all", "All, deleted too", None, "No notebooks"),
    ),
    page_context=lambda workspace: {
        "has_hosts": Instance.objects.filter(workspace=workspace, state__in=HOSTS).exists(),
    },
    empty="{% if has_hosts %}<p>Pick a notebook environment and one of your instances to run it on.</p>"
    '{% if may_change %}<a class="btn btn-primary" href="{% url \'web:notebook-new\' workspace.name %}">New notebook'
    "</a>{% endif %}{% else %}<p>A notebook runs on an instance: launch one first.</p>"
    '{% if may_change %}<a class="btn btn-primary" href="{% url \'web:instance-new\' workspace.name %}">Launch an '
    "instance</a>{% endif %}{% endif %}",
    columns=(
        generic.Column("Name", "<a href=\"{% url 'web:notebook' workspace.name obj.pk %}\">{{ obj.name }}</a>"),
        generic.Column(
            "Instance",
            "<a href=\"{% url 'web:instance' workspace.name obj.instance_id %}\">{{ obj.instance.name }}</a>",
        ),
        generic.Column("Profile", "{{ obj.profile.display_name|default:obj.profile.name }}"),
        generic.Column("Status", '{% include "web/_state.html" with state=obj.state label=obj.get_state_display %}'),
        generic.Column(
            "Open",
            '{% if obj.state == "READY" %}<a class="btn btn-small btn-primary" href="{{ obj.url }}" target="_blank" '
            'rel="noopener">Open Jupyter<span class="visually-hidden"> {{ obj.name }} (new tab)</span></a>'
            '{% elif obj.state == "PENDING" or obj.state == "STARTING" %}<span class="muted small">deploying…</span>'
            "{% endif %}",
            hide_label=True,
        ),
    ),
)


@signed_in
def notebook_list(request: HttpRequest, ws: str) -> HttpResponse:
    return generic.list_page(request, ws, LISTING)


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


# -- a notebook's page ----------------------------------------------------------------------------

# Above its facts: the way in while it is ready, what it waits for, or why it stopped and how to start it again.
STATUS_LEAD = (
    '{% if obj.state == "READY" %}<p><a class="btn btn-primary" id="open-notebook" href="{{ obj.url }}" '
    'target="_blank" rel="noopener">Open Jupyter <span class="visually-hidden">(new tab)</span></a></p>'
    '{% elif obj.state == "PENDING" and obj.instance.state != "RUNNING" %}'
    '<p class="muted">Waiting for its instance to run: this page updates by itself when Jupyter is ready.</p>'
    '{% elif obj.state == "STOPPED" %}{% if obj.stop_reason %}<p class="notice" data-stop-reason>Stopped by the '
    "portal, {{ obj.stop_reason }}. Its files are where they were.</p>{% endif %}"
    "{% if may_use and starts_again %}"
    '<form method="post" action="{% url \'web:notebook-start\' workspace.name obj.pk %}">{% csrf_token %}'
    '<button class="btn btn-primary" type="submit">Start again</button></form>{% endif %}{% endif %}'
)

STATUS = generic.Panel(
    title="Status",
    live=True,
    shows_state=True,
    lead=STATUS_LEAD + '{% include "web/_start_progress.html" %}',
    facts=(
        generic.Fact("Environment", "{{ obj.profile.display_name|default:obj.profile.name }}"),
        generic.Fact("Instance", '<a href="{% url \'web:instance\' workspace.name obj.instance_id %}">'
                     "{{ obj.instance.name }}</a> ({{ obj.instance.get_state_display|lower }})"),
        generic.Fact("Created", '{{ obj.created_at|date:"j M Y, H:i" }}{% if obj.created_by %} by '
                     "{{ obj.created_by.get_username }}{% endif %}"),
        generic.Fact("Ready since", '{% if obj.started_at %}{{ obj.started_at|date:"j M Y, H:i" }}{% endif %}'),
        generic.Fact("URL", "{% if absolute_url %}<code>{{ absolute_url }}</code>{% endif %}"),
        generic.Fact("Token", '{% if may_use %}<div class="secret"><code id="nb-token">{{ obj.access_token }}</code>'
                     '<button type="button" class="btn btn-small" data-copy="nb-token">Copy</button></div>{% endif %}'),
        generic.Fact("Failure", "{{ obj.failure_reason }}"),
    ),
    foot='{% if may_use %}<p class="muted small">It opens on an address of its own, which never sees your portal '
    "sign-in: the portal signs you in to it for you. The token is the Jupyter server's own secret, for clients that "
    "cannot sign in that way (an IDE, a script): send <code>Authorization: token &lt;token&gt;</code>, or add "
    "<code>?token=&lt;token&gt;</code> to its URL.</p>{% endif %}",
)  # fmt: skip

DETAIL = generic.Detail(
    kind="notebook",
    list_title="Notebooks",
    list_url_name="web:notebooks",
    url_name="web:notebook",
    crumb="{% if not member %}Shared with you · <a href=\"{% url 'web:instance' workspace.name obj.instance_id %}\">"
    "{{ obj.instance.name }}</a> in {{ workspace.name }}{% endif %}",
    panels=(
        STATUS,
        generic.Panel(title="GPU utilisation", template="web/_gpu_panel.html", wide=True, needs="gpu_panel"),
    ),
    actions=(
        generic.Action("Delete…", url=generic.object_url("web:notebook-delete"), style="danger",
                       when=lambda notebook: notebook.state != Notebook.State.STOPPED),
    ),
)  # fmt: skip


@signed_in
def notebook_detail(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """A notebook, for its workspace and for those its instance is shared with: who may use it
    (a member, a read-write collaborator) sees its token and may stop it."""
    queryset = Notebook.objects.select_related("workspace", "instance", "profile", "created_by")
    workspace, notebook = shared_for(request, ws, queryset, pk)
    member = is_member(request, workspace)
    extra = {
        "member": member,
        "may_use": may(request.user, notebook, USE),
        "starts_again": notebook.instance.state in HOSTS,
        "absolute_url": request.build_absolute_uri(notebook.url) if notebook.url else "",
    }
    if not member:  # a collaborator's page hears its instance alone
        extra["live_workspaces"] = [f"instance:{notebook.instance_id}"]
    if not is_fragment(request) and notebook.instance.gpus_per_replica:
        url = reverse("web:notebook-gpu", kwargs={"ws": workspace.name, "pk": notebook.pk})
        extra.update(gpu_panel(workload_id=notebook.instance_id, url=url))
    return generic.detail_page(request, workspace, notebook, DETAIL, **extra)


@signed_in
def notebook_delete(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """GET asks for confirmation; POST stops the notebook for good."""
    workspace, notebook = shared_for(request, ws, Notebook.objects.select_related("workspace", "instance"), pk, USE)
    member = is_member(request, workspace)
    errors: Errors = {}
    if request.method == "POST":
        try:
            actions.do_delete_notebook(notebook, **action_kwargs(request))
        except ActionError as exc:
            errors["form"] = [exc.message]
        else:
            messages.success(request, f"Notebook {notebook.name} was deleted.")
            if not member:
                return redirect("web:instance", ws=workspace.name, pk=notebook.instance_id)
            return redirect("web:notebooks", ws=workspace.name)
    return generic.confirm_page(
        request,
        workspace,
        notebook,
        DETAIL,
        question=f"Delete notebook {notebook.name}?",
        text=(
            "The Jupyter server stops and its kernels end. Files it saved stay in the workspace's directory on "
            f"instance {notebook.instance.name}."
        ),
        button="Delete permanently",
        errors=errors,
        refused_status=409,
        member=member,
    )


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
