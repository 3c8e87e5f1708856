"""The forms of inference endpoints: a new endpoint (from a path in the workspace's directory, or
from a finished job's artifact: a job's page links here with both filled in), scale one (its
minimum, maximum and scale-to-zero delay), and update what it serves (a new version, rolled out
without a failed request).

Each form is read by the API's own serializer and acted on by the same action as the API
(``check_create_endpoint``, ``do_update_endpoint``), so a form refuses what the API refuses, in
the same words, beside the field it names.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from apps.catalog.models import InferenceProfile
from apps.errors import ActionError
from apps.inference import actions
from apps.inference.api import EndpointSerializer, EndpointUpdateSerializer
from apps.inference.models import Endpoint
from apps.jobs.models import Job
from apps.web.common import (
    Errors,
    action_kwargs,
    get_for,
    page,
    refused,
    serializer_context,
    signed_in,
    validated,
    workspace_for,
)
from apps.web.endpoints import CHANGEABLE, DETAIL
from apps.workspaces.access import CHANGE, can, restrict
from apps.workspaces.models import Workspace

NEW_FIELDS = (
    "workspace", "name", "description", "profile", "source", "path", "source_job", "artifact", "min_replicas",
    "max_replicas", "scale_to_zero_s",
)  # fmt: skip
SCALE_FIELDS = ("min_replicas", "max_replicas", "scale_to_zero_s")
MODEL_FIELDS = ("profile", "source", "path", "source_job", "artifact")
DEFAULTS = {"source": "path", "min_replicas": "1", "max_replicas": "2"}
# What the serializer and the actions call the fields a form shows under other names: a replica's
# size comes from the profile, and how many replicas must fit from the minimum.
BESIDE = {
    "model_path": "path", "source_artifact": "artifact", "cpu_cores": "profile", "memory_gb": "profile",
    "gpus_per_replica": "profile", "gpu_type": "profile", "gpus": "profile", "replicas": "min_replicas",
}  # fmt: skip
# The finished jobs offered as a model's source, newest first.
JOBS_SHOWN = 50
MODEL_FILES = (".gguf", "config.json", ".safetensors")


def artifact_to_serve(paths: Iterable[str]) -> str:
    """Which of a job's artifacts to offer first: the directory of its first model file (a GGUF file,
    a Hugging Face config or weights), or that file where it lies at the top; else the first
    artifact's top directory."""
    paths = sorted(paths)
    for path in paths:
        if path.endswith(MODEL_FILES):
            folder = posixpath.dirname(path)
            return f"{folder}/" if folder else path
    if not paths:
        return ""
    top = paths[0].split("/", 1)
    return f"{top[0]}/" if len(top) > 1 else top[0]


def deploy_url(workspace: Workspace, job: Job) -> str:
    """The new-endpoint form, filled in with the job and the artifact to serve (a job's Deploy button)."""
    query = {"source": "job", "source_job": job.pk, "artifact": artifact_to_serve(a.path for a in job.artifacts.all())}
    return f"{reverse('web:endpoint-new', args=[workspace.name])}?{urlencode(query)}"


def deployable(job: Job) -> bool:
    """A job whose artifacts may be served: it succeeded and left some (prefetched on its page)."""
    return job.state == Job.State.SUCCEEDED and bool(job.artifacts.all())


def _moved(errors: Errors, source: str = "path") -> Errors:
    """Errors keyed by the form's own field names; with a job's artifact chosen as the source, a
    missing model is the job's field's ("Name the model" of a form that named no job)."""
    out: Errors = {}
    for field, found in errors.items():
        field = BESIDE.get(field, field)
        out.setdefault("source_job" if field == "path" and source == "job" else field, []).extend(found)
    return {field: list(dict.fromkeys(found)) for field, found in out.items()}


def _refused(exc: ActionError, errors: Errors, fields: Iterable[str]) -> None:
    if exc.field in BESIDE:
        exc.field = BESIDE[exc.field]
    refused(exc, errors, set(fields))


def _model_data(post: Any) -> dict[str, Any]:
    """The model's source as the API's body carries it: a path, or a job and its artifact."""
    if post.get("source") == "job":
        return {"source_job": post.get("source_job", "").strip() or None, "artifact": post.get("artifact", "").strip()}
    return {"path": post.get("path", "").strip()}


def profiles_for(request: HttpRequest) -> list[InferenceProfile]:
    """The inference profiles the user may deploy with: the published ones the catalog shows them."""
    return list(InferenceProfile.objects.visible_to(request.user).filter(published=True).order_by("gpus", "name"))


def finished_jobs(request: HttpRequest, chosen: str = "") -> list[Job]:
    """The succeeded jobs with artifacts the user may deploy from (their workspaces'), newest first,
    with the one asked for (a job page's Deploy) among them."""
    jobs = restrict(Job.objects.filter(state=Job.State.SUCCEEDED, artifacts__isnull=False), request.user, CHANGE)
    jobs = jobs.distinct().select_related("workspace").order_by("-finished_at", "-pk")
    shown = list(jobs[:JOBS_SHOWN])
    if chosen.isdigit() and all(str(job.pk) != chosen for job in shown):
        shown += list(jobs.filter(pk=int(chosen)))
    return shown


# -- a new endpoint --------------------------------------------------------------------------------


def _create(request: HttpRequest, errors: Errors) -> Endpoint | None:
    post = request.POST
    data: dict[str, Any] = {name: post.get(name, "").strip() for name in ("workspace", "name", "description")}
    data.update({name: post.get(name, "").strip() for name in ("profile", "min_replicas", "max_replicas")})
    if post.get("scale_to_zero_s", "").strip():
        data["scale_to_zero_s"] = post["scale_to_zero_s"].strip()
    data.update(_model_data(post))
    data = {name: value for name, value in data.items() if value != "" or name in ("path", "artifact", "name")}
    checked = validated(EndpointSerializer(data=data, context=serializer_context(request)), errors)
    if checked is None:
        return None
    workspace = checked.pop("workspace")
    if not can(request.user, workspace, CHANGE):
        errors["workspace"] = [f"Your role in workspace {workspace.name} does not allow this."]
        return None
    try:
        return actions.check_create_endpoint(
            workspace,
            name=checked["name"],
            profile=checked["profile"],
            path=checked.get("model_path", ""),
            job=checked.get("source_job"),
            artifact=checked.get("source_artifact", ""),
            min_replicas=checked.get("min_replicas", 1),
            max_replicas=checked.get("max_replicas", max(1, checked.get("min_replicas", 1))),
            scale_to_zero_s=checked.get("scale_to_zero_s"),
            description=checked.get("description", ""),
            **action_kwargs(request),
        )
    except ActionError as exc:
        _refused(exc, errors, NEW_FIELDS)
    return None


@signed_in
def endpoint_new(request: HttpRequest, ws: str) -> HttpResponse:
    """Deploy a model: its workspace, name, profile, the model (a path, or a finished job's artifact),
    its bounds and scale-to-zero delay."""
    workspace = workspace_for(request, ws, CHANGE)
    errors: Errors = {}
    if request.method == "POST":
        values = {name: request.POST.get(name, "") for name in NEW_FIELDS}
        endpoint = _create(request, errors)
        errors = _moved(errors, values["source"])
        if endpoint is not None:
            messages.success(request, f"Endpoint {endpoint.name} is deploying: its replicas start once they fit.")
            return redirect("web:endpoint", ws=endpoint.workspace.name, pk=endpoint.pk)
    else:
        values = {**dict.fromkeys(NEW_FIELDS, ""), **DEFAULTS, "workspace": workspace.name}
        values.update({name: request.GET[name] for name in NEW_FIELDS if name in request.GET})
    jobs = finished_jobs(request, values["source_job"])
    context = {
        "workspace": workspace,
        "values": values,
        "errors": errors,
        "profiles": profiles_for(request),
        "jobs": jobs,
        "artifacts": _artifacts_of(jobs, values["source_job"]),
        "writable": [w for w in restrict(Workspace.objects.all(), request.user, CHANGE).order_by("name")],
    }
    return page(request, "web/endpoint_new.html", context, status=400 if errors else 200)


def _artifacts_of(jobs: list[Job], chosen: str) -> list[str]:
    """The chosen job's artifacts and their directories: the datalist of the artifact field."""
    job = next((j for j in jobs if str(j.pk) == chosen), None)
    if job is None:
        return []
    paths = list(job.artifacts.values_list("path", flat=True))
    folders = {f"{posixpath.dirname(p)}/" for p in paths if "/" in p}
    return sorted(folders) + sorted(paths)


# -- scale, and a new version of the model ---------------------------------------------------------


def _changeable(request: HttpRequest, ws: str, pk: int) -> tuple[Workspace, Endpoint]:
    workspace = workspace_for(request, ws, CHANGE)
    queryset = Endpoint.objects.select_related("workspace", "profile", "source_job")
    return workspace, get_for(request, queryset, pk=pk, workspace=workspace)


def _update(request: HttpRequest, endpoint: Endpoint, data: dict[str, Any], errors: Errors) -> bool:
    """Change the endpoint as PATCH /api/v1/endpoints/<id>/ does; False with `errors` if refused."""
    checked = validated(EndpointUpdateSerializer(data=data, context=serializer_context(request)), errors)
    if checked is None:
        return False
    model = None
    if any(name in checked for name in ("path", "source_job", "artifact", "profile")):
        model = {"path": checked.get("path", ""), "job": checked.get("source_job"),
                 "artifact": checked.get("artifact", ""), "profile": checked.get("profile")}  # fmt: skip
        if not model["path"] and model["job"] is None:
            model["path"] = endpoint.model_path  # a new profile for the same model
    bounds = {name: checked[name] for name in SCALE_FIELDS if name in checked}
    try:
        actions.do_update_endpoint(endpoint, model=model, **bounds, **action_kwargs(request))
    except ActionError as exc:
        _refused(exc, errors, (*SCALE_FIELDS, *MODEL_FIELDS))
        return False
    return True


def _form_page(
    request: HttpRequest, workspace: Workspace, endpoint: Endpoint, what: str, values: dict[str, Any], errors: Errors
) -> HttpResponse:
    context = {
        "workspace": workspace,
        "obj": endpoint,
        "detail": DETAIL,
        "what": what,
        "values": values,
        "errors": _moved(errors, str(values.get("source", "path"))),
        "profiles": profiles_for(request),
    }
    if what == "update":
        context["jobs"] = jobs = finished_jobs(request, str(values.get("source_job", "")))
        context["artifacts"] = _artifacts_of(jobs, str(values.get("source_job", "")))
    return page(request, "web/endpoint_change.html", context, status=400 if errors else 200)


@signed_in
def endpoint_scale(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """Its minimum, maximum and scale-to-zero delay (empty: never to zero)."""
    workspace, endpoint = _changeable(request, ws, pk)
    errors: Errors = {}
    if request.method == "POST":
        values = {name: request.POST.get(name, "").strip() for name in SCALE_FIELDS}
        data: dict[str, Any] = {name: values[name] for name in ("min_replicas", "max_replicas") if values[name]}
        data["scale_to_zero_s"] = values["scale_to_zero_s"] or None
        if _update(request, endpoint, data, errors):
            endpoint.refresh_from_db()
            zero = f", to zero after {endpoint.scale_to_zero_s} s quiet" if endpoint.scale_to_zero_s else ""
            messages.success(request, f"Endpoint {endpoint.name} now scales between {endpoint.min_replicas} and "
                             f"{endpoint.max_replicas} replicas{zero}.")  # fmt: skip
            return redirect("web:endpoint", ws=workspace.name, pk=endpoint.pk)
    else:
        now = {name: getattr(endpoint, name) for name in SCALE_FIELDS}
        values = {name: "" if value is None else str(value) for name, value in now.items()}
    if endpoint.state not in CHANGEABLE and not errors:
        return redirect("web:endpoint", ws=workspace.name, pk=endpoint.pk)
    return _form_page(request, workspace, endpoint, "scale", values, errors)


@signed_in
def endpoint_update(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """A new version of what it serves: another path or job artifact, and maybe another profile."""
    workspace, endpoint = _changeable(request, ws, pk)
    errors: Errors = {}
    if request.method == "POST":
        values = {name: request.POST.get(name, "").strip() for name in MODEL_FIELDS}
        data = _model_data(request.POST)
        if values["profile"] and values["profile"] != endpoint.profile.name:
            data["profile"] = values["profile"]
        if _update(request, endpoint, data, errors):
            endpoint.refresh_from_db()
            messages.success(request, f"Version {endpoint.version} of {endpoint.name} is rolling out: its new "
                             "replicas serve before the old ones stop.")  # fmt: skip
            return redirect("web:endpoint", ws=workspace.name, pk=endpoint.pk)
    else:
        source = "job" if endpoint.source == Endpoint.Source.ARTIFACT else "path"
        values = {
            "profile": endpoint.profile.name,
            "source": source,
            "path": endpoint.model_path if source == "path" else "",
            "source_job": str(endpoint.source_job_id or ""),
            "artifact": endpoint.source_artifact,
        }
        values.update({name: request.GET[name] for name in MODEL_FIELDS if name in request.GET})
    if endpoint.state not in CHANGEABLE and not errors:
        return redirect("web:endpoint", ws=workspace.name, pk=endpoint.pk)
    return _form_page(request, workspace, endpoint, "update", values, errors)
