"""State changes of inference endpoints and their replicas.

``check_create_endpoint`` validates a request (the model is there and is one its server loads, the
bounds, the size against the workspace's limits) and records it; the autoscaler
(apps/inference/scaling.py) then makes its replicas, which the scheduler admits and the workload
host starts (apps/inference/hosting.py calls the ``record_*`` actions on the row it locked).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.audit.actions import SYSTEM, Origin, do_log_event
from apps.audit.events import Event
from apps.catalog.models import InferenceProfile
from apps.errors import ActionError, Conflict
from apps.inference import scaling
from apps.inference.models import MAX_REPLICAS, SCALE_TO_ZERO_RANGE_S, Endpoint, Replica, ScaleEvent
from apps.inference.replicas import live as _live
from apps.inventory.models import Allocation
from apps.jobs.models import Artifact
from apps.scheduling.limits import check_request_size
from apps.scheduling.trigger import request_cycle
from apps.workloads.models import Workload
from apps.workspaces.models import Workspace
from workers.backends import servers

KIND = "endpoint"
#: The states of a finished workload whose artifacts may be served.
SERVABLE_RUNS = ("SUCCEEDED",)


def workspace_dir(workspace: Workspace) -> Path:
    return Path(settings.PORTAL_WORK_DIR) / workspace.name


def model_file(endpoint: Endpoint) -> Path:
    """Where its replicas find the model: inside its workspace's directory."""
    return workspace_dir(endpoint.workspace) / endpoint.model_path


def resolve_model(
    workspace: Workspace, profile: InferenceProfile, *, path: str = "", job: Workload | None = None, artifact: str = ""
) -> str:
    """The model's path relative to the workspace's directory, checked: inside that directory
    (no ``..``, no link leading out), and a model the profile's server loads. From a path in the
    workspace's directory, or from a finished job's artifact (a file it left, or a directory of
    them, named as the job's artifact list names it)."""
    root = workspace_dir(workspace)
    if job is not None:
        if job.workspace_id != workspace.pk:
            raise ActionError("No such job in this workspace.", field="source_job")
        if job.state not in SERVABLE_RUNS:
            raise ActionError(
                f"Job {job.pk} has not succeeded ({job.get_state_display().lower()}): only a finished job's "
                "artifacts can be served.",
                field="source_job",
            )
        artifact = artifact.strip().strip("/")
        if not artifact:
            raise ActionError("Name the artifact to serve (a file, or a directory of them).", field="artifact")
        recorded = Artifact.objects.filter(job=job)
        if not (recorded.filter(path=artifact).exists() or recorded.filter(path__startswith=f"{artifact}/").exists()):
            raise ActionError(f"Job {job.pk} left no artifact {artifact}.", field="artifact")
        job_dir = (job.backend_state or {}).get("job_dir", "")
        if not job_dir:
            raise ActionError(f"Job {job.pk}'s files are no longer kept.", field="source_job")
        candidate = Path(job_dir) / artifact
        field = "artifact"
    else:
        path = path.strip()
        if not path:
            raise ActionError("Name the model: a path in the workspace's directory, or a job's artifact.", field="path")
        if path.startswith("/") or ".." in Path(path).parts:
            raise ActionError("Give a path relative to the workspace's directory, without '..'.", field="path")
        candidate = root / path
        field = "path"
    real_root, real = os.path.realpath(root), os.path.realpath(candidate)
    if os.path.commonpath([real_root, real]) != real_root:
        raise ActionError("The model must lie inside the workspace's directory.", field=field)
    problem = servers.check_model(profile.server, Path(real))
    if problem:  # named as the user knows it: in the workspace's directory
        raise ActionError(problem.replace(real_root + os.sep, ""), field=field)
    return os.path.relpath(real, real_root)


def _replicas(count: int) -> str:
    return f"{count} replica" + ("" if count == 1 else "s")


def check_bounds(min_replicas: int, max_replicas: int, scale_to_zero_s: int | None) -> None:
    if not 1 <= max_replicas <= MAX_REPLICAS:
        raise ActionError(f"An endpoint has 1 to {MAX_REPLICAS} replicas at most.", field="max_replicas")
    if not 0 <= min_replicas <= max_replicas:
        raise ActionError(
            f"The minimum ({min_replicas}) must lie between 0 and the maximum ({max_replicas}).", field="min_replicas"
        )
    if min_replicas == 0 and scale_to_zero_s is None:
        raise ActionError(
            "An endpoint with no minimum replica scales to zero: give it a scale-to-zero delay.", field="min_replicas"
        )
    low, high = SCALE_TO_ZERO_RANGE_S
    if scale_to_zero_s is not None and not low <= scale_to_zero_s <= high:
        raise ActionError(f"The scale-to-zero delay is {low} to {high} seconds.", field="scale_to_zero_s")


def check_size(workspace: Workspace, profile: InferenceProfile, replicas: int) -> None:
    """One replica must fit what the workspace may ever hold, and so must its minimum together."""
    for count in (1, replicas):
        if count:
            check_request_size(
                workspace,
                gpu_type=profile.gpu_type,
                gpus_per_replica=profile.gpus,
                replicas=count,
                cpu_cores=profile.cpu_cores,
                memory_gb=profile.memory_gb,
            )


def check_create_endpoint(
    workspace: Workspace,
    *,
    name: str,
    profile: InferenceProfile,
    acting_user: Any,
    origin: Origin = SYSTEM,
    path: str = "",
    job: Workload | None = None,
    artifact: str = "",
    min_replicas: int = 1,
    max_replicas: int = 1,
    scale_to_zero_s: int | None = None,
    description: str = "",
    requested_cluster: Any = None,
) -> Endpoint:
    """Validate an endpoint and record it; its minimum replicas are made at once (queued)."""
    check_bounds(min_replicas, max_replicas, scale_to_zero_s)
    if Endpoint.objects.filter(workspace=workspace, name=name, state__in=Endpoint.LIVE_STATES).exists():
        raise Conflict(f"Workspace {workspace.name} already has an endpoint named {name}.", field="name")
    check_size(workspace, profile, min_replicas)
    model_path = resolve_model(workspace, profile, path=path, job=job, artifact=artifact)
    with transaction.atomic():
        endpoint = Endpoint.objects.create(
            workspace=workspace,
            name=name,
            description=description,
            profile=profile,
            source=Endpoint.Source.ARTIFACT if job is not None else Endpoint.Source.PATH,
            source_job=job,
            source_artifact=artifact.strip().strip("/") if job is not None else "",
            model_path=model_path,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            scale_to_zero_s=scale_to_zero_s,
            desired_replicas=min_replicas,
            preemptible=False,
            requested_cluster=requested_cluster,
            created_by=acting_user if acting_user.is_authenticated else None,
        )
        do_log_event(
            Event.ENDPOINT_CREATE,
            endpoint,
            acting_user=acting_user,
            origin=origin,
            workspace=workspace,
            data={"profile": profile.name, "model": model_path, "min": min_replicas, "max": max_replicas},
        )
        ScaleEvent.objects.create(
            endpoint=endpoint,
            from_replicas=0,
            to_replicas=min_replicas,
            reason=f"deployed with {_replicas(min_replicas)}",
        )
        scaling.converge(endpoint, timezone.now())
        _live(endpoint)
    return endpoint


def do_update_endpoint(
    endpoint: Endpoint,
    *,
    acting_user: Any,
    origin: Origin = SYSTEM,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    scale_to_zero_s: int | None | type[Ellipsis] = ...,  # type: ignore[valid-type]
    description: str | None = None,
    model: dict[str, Any] | None = None,
) -> Endpoint:
    """Change an endpoint's bounds, its scale-to-zero delay or description, or what it serves
    (``model``: ``{"path"}`` or ``{"job", "artifact"}``, and maybe ``"profile"``): a new version,
    rolled out without a failed request (the new replicas answer before the old ones stop)."""

    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().select_related("workspace", "profile").get(pk=endpoint.pk)
        if endpoint.state not in (Endpoint.State.DEPLOYING, Endpoint.State.READY, Endpoint.State.IDLE):
            raise Conflict(f"Endpoint {endpoint.name} is {endpoint.get_state_display().lower()}: it cannot change.")
        low = endpoint.min_replicas if min_replicas is None else min_replicas
        high = endpoint.max_replicas if max_replicas is None else max_replicas
        to_zero = endpoint.scale_to_zero_s if scale_to_zero_s is ... else scale_to_zero_s
        check_bounds(low, high, to_zero)  # type: ignore[arg-type]
        changes: dict[str, Any] = {}
        profile = endpoint.profile
        if model is not None:
            profile = model.get("profile") or endpoint.profile
            model_path = resolve_model(
                endpoint.workspace, profile, path=model.get("path", ""), job=model.get("job"),
                artifact=model.get("artifact", ""),
            )  # fmt: skip
            endpoint.previous = {"version": endpoint.version, "model_path": endpoint.model_path,
                                 "profile": endpoint.profile_id}  # fmt: skip
            endpoint.profile = profile
            endpoint.model_path = model_path
            endpoint.source = Endpoint.Source.ARTIFACT if model.get("job") is not None else Endpoint.Source.PATH
            endpoint.source_job = model.get("job")
            endpoint.source_artifact = str(model.get("artifact", "")).strip().strip("/") if model.get("job") else ""
            endpoint.version += 1
            changes["version"] = endpoint.version
            changes["model"] = model_path
        check_size(endpoint.workspace, profile, low)
        if (low, high) != (endpoint.min_replicas, endpoint.max_replicas):
            changes.update(min=low, max=high)
        if to_zero != endpoint.scale_to_zero_s:
            changes["scale_to_zero_s"] = to_zero
        endpoint.min_replicas, endpoint.max_replicas, endpoint.scale_to_zero_s = low, high, to_zero
        if description is not None and description != endpoint.description:
            endpoint.description = description
            changes["description"] = description
        endpoint.failure_reason = ""
        endpoint.save()
        if changes:
            do_log_event(
                Event.ENDPOINT_UPDATE, endpoint, acting_user=acting_user, origin=origin,
                workspace=endpoint.workspace, data=changes,
            )  # fmt: skip
        scaling.converge(endpoint, timezone.now())
        _live(endpoint)
    return endpoint


def do_delete_endpoint(endpoint: Endpoint, *, acting_user: Any, origin: Origin = SYSTEM) -> Endpoint:
    """Stop every replica and end the endpoint (its URL answers 404 from now on)."""

    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        if endpoint.is_final or endpoint.state == Endpoint.State.DELETING:
            raise Conflict(f"Endpoint {endpoint.name} is already {endpoint.get_state_display().lower()}.")
        endpoint.state = Endpoint.State.DELETING
        endpoint.desired_replicas = 0
        endpoint.save()
        do_log_event(
            Event.ENDPOINT_DELETE, endpoint, acting_user=acting_user, origin=origin, workspace=endpoint.workspace
        )
        scaling.converge(endpoint, timezone.now())
        _live(endpoint)
    return endpoint


# -- replicas ------------------------------------------------------------------------------------


def record_replica_ready(replica: Replica, *, target: str) -> None:
    """Its server answers: the proxy sends it requests from now on. The endpoint's own state
    follows at the autoscaler's next pass (which locks the endpoint, then its replicas: never the
    other way round, as here)."""
    replica.state = Replica.State.READY
    replica.started_at = timezone.now()
    replica.proxy_target = target
    replica.wait_reason = ""
    replica.save()
    endpoint = replica.endpoint
    _live(endpoint, replica={"id": replica.pk, "state": replica.state})
    request_cycle()


def record_replica_end(replica: Replica, state: str, reason: str) -> None:
    """It ended: stopped as asked, or failed (its server did not start, or died). What that means
    for the endpoint (a replacement, a failed rollout, a failed endpoint) the autoscaler decides."""
    Allocation.objects.filter(workload=replica).delete()
    served = replica.started_at is not None
    replica.state = state
    replica.finished_at = timezone.now()
    replica.proxy_target = ""
    if reason:
        replica.reason = reason[:4000]
    replica.save()
    endpoint = replica.endpoint
    if state == Replica.State.FAILED:
        do_log_event(
            Event.ENDPOINT_REPLICA_FAILED, endpoint, workspace=endpoint.workspace,
            data={"replica": replica.pk, "reason": reason[:500], "served": served},
        )  # fmt: skip
    _live(endpoint, replica={"id": replica.pk, "state": replica.state})
    request_cycle()
