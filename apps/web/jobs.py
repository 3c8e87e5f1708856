"""Jobs: the queue and history, the submit form, a job's page with its live log, cancel. The list and
the page are the generic ones (apps/web/generic.py), described here."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.db.models import F
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from apps.errors import ActionError
from apps.inventory.models import GPU
from apps.jobs import actions
from apps.jobs.api import JobSerializer
from apps.jobs.models import Job
from apps.web import generic
from apps.web.common import (
    Errors,
    action_kwargs,
    get_for,
    is_fragment,
    page,
    refused,
    serializer_context,
    signed_in,
    validated,
    workspace_for,
)
from apps.web.endpoint_forms import deploy_url, deployable
from apps.web.telemetry import gpu_panel
from apps.workspaces.access import CHANGE
from apps.workspaces.models import GPUQuota, Workspace

TEXT_FIELDS = (
    "name",
    "description",
    "command",
    "image",
    "gpu_type",
    "gpus_per_replica",
    "replicas",
    "priority",
    "cpu_cores",
    "memory_gb",
    "max_runtime_s",
    "env",
    "artifact_paths",
)
DEFAULTS = {"gpus_per_replica": "1", "replicas": "1", "priority": "0", "cpu_cores": "1", "memory_gb": "4"}
# The queue, as the scheduler orders it: by position in the workspace, the unplaced last.
QUEUE_ORDER = (F("workspace_queue_position").asc(nulls_last=True), "created_at", "id")
LISTING = generic.Listing(
    kind="job",
    title="Jobs",
    intro="Where each job stands in the queue, why it waits and when it should start.",
    url_name="web:jobs",
    rows=lambda workspace: Job.objects.filter(workspace=workspace).select_related("created_by"),
    new_url_name="web:job-new",
    new_label="Submit a job",
    tabs=(
        generic.Tab(
            "queue",
            "Queue",
            (Job.State.QUEUED, Job.State.ADMITTED, Job.State.PREEMPTED),
            "The queue is empty",
            "Nothing waits for GPUs here. A job you submit runs as soon as the quota has room.",
            order_by=QUEUE_ORDER,
        ),
        generic.Tab(
            "running", "Running", (Job.State.RUNNING,), "Nothing running", "Queued jobs start here once admitted."
        ),
        generic.Tab(
            "finished",
            "Finished",
            Job.FINAL_STATES,
            "No finished jobs yet",
            "Succeeded, failed and cancelled jobs are kept here with their logs and artifacts.",
        ),
        generic.Tab(
            "all", "All", None, "No jobs yet", "A job runs a command or an image on GPUs, as a gang of replicas."
        ),
    ),  # fmt: skip
    columns=(
        generic.Column(
            "Job",
            '<a href="{% url \'web:job\' workspace.name obj.pk %}">{{ obj.name }}</a> <span class="muted small">'
            '#{{ obj.pk }}</span>{% if obj.created_by %}<div class="muted small">by '
            "{{ obj.created_by.get_username }}</div>{% endif %}",
        ),
        generic.Column(
            "State",
            '{% include "web/_state.html" with state=obj.state label=obj.get_state_display %}'
            '{% if obj.state == "RUNNING" and obj.progress is not None %}<progress max="100" '
            'value="{{ obj.progress|percent }}" aria-label="{{ obj.name }} progress">{{ obj.progress|percent }}%'
            "</progress>{% endif %}",
        ),
        generic.Column(
            "GPUs",
            "{% if obj.gpus_per_replica %}{{ obj.gpus_per_replica|gpus_of:obj.gpu_type }}{% if obj.replicas > 1 %} "
            '<span class="muted small">on each of {{ obj.replicas }} replicas</span>{% endif %}'
            '{% else %}<span class="muted">none</span>{% endif %}',
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
            "Why it waits",
            '{% if obj.state == "QUEUED" or obj.state == "PREEMPTED" %}'
            '{{ obj.wait_reason|default:"waiting for the next scheduling cycle" }}'
            '{% elif obj.state == "FAILED" %}{{ obj.failure_reason|truncatechars:120 }}{% endif %}',
            classes="reason",
        ),
        generic.Column(
            "Estimated start",
            '{% if obj.state == "QUEUED" %}{{ obj.estimated_start_at|until }}{% elif obj.started_at %}'
            '<span class="muted small">started {{ obj.started_at|date:"H:i" }}</span>{% else %}—{% endif %}',
        ),
        generic.Column(
            "Submitted", '<time datetime="{{ obj.created_at|date:\'c\' }}">{{ obj.created_at|date:"j M, H:i" }}</time>'
        ),
    ),
)


@signed_in
def job_list(request: HttpRequest, ws: str) -> HttpResponse:
    return generic.list_page(request, ws, LISTING)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def parse_env(text: str, errors: Errors) -> dict[str, str] | None:
    """NAME=value lines; the API's own field then checks the names and sizes."""
    env: dict[str, str] = {}
    for number, line in enumerate(_lines(text), start=1):
        name, sep, value = line.partition("=")
        if not sep:
            errors.setdefault("env", []).append(f"Line {number}: write NAME=value.")
            return None
        env[name.strip()] = value
    return env


def submitted_data(post: Any, workspace: Workspace, errors: Errors) -> dict[str, Any]:
    """The form's fields as the API's JSON body would carry them."""
    data: dict[str, Any] = {"workspace": workspace.name}
    for name in TEXT_FIELDS:
        value = post.get(name, "").strip()
        if value and name not in ("env", "artifact_paths"):
            data[name] = value
    if post.get("gpus_per_replica", "").strip() in ("", "0") and "gpu_type" in data:
        data.pop("gpu_type")  # no GPUs: the type does not matter
    env = parse_env(post.get("env", ""), errors)
    if env:
        data["env"] = env
    paths = _lines(post.get("artifact_paths", ""))
    if paths:
        data["artifact_paths"] = paths
    data["preemptible"] = post.get("preemptible") == "on"
    return data


def gpu_types(workspace: Workspace) -> list[str]:
    quota_types = list(GPUQuota.objects.filter(workspace=workspace).values_list("gpu_type", flat=True))
    inventory = GPU.objects.values_list("gpu_type", flat=True).distinct()
    return sorted(set(quota_types) | set(inventory), key=lambda t: (t not in quota_types, t))


@signed_in
def job_new(request: HttpRequest, ws: str) -> HttpResponse:
    workspace = workspace_for(request, ws, CHANGE)
    types = gpu_types(workspace)
    errors: Errors = {}
    if request.method == "POST":
        values = {name: request.POST.get(name, "") for name in TEXT_FIELDS}
        values["preemptible"] = "on" if request.POST.get("preemptible") == "on" else ""
        data = submitted_data(request.POST, workspace, errors)
        serializer = JobSerializer(data=data, context=serializer_context(request))
        checked = validated(serializer, errors)
        if checked is not None and not errors:
            checked.pop("workspace")
            try:
                job = actions.check_submit_job(workspace, **checked, **action_kwargs(request))
            except ActionError as exc:
                refused(exc, errors, set(TEXT_FIELDS))
            else:
                messages.success(request, f"Job {job.name} was submitted.")
                return redirect("web:job", ws=workspace.name, pk=job.pk)
    else:
        values = {
            **dict.fromkeys(TEXT_FIELDS, ""),
            **DEFAULTS,
            "gpu_type": types[0] if types else "",
            "preemptible": "on",
        }
        values.update({k: v for k, v in request.GET.items() if k in TEXT_FIELDS})
    context = {"workspace": workspace, "values": values, "errors": errors, "gpu_types": types}
    return page(request, "web/jobs/new.html", context, status=400 if errors else 200)


# -- a job's page ----------------------------------------------------------------------------------

STATUS = generic.Panel(
    title="Status",
    live=True,
    shows_state=True,
    lead='{% include "web/_start_progress.html" %}'
    '{% if obj.progress is not None %}<div class="field"><label for="job-progress">Progress: '
    "{{ obj.progress|percent }}%</label>"
    '<progress id="job-progress" max="100" value="{{ obj.progress|percent }}">{{ obj.progress|percent }}%</progress>'
    "</div>{% endif %}",
    facts=(
        generic.Fact("Why it waits", '{% if obj.state == "QUEUED" or obj.state == "PREEMPTED" %}'
                     '{{ obj.wait_reason|default:"waiting for the next scheduling cycle" }}{% endif %}',
                     id="job-reason"),
        generic.Fact("Queue position", '{% if obj.state == "QUEUED" or obj.state == "PREEMPTED" %}'
                     '{{ obj.workspace_queue_position|default:"—" }} in the workspace, '
                     '{{ obj.cluster_queue_position|default:"—" }} in the cluster{% endif %}'),
        generic.Fact("Estimated start", '{% if obj.state == "QUEUED" or obj.state == "PREEMPTED" %}'
                     "{{ obj.estimated_start_at|until }}{% endif %}"),
        generic.Fact("Cluster", "{% if obj.cluster %}{{ obj.cluster.name }}{% endif %}"),
        generic.Fact("Started", '{% if obj.started_at %}{{ obj.started_at|date:"j M Y, H:i:s" }}{% endif %}'),
        generic.Fact("Finished", '{% if obj.finished_at %}{{ obj.finished_at|date:"j M Y, H:i:s" }}{% endif %}'),
        generic.Fact("Exit code", "{% if obj.exit_code is not None %}{{ obj.exit_code }}{% endif %}"),
        generic.Fact("Failure", "{{ obj.failure_reason }}"),
        generic.Fact("Attempts", "{% if obj.attempts > 1 %}{{ obj.attempts }}{% endif %}"),
    ),
    foot='{% include "web/jobs/_artifacts.html" %}',
)  # fmt: skip

SPEC = generic.Panel(
    title="What it runs",
    live=True,  # beside the status, in the part of the page that live updates render again
    facts=(
        generic.Fact("Command", "{% if obj.command %}<code>{{ obj.command }}</code>{% endif %}"),
        generic.Fact("Image", "{% if obj.image %}<code>{{ obj.image }}</code>{% endif %}"),
        generic.Fact("Resources", "{{ obj.replicas }} replica{{ obj.replicas|pluralize }} × "
                     "{% if obj.gpus_per_replica %}{{ obj.gpus_per_replica|gpus_of:obj.gpu_type }}, {% endif %}"
                     "{{ obj.cpu_cores }} CPU, {{ obj.memory_gb }} GB"),
        generic.Fact("Priority", "{{ obj.priority }}{% if obj.preemptible %} · preemptible{% endif %}"),
        generic.Fact("Max runtime", "{% if obj.max_runtime_s %}{{ obj.max_runtime_s|duration }}{% endif %}"),
        generic.Fact("Environment", "{% for k, v in env %}<code>{{ k }}={{ v }}</code>{% if not forloop.last %}<br>"
                     "{% endif %}{% endfor %}"),
        generic.Fact("Submitted", '{{ obj.created_at|date:"j M Y, H:i:s" }}{% if obj.created_by %} by '
                     "{{ obj.created_by.get_username }}{% endif %}"),
    ),
)  # fmt: skip

DETAIL = generic.Detail(
    kind="job",
    list_title="Jobs",
    list_url_name="web:jobs",
    url_name="web:job",
    panels=(
        STATUS,
        SPEC,
        generic.Panel(title="GPU utilisation", template="web/_gpu_panel.html", wide=True, needs="gpu_panel"),
        generic.Panel(title="Log", template="web/generic/_log.html", wide=True),
    ),
    actions=(
        # A finished job's model, served at an endpoint: the new-endpoint form, filled in.
        generic.Action("Deploy…", url=deploy_url, role=CHANGE, style="primary", when=deployable),
        generic.Action("Cancel job…", url=generic.object_url("web:job-cancel"), role=CHANGE, style="danger",
                       when=lambda job: not job.is_final),
    ),
)  # fmt: skip


@signed_in
def job_detail(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    workspace = workspace_for(request, ws)
    job = get_for(
        request,
        Job.objects.select_related("cluster", "created_by").prefetch_related("artifacts", "attempt_set"),
        pk=pk,
        workspace=workspace,
    )
    started = job.state not in (Job.State.QUEUED, Job.State.ADMITTED)
    extra = {
        "env": sorted(job.env.items()),
        "log_url": reverse("job-logs", kwargs={"pk": job.pk}),
        "log_waiting": "Loading…" if started else "The log starts when the job does.",
        "log_replicas": range(job.replicas),
    }
    if not is_fragment(request) and job.gpus_per_replica:
        extra.update(
            gpu_panel(workload_id=job.pk, url=reverse("web:job-gpu", kwargs={"ws": workspace.name, "pk": job.pk}))
        )
    return generic.detail_page(request, workspace, job, DETAIL, **extra)


@signed_in
def job_cancel(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """GET asks for confirmation (a cancelled job cannot be resumed); POST cancels."""
    workspace = workspace_for(request, ws, CHANGE)
    job = get_for(request, Job.objects.all(), pk=pk, workspace=workspace)
    if request.method == "POST":
        try:
            actions.do_cancel_job(job, **action_kwargs(request))
        except ActionError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"Job {job.name} was cancelled.")
        return redirect("web:job", ws=workspace.name, pk=job.pk)
    if job.is_final:
        return redirect("web:job", ws=workspace.name, pk=job.pk)
    running = job.state == Job.State.RUNNING
    return generic.confirm_page(
        request,
        workspace,
        job,
        DETAIL,
        question=f"Cancel job {job.name}?",
        text=(
            "Its replicas are stopped now and the work they have not saved is lost; "
            if running
            else "It leaves the queue; "
        )
        + "submitting it again puts it at the end of the queue.",
        button="Cancel job",
    )
