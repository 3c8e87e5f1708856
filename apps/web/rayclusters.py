"""Ray clusters: the workspace's list, the create form, a cluster's page (its head and workers, its
dashboard while it runs, why it waits, its log and artifacts), its GPU chart, and delete.

The list and the page are the generic ones (apps/web/generic.py), described here; the form parses
its fields with the API's own serializer and creates through `check_create_cluster`, so it refuses
what the API refuses, in the same words.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse

from apps.catalog.models import ComputeProfile
from apps.errors import ActionError
from apps.rayclusters import actions
from apps.rayclusters.api import RayClusterSerializer
from apps.rayclusters.models import RayCluster
from apps.web import generic
from apps.web.common import (
    Errors,
    action_kwargs,
    get_for,
    is_fragment,
    page,
    refused,
    serializer_context,
    shared_for,
    signed_in,
    validated,
    workspace_for,
)
from apps.web.instances import allowed_profiles
from apps.web.jobs import gpu_types, parse_env
from apps.web.telemetry import gpu_answer, gpu_panel
from apps.workspaces.access import CHANGE, USE, VIEW
from apps.workspaces.models import Workspace

State = RayCluster.State
RUNNING = (State.RUNNING, State.DEGRADED)
ROLES = ("head", "worker")
SIZES = ("gpus", "cpu_cores", "memory_gb")
TEXT_FIELDS = (
    "name", "description", "workers", "gpu_type", "head_profile", "head_gpus", "head_cpu_cores", "head_memory_gb",
    "worker_profile", "worker_gpus", "worker_cpu_cores", "worker_memory_gb", "entrypoint", "image", "env",
    "artifact_paths", "max_runtime_s", "priority",
)  # fmt: skip
# A small cluster to start from: the head runs Ray's own services, one worker does the work (on a
# GPU where the workspace has a GPU type; none makes a CPU-only cluster).
DEFAULTS = {
    "workers": "1", "head_gpus": "0", "head_cpu_cores": "1", "head_memory_gb": "4", "worker_gpus": "1",
    "worker_cpu_cores": "2", "worker_memory_gb": "8", "priority": "0",
}  # fmt: skip
# At most this many nodes are listed on a cluster's page.
NODES_SHOWN = 20


# -- what a cluster's nodes look like --------------------------------------------------------------


@dataclass(frozen=True)
class NodeRow:
    """One node of a cluster on its page: reported by its backend while it runs, or as asked for."""

    name: str
    role: str
    state: str  # a state the badges know (templates/web/_state.html)
    label: str
    gpus: Decimal
    cpu_cores: int
    memory_gb: int


def _down(cluster: RayCluster) -> list[str]:
    """The nodes a running cluster misses: reported dead, or never reported."""
    dead = [str(node.get("name", "")) for node in cluster.nodes if not node.get("alive")]
    missing = 1 + cluster.workers - len(cluster.nodes)
    return dead + ([f"{missing} not reported"] if missing > 0 and cluster.nodes else [])


def nodes_up(cluster: RayCluster) -> int:
    return sum(1 for node in cluster.nodes if node.get("alive"))


def _planned_state(cluster: RayCluster) -> tuple[str, str]:
    """Every node's state while the backend reports none: the cluster's own, in a node's words."""
    if cluster.is_final:
        return "STOPPED", "Ended"
    if cluster.state == State.STOPPING:
        return "STOPPING", "Stopping"
    if cluster.state == State.ADMITTED:
        return "STARTING", "Starting"
    if cluster.state in RUNNING:
        return "RUNNING", "Up"
    return "QUEUED", "Waiting"


def node_rows(cluster: RayCluster) -> tuple[list[NodeRow], int]:
    """The nodes to list and how many more: a small cluster's all, in order; of a large one, the
    head, those down, then the others up to NODES_SHOWN."""
    sizes = {role: tuple(getattr(cluster, f"{role}_{size}") for size in SIZES) for role in ROLES}
    rows: list[NodeRow] = []
    if cluster.state in RUNNING and cluster.nodes:
        for node in cluster.nodes:
            role = "head" if node.get("role") == "head" else "worker"
            state, label = ("RUNNING", "Up") if node.get("alive") else ("FAILED", "Down")
            rows.append(NodeRow(str(node.get("name", "")), role, state, label, *sizes[role]))
        reported = {role: sum(1 for row in rows if row.role == role) for role in ROLES}
        for role, expected in (("head", 1), ("worker", cluster.workers)):
            rows += [NodeRow("(not reported)", role, "FAILED", "Missing", *sizes[role])] * (expected - reported[role])
    else:
        state, label = _planned_state(cluster)
        rows = [NodeRow("head", "head", state, label, *sizes["head"])]
        rows += [NodeRow(f"worker-{i}", "worker", state, label, *sizes["worker"]) for i in range(cluster.workers)]
    if len(rows) > NODES_SHOWN:  # the ones to look at first
        rows.sort(key=lambda row: (row.role != "head", row.state == "RUNNING"))
    return rows[:NODES_SHOWN], max(0, len(rows) - NODES_SHOWN)


def _row_context(cluster: RayCluster) -> dict[str, Any]:
    return {
        "running": cluster.state in RUNNING,
        "nodes_up": nodes_up(cluster),
        "nodes_expected": 1 + cluster.workers,
        "nodes_down": ", ".join(_down(cluster)),
    }


# -- the list --------------------------------------------------------------------------------------

LISTING = generic.Listing(
    kind="raycluster",
    title="Ray clusters",
    intro="A head and workers running Ray together, admitted all at once; its dashboard while it runs.",
    url_name="web:rayclusters",
    rows=lambda workspace: RayCluster.objects.filter(workspace=workspace).select_related("created_by"),
    new_url_name="web:raycluster-new",
    new_label="Create a Ray cluster",
    row_context=_row_context,
    tabs=(
        generic.Tab(
            "live",
            "Live",
            RayCluster.LIVE_STATES,
            "No Ray cluster is live",
            "A cluster you create waits until its head and all its workers fit the quota, then starts.",
        ),
        generic.Tab(
            "ended",
            "Ended",
            RayCluster.FINAL_STATES,
            "No ended clusters yet",
            "Deleted, succeeded and failed clusters stay here with their logs and artifacts.",
        ),
        generic.Tab(
            "all",
            "All",
            None,
            "No Ray clusters yet",
            "A Ray cluster runs a head and workers together for Ray Train, Tune or Data; given an "
            "entrypoint, it runs that one Ray job and ends.",
        ),
    ),  # fmt: skip
    columns=(
        generic.Column(
            "Cluster",
            "<a href=\"{% url 'web:raycluster' workspace.name obj.pk %}\">{{ obj.name }}</a> "
            '<span class="muted small">#{{ obj.pk }}</span>'
            '{% if obj.created_by %}<div class="muted small">by {{ obj.created_by.get_username }}</div>{% endif %}',
        ),
        generic.Column(
            "State",
            '{% include "web/_state.html" with state=obj.state label=obj.get_state_display %}'
            '{% if running %}<div class="muted small">{{ nodes_up }} of {{ nodes_expected }} nodes up</div>{% endif %}',
        ),
        generic.Column(
            "Size",
            '<span class="nowrap">head + {{ obj.workers }} worker{{ obj.workers|pluralize }}</span>'
            '<div class="muted small">'
            "{% if obj.total_gpus %}{{ obj.total_gpus|gpus_of:obj.gpu_type }}"
            "{% else %}CPU only{% endif %}</div>",
        ),
        generic.Column(
            "Queue position",
            '{% if obj.state == "QUEUED" %}{{ obj.workspace_queue_position|default:"—" }}'
            '{% if obj.cluster_queue_position %} <span class="muted small">({{ obj.cluster_queue_position }} in '
            "cluster)</span>{% endif %}{% else %}—{% endif %}",
            classes="num",
            head_classes="num",
        ),
        generic.Column(
            "Reason",
            '{% if obj.state == "QUEUED" or obj.state == "PREEMPTED" %}'
            '{{ obj.wait_reason|default:"waiting for the next scheduling cycle" }}'
            '{% elif obj.state == "DEGRADED" %}down: {{ nodes_down }}'
            '{% elif obj.state == "FAILED" %}{{ obj.failure_reason|truncatechars:120 }}{% endif %}',
            classes="reason",
        ),
        generic.Column(
            "Start",
            '{% if obj.state == "QUEUED" %}{{ obj.estimated_start_at|until }}'
            '{% elif running %}<a class="nowrap" href="{{ obj.dashboard_url }}" target="_blank" '
            'rel="noopener">'
            'Dashboard<span class="visually-hidden"> of {{ obj.name }} (opens a new tab)</span> ↗</a>'
            '{% elif obj.started_at %}<span class="muted small">started {{ obj.started_at|date:"H:i" }}</span>'
            "{% else %}—{% endif %}",
        ),
        generic.Column(
            "Created",
            '<time class="nowrap" datetime="{{ obj.created_at|date:\'c\' }}">'
            '{{ obj.created_at|date:"j M, H:i" }}</time>',
        ),
    ),
)


@signed_in
def raycluster_list(request: HttpRequest, ws: str) -> HttpResponse:
    return generic.list_page(request, ws, LISTING)


# -- a cluster's page ------------------------------------------------------------------------------


def _url(name: str) -> Any:
    return lambda workspace, cluster: reverse(name, kwargs={"ws": workspace.name, "pk": cluster.pk})


STATUS = generic.Panel(
    title="Status",
    live=True,
    shows_state=True,
    empty="Nothing more to say of it yet.",
    facts=(
        generic.Fact("Why it waits", '{% if obj.state == "QUEUED" or obj.state == "PREEMPTED" %}'
                     '{{ obj.wait_reason|default:"waiting for the next scheduling cycle" }}{% endif %}',
                     id="raycluster-reason"),
        generic.Fact("Queue position", '{% if obj.state == "QUEUED" %}{{ obj.workspace_queue_position|default:"—" }} '
                     'in the workspace, {{ obj.cluster_queue_position|default:"—" }} in the cluster{% endif %}'),
        generic.Fact("Estimated start", '{% if obj.state == "QUEUED" %}{{ obj.estimated_start_at|until }}{% endif %}'),
        generic.Fact("Dashboard", '{% if running %}<a href="{{ obj.dashboard_url }}" target="_blank" '
                     'rel="noopener">{{ obj.dashboard_url }}</a><div class="muted small">Ray\'s dashboard and Jobs '
                     "API, through the portal with your sign-in.</div>{% endif %}", id="raycluster-dashboard"),
        generic.Fact("Nodes up", "{% if running %}{{ nodes_up }} of {{ nodes_expected }}"
                     '{% if nodes_down %} <span class="muted small">(down: {{ nodes_down }})</span>{% endif %}'
                     "{% endif %}", id="raycluster-nodes-up"),
        generic.Fact("Runs on", "{% if obj.cluster %}{{ obj.cluster.name }}{% endif %}"),
        generic.Fact("Started", '{% if obj.started_at %}{{ obj.started_at|date:"j M Y, H:i:s" }}{% endif %}'),
        generic.Fact("Finished", '{% if obj.finished_at %}{{ obj.finished_at|date:"j M Y, H:i:s" }}{% endif %}'),
        generic.Fact("Exit code", "{% if obj.exit_code is not None %}{{ obj.exit_code }}{% endif %}",
                     id="raycluster-exit-code"),
        generic.Fact("Failure", "{{ obj.failure_reason }}", id="raycluster-failure"),
        generic.Fact("Attempts", "{% if obj.attempts > 1 %}{{ obj.attempts }}{% endif %}"),
    ),
)  # fmt: skip

SPEC = generic.Panel(
    title="What it runs",
    live=True,
    facts=(
        generic.Fact("Entrypoint", "{% if obj.entrypoint %}<code>{{ obj.entrypoint }}</code>{% else %}none: it runs "
                     "until deleted; submit Ray jobs to its dashboard's Jobs API{% endif %}"),
        generic.Fact("Image", "{% if obj.image %}<code>{{ obj.image }}</code>{% endif %}"),
        generic.Fact("Environment", "{% for k, v in env %}<code>{{ k }}={{ v }}</code>{% if not forloop.last %}<br>"
                     "{% endif %}{% endfor %}"),
        generic.Fact("Artifacts to keep", "{% for p in obj.artifact_paths %}<code>{{ p }}</code>"
                     "{% if not forloop.last %}<br>{% endif %}{% endfor %}"),
        generic.Fact("Max runtime", "{% if obj.max_runtime_s %}{{ obj.max_runtime_s|duration }}{% endif %}"),
        generic.Fact("Priority", "{{ obj.priority }}{% if obj.preemptible %} · preemptible{% endif %}"),
        generic.Fact("Asked to run on", "{% if obj.requested_cluster %}{{ obj.requested_cluster.name }}{% endif %}"),
        generic.Fact("Created", '{{ obj.created_at|date:"j M Y, H:i:s" }}{% if obj.created_by %} by '
                     "{{ obj.created_by.get_username }}{% endif %}"),
    ),
)  # fmt: skip

DETAIL = generic.Detail(
    kind="raycluster",
    list_title="Ray clusters",
    list_url_name="web:rayclusters",
    url_name="web:raycluster",
    panels=(
        STATUS,
        generic.Panel(title="Head and workers", template="web/rayclusters/_nodes.html", live=True),
        SPEC,
        generic.Panel(title="Artifacts", template="web/rayclusters/_artifacts.html", live=True),
        generic.Panel(title="GPU utilisation", template="web/_gpu_panel.html", wide=True, needs="gpu_panel"),
        generic.Panel(title="Log", template="web/generic/_log.html", wide=True),
    ),
    actions=(
        # Anyone who sees the cluster may look at its dashboard; changing anything there needs USE
        # (the portal's proxy, apps/rayclusters/proxy.py, decides per request).
        generic.Action("Open dashboard ↗", url=lambda _workspace, cluster: cluster.dashboard_url, role=VIEW,
                       style="primary", when=lambda cluster: cluster.state in RUNNING, external=True),
        generic.Action("Delete…", url=_url("web:raycluster-delete"), style="danger",
                       when=lambda cluster: not cluster.is_final),
    ),
)  # fmt: skip


@signed_in
def raycluster_detail(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    workspace = workspace_for(request, ws)
    queryset = RayCluster.objects.select_related("cluster", "requested_cluster", "created_by")
    cluster = get_for(request, queryset.prefetch_related("artifacts"), pk=pk, workspace=workspace)
    nodes, more = node_rows(cluster)
    extra = {
        **_row_context(cluster),
        "cluster": cluster,
        "node_rows": nodes,
        "more_nodes": more,
        "env": sorted(cluster.env.items()),
        "log_url": reverse("raycluster-logs", kwargs={"pk": cluster.pk}),
        "log_waiting": "The log starts when the cluster does." if cluster.state == State.QUEUED else "",
    }
    if not is_fragment(request) and cluster.total_gpus:
        extra.update(gpu_panel(workload_id=cluster.pk, url=reverse("web:raycluster-gpu", args=[workspace.name, pk])))
    return generic.detail_page(request, workspace, cluster, DETAIL, **extra)


@signed_in
def raycluster_gpu(request: HttpRequest, ws: str, pk: int) -> JsonResponse:
    """The cluster's GPU utilisation over time (apps/web/telemetry.py), for its page's chart."""
    workspace = workspace_for(request, ws)
    cluster = get_for(request, RayCluster.objects.all(), pk=pk, workspace=workspace)
    return gpu_answer(request, workload_id=cluster.pk)


@signed_in
def raycluster_delete(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """GET asks first; POST stops the cluster. Another tenant's is a 404; a viewer's try a 403."""
    workspace, cluster = shared_for(request, ws, RayCluster.objects.select_related("workspace"), pk, USE)
    errors: Errors = {}
    if request.method == "POST":
        try:
            actions.do_delete_cluster(cluster, **action_kwargs(request))
        except ActionError as exc:
            errors["form"] = [exc.message]
        else:
            messages.success(request, f"Ray cluster {cluster.name} is stopping; its record, log and artifacts stay.")
            return redirect("web:raycluster", ws=workspace.name, pk=cluster.pk)
    return generic.confirm_page(
        request,
        workspace,
        cluster,
        DETAIL,
        question=f"Delete Ray cluster {cluster.name}?",
        text=(
            f"Its head and {cluster.workers} worker{'s' if cluster.workers != 1 else ''} stop at once, and every "
            "Ray job running on it with them; its GPUs, CPU and memory go back to the workspace. It cannot be "
            "started again; its record, log and artifacts stay here."
        ),
        button="Delete the cluster",
        errors=errors,
    )


# -- the form --------------------------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def submitted_data(post: Any, workspace: Workspace, errors: Errors) -> dict[str, Any]:
    """The form's fields as the API's JSON body would carry them: a role sized by a profile sends
    the profile alone, and the GPU type goes along only with GPUs sized here."""
    data: dict[str, Any] = {"workspace": workspace.name}
    for name in TEXT_FIELDS:
        value = post.get(name, "").strip()
        if value and name not in ("env", "artifact_paths", "gpu_type"):
            data[name] = value
    for role in ROLES:
        if data.get(f"{role}_profile"):
            for size in SIZES:
                data.pop(f"{role}_{size}", None)
    if any(data.get(f"{role}_gpus", "0") not in ("0", "0.0") for role in ROLES) and post.get("gpu_type"):
        data["gpu_type"] = post["gpu_type"].strip()
    env = parse_env(post.get("env", ""), errors)
    if env:
        data["env"] = env
    paths = _lines(post.get("artifact_paths", ""))
    if paths:
        data["artifact_paths"] = paths
    data["preemptible"] = post.get("preemptible") == "on"
    return data


def _beside_profile(errors: Errors, data: dict[str, Any]) -> Errors:
    """A refusal of a size a profile gave (the action names the size) is shown beside the profile."""
    moved: Errors = {}
    for field, found in errors.items():
        role = field.split("_", 1)[0]
        if role in ROLES and field in {f"{role}_{size}" for size in SIZES} and data.get(f"{role}_profile"):
            field = f"{role}_profile"
        moved.setdefault(field, []).extend(found)
    return moved


def _create(request: HttpRequest, workspace: Workspace, errors: Errors) -> RayCluster | None:
    data = submitted_data(request.POST, workspace, errors)
    serializer = RayClusterSerializer(data=data, context=serializer_context(request))
    checked = validated(serializer, errors)
    if checked is not None and not errors:
        checked.pop("workspace")
        try:
            return actions.check_create_cluster(workspace, **checked, **action_kwargs(request))
        except ActionError as exc:
            refused(exc, errors, set(TEXT_FIELDS))
    moved = _beside_profile(errors, data)
    errors.clear()
    errors.update({field: list(dict.fromkeys(found)) for field, found in moved.items()})
    return None


@signed_in
def raycluster_new(request: HttpRequest, ws: str) -> HttpResponse:
    """Create a cluster: its name, its head's and workers' sizes (or compute profiles), and what it runs."""
    workspace = workspace_for(request, ws, CHANGE)
    types = gpu_types(workspace)
    errors: Errors = {}
    if request.method == "POST":
        values = {name: request.POST.get(name, "") for name in TEXT_FIELDS}
        values["preemptible"] = "on" if request.POST.get("preemptible") == "on" else ""
        cluster = _create(request, workspace, errors)
        if cluster is not None:
            messages.success(request, f"Ray cluster {cluster.name} was created; it starts once its nodes all fit.")
            return redirect("web:raycluster", ws=workspace.name, pk=cluster.pk)
    else:
        values = {**dict.fromkeys(TEXT_FIELDS, ""), **DEFAULTS, "preemptible": "on"}
        values.update(gpu_type=types[0] if types else "", worker_gpus=DEFAULTS["worker_gpus"] if types else "0")
        values.update({name: request.GET[name] for name in TEXT_FIELDS if name in request.GET})
    profiles: list[ComputeProfile] = allowed_profiles(request, workspace)
    context = {"workspace": workspace, "values": values, "errors": errors, "gpu_types": types, "profiles": profiles}
    return page(request, "web/rayclusters/new.html", context, status=400 if errors else 200)
