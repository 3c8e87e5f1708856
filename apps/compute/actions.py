"""State changes of instances and notebooks.

The ``record_*`` actions record what their backend did; the workload host
(apps/workloads/host.py, through apps/compute/hosting.py) calls them on the row it locked, inside
its transaction.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from apps.accounts.stamps import stamp_matches
from apps.audit.actions import SYSTEM, Origin, apply_changes, do_log_event
from apps.audit.events import Event
from apps.catalog.models import ComputeProfile, NotebookProfile
from apps.compute.models import Instance, Notebook, NotebookAuthCode
from apps.errors import ActionError, Conflict, LimitExceeded
from apps.inventory.models import Allocation, Cluster
from apps.jobs.actions import check_cluster_fits
from apps.scheduling.limits import check_request_size
from apps.scheduling.trigger import request_cycle, request_workload
from apps.workloads import progress
from apps.workspaces.access import USE, may
from apps.workspaces.live import notify
from apps.workspaces.models import Workspace


def _lock(workspace: Workspace) -> Workspace:
    """Lock the workspace row so that concurrent requests see each other's counts."""
    return Workspace.objects.select_for_update().get(pk=workspace.pk)


def _check_profile_allowed(workspace: Workspace, profile: ComputeProfile, user: Any) -> None:
    if not ComputeProfile.objects.visible_to(user).filter(pk=profile.pk).exists():
        raise ActionError(f"Profile {profile.name} is not available to you.", field="profile")
    allowed = workspace.allowed_profiles.all()
    if allowed.exists() and not allowed.filter(pk=profile.pk).exists():
        raise ActionError(f"Workspace {workspace.name} does not allow profile {profile.name}.", field="profile")


def check_profile_size(workspace: Workspace, profile: ComputeProfile) -> None:
    """Refuse a profile larger than the workspace could ever be given (its GPU quota and what it
    may borrow, its CPU and memory limits, the largest node): the launch's own size rule."""
    check_request_size(
        workspace,
        gpu_type=profile.gpu_type,
        gpus_per_replica=profile.gpu_count,
        replicas=1,
        cpu_cores=profile.cpu_cores,
        memory_gb=profile.memory_gb,
    )


def why_not_launchable(workspace: Workspace, profile: ComputeProfile) -> str:
    """Why the workspace could never run this profile ("" if it could): for the wizard's sizes."""
    try:
        check_profile_size(workspace, profile)
    except ActionError as exc:
        return exc.message
    return ""


def check_launch_instance(
    workspace: Workspace,
    *,
    name: str,
    profile: ComputeProfile,
    description: str = "",
    requested_cluster: Cluster | None = None,
    acting_user: Any,
    origin: Origin = SYSTEM,
) -> Instance:
    """Validate a launch against the workspace's hard limits and queue the instance, to run on
    `requested_cluster` (an enabled cluster whose nodes could hold it) or, without one, on any.

    Raises LimitExceeded when the workspace is at its max instances or could never be given
    the profile's size, ActionError for a profile it may not use or a name in use.
    """
    with transaction.atomic():
        workspace = _lock(workspace)
        _check_profile_allowed(workspace, profile, acting_user)
        live = Instance.objects.filter(workspace=workspace, state__in=Instance.LIVE_STATES)
        if live.count() >= workspace.max_instances:
            raise LimitExceeded(
                f"Workspace {workspace.name} already has {workspace.max_instances} instances, its limit; "
                "delete one before launching another."
            )
        if live.filter(name=name).exists():
            raise ActionError(f"An instance named {name} already exists in {workspace.name}.", field="name")
        check_profile_size(workspace, profile)
        if requested_cluster is not None:
            check_cluster_fits(
                requested_cluster,
                gpu_type=profile.gpu_type,
                gpus_per_replica=profile.gpu_count,
                replicas=1,
                cpu_cores=profile.cpu_cores,
                memory_gb=profile.memory_gb,
            )
        instance = Instance.objects.create(
            workspace=workspace,
            name=name,
            description=description,
            profile=profile,
            gpu_type=profile.gpu_type,
            gpus_per_replica=profile.gpu_count,
            cpu_cores=profile.cpu_cores,
            memory_gb=profile.memory_gb,
            requested_cluster=requested_cluster,
            priority_class=profile.priority_class,
            created_by=acting_user if acting_user.is_authenticated else None,
        )
        do_log_event(
            Event.INSTANCE_LAUNCH,
            instance,
            acting_user=acting_user,
            origin=origin,
            workspace=workspace,
            data={"profile": profile.name},
        )
        notify(workspace.pk, "instance", {"id": instance.pk, "state": instance.state})
        request_cycle()
    return instance


def do_cull_instance(instance: Instance, reason: str) -> Instance:
    """The portal deletes an instance past its workspace's maximum runtime, saying why on its page."""
    with transaction.atomic():
        Instance.objects.filter(pk=instance.pk).update(stop_reason=reason[:500])
        do_log_event(Event.INSTANCE_CULL, instance, workspace=instance.workspace, data={"reason": reason})
        return do_delete_instance(instance, acting_user=None)


def do_delete_instance(instance: Instance, *, acting_user: Any, origin: Origin = SYSTEM) -> Instance:
    """Delete an instance and its notebooks, releasing its GPUs. Irreversible."""
    with transaction.atomic():
        instance = Instance.objects.select_for_update().get(pk=instance.pk)
        if instance.state in (Instance.State.DELETED, Instance.State.DELETING):
            raise Conflict(f"Instance {instance.name} is already {instance.get_state_display().lower()}.")
        for notebook in instance.notebooks.filter(state__in=Notebook.LIVE_STATES).exclude(
            state=Notebook.State.STOPPING
        ):
            do_delete_notebook(notebook, acting_user=acting_user, origin=origin)
        previous = instance.state
        instance.wait_reason = ""
        instance.workspace_queue_position = instance.cluster_queue_position = None
        if _has_processes(instance):
            # The worker stops its processes, then releases its GPUs and marks it deleted.
            instance.state = Instance.State.DELETING
            request_workload("instance", instance.pk)
        else:
            Allocation.objects.filter(workload=instance).delete()
            instance.state = Instance.State.DELETED
            instance.finished_at = timezone.now()
        instance.save()
        do_log_event(
            Event.INSTANCE_DELETE,
            instance,
            acting_user=acting_user,
            origin=origin,
            workspace=instance.workspace,
            data={"previous_state": previous},
        )
        notify(instance.workspace_id, "instance", {"id": instance.pk, "state": instance.state})
        request_cycle()
    return instance


def check_launch_notebook(
    workspace: Workspace,
    *,
    instance: Instance,
    name: str,
    profile: NotebookProfile,
    description: str = "",
    acting_user: Any,
    origin: Origin = SYSTEM,
) -> Notebook:
    """Queue a notebook on an instance of the same workspace, within its max notebooks."""
    with transaction.atomic():
        workspace = _lock(workspace)
        if instance.workspace_id != workspace.pk:
            raise ActionError("The instance belongs to another workspace.", field="instance")
        if instance.state not in (Instance.State.QUEUED, Instance.State.PROVISIONING, Instance.State.RUNNING):
            raise ActionError(f"Instance {instance.name} is {instance.get_state_display().lower()}.", field="instance")
        if not NotebookProfile.objects.visible_to(acting_user).filter(pk=profile.pk).exists():
            raise ActionError(f"Notebook profile {profile.name} is not available to you.", field="profile")
        live = Notebook.objects.filter(workspace=workspace, state__in=Notebook.LIVE_STATES)
        if live.count() >= workspace.max_notebooks:
            raise LimitExceeded(
                f"Workspace {workspace.name} already has {workspace.max_notebooks} notebooks, its limit; "
                "delete one before launching another."
            )
        if live.filter(name=name).exists():
            raise ActionError(f"A notebook named {name} already exists in {workspace.name}.", field="name")
        notebook = Notebook.objects.create(
            workspace=workspace,
            instance=instance,
            name=name,
            description=description,
            profile=profile,
            created_by=acting_user if acting_user.is_authenticated else None,
        )
        do_log_event(
            Event.NOTEBOOK_LAUNCH,
            notebook,
            acting_user=acting_user,
            origin=origin,
            workspace=workspace,
            data={"instance": instance.name, "profile": profile.name},
        )
        notify(workspace.pk, "notebook", {"id": notebook.pk, "state": notebook.state}, instance_id=notebook.instance_id)
        if instance.state == Instance.State.RUNNING:
            request_workload("notebook", notebook.pk)
    return notebook


def _has_processes(row: Instance | Notebook) -> bool:
    """Whether a backend holds something of it, or a worker is starting it right now."""
    return row.backend_state is not None or row.start_claim is not None


def do_delete_notebook(notebook: Notebook, *, acting_user: Any, origin: Origin = SYSTEM) -> Notebook:
    """Stop a notebook (its files stay in the workspace); it can be started again."""
    return _stop_notebook(notebook, Event.NOTEBOOK_DELETE, "", acting_user=acting_user, origin=origin)


def do_cull_notebook(notebook: Notebook, reason: str) -> Notebook:
    """The portal stops a notebook, saying why on its page ("culled: idle for 2 h 10 min")."""
    return _stop_notebook(notebook, Event.NOTEBOOK_CULL, reason, acting_user=None, origin=SYSTEM)


def _stop_notebook(notebook: Notebook, event: Event, reason: str, *, acting_user: Any, origin: Origin) -> Notebook:
    with transaction.atomic():
        notebook = Notebook.objects.select_for_update().get(pk=notebook.pk)
        if notebook.state in (Notebook.State.STOPPED, Notebook.State.STOPPING):
            raise Conflict(f"Notebook {notebook.name} is already stopped.")
        if _has_processes(notebook):
            notebook.state = Notebook.State.STOPPING  # the worker removes its route and process
            request_workload("notebook", notebook.pk)
        else:
            notebook.state = Notebook.State.STOPPED
            notebook.stopped_at = timezone.now()
        notebook.stop_reason = reason[:500]
        notebook.save()
        do_log_event(
            event,
            notebook,
            acting_user=acting_user,
            origin=origin,
            workspace=notebook.workspace,
            data={"reason": reason} if reason else None,
        )
        notify(
            notebook.workspace_id,
            "notebook",
            {"id": notebook.pk, "state": notebook.state},
            instance_id=notebook.instance_id,
        )
    return notebook


def do_start_notebook(notebook: Notebook, *, acting_user: Any, origin: Origin = SYSTEM) -> Notebook:
    """Start a stopped notebook again, on its instance, at its own address: its files are where
    they were. Within the workspace's max notebooks, and while no live notebook took its name."""
    with transaction.atomic():
        workspace = _lock(notebook.workspace)
        notebook = Notebook.objects.select_for_update().select_related("instance").get(pk=notebook.pk)
        if notebook.state != Notebook.State.STOPPED:
            raise Conflict(
                f"Notebook {notebook.name} is {notebook.get_state_display().lower()}: only a stopped one starts."
            )
        instance = notebook.instance
        if instance.state not in (Instance.State.QUEUED, Instance.State.PROVISIONING, Instance.State.RUNNING):
            raise Conflict(f"Its instance {instance.name} is {instance.get_state_display().lower()}: launch a new one.")
        live = Notebook.objects.filter(workspace=workspace, state__in=Notebook.LIVE_STATES)
        if live.count() >= workspace.max_notebooks:
            raise LimitExceeded(
                f"Workspace {workspace.name} already has {workspace.max_notebooks} notebooks, its limit; "
                "stop one before starting another."
            )
        if live.filter(name=notebook.name).exists():
            raise Conflict(f"Another notebook named {notebook.name} runs in {workspace.name}.")
        notebook.state = Notebook.State.PENDING
        notebook.stop_reason = notebook.failure_reason = ""
        notebook.started_at = notebook.stopped_at = notebook.idle_warned_at = None
        notebook.start_progress = progress.waiting()  # its new start's steps begin now
        notebook.save()
        do_log_event(Event.NOTEBOOK_START, notebook, acting_user=acting_user, origin=origin, workspace=workspace)
        notify(workspace.pk, "notebook", {"id": notebook.pk, "state": notebook.state}, instance_id=instance.pk)
        if instance.state == Instance.State.RUNNING:
            request_workload("notebook", notebook.pk)
    return notebook


def do_update_instance(instance: Instance, *, acting_user: Any, origin: Origin = SYSTEM, **fields: Any) -> Instance:
    """Change what may change on a launched instance: its description."""
    return _update_description(instance, Event.INSTANCE_UPDATE, fields, acting_user, origin)


def do_update_notebook(notebook: Notebook, *, acting_user: Any, origin: Origin = SYSTEM, **fields: Any) -> Notebook:
    """Change what may change on a notebook: its description."""
    return _update_description(notebook, Event.NOTEBOOK_UPDATE, fields, acting_user, origin)


def _update_description(obj: Any, event: Event, fields: dict[str, Any], acting_user: Any, origin: Origin) -> Any:
    with transaction.atomic():
        obj = type(obj).objects.select_for_update().get(pk=obj.pk)
        changed = apply_changes(obj, {k: v for k, v in fields.items() if k == "description"})
        if changed:
            obj.save(update_fields=list(changed))
            do_log_event(event, obj, acting_user=acting_user, origin=origin, workspace=obj.workspace, data=changed)
    return obj


# -- signing in to a notebook's server (the handoff of docs/notebooks.md) --------------------------

AUTH_CODE_TTL = timedelta(seconds=30)


def _code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def may_use_notebook(notebook: Notebook, user: Any) -> bool:
    """Whether ``user`` may use the notebook's server: a member or owner of its workspace, or a
    collaborator with write access to its instance."""
    return may(user, notebook, USE)


@transaction.atomic(durable=True)
def do_issue_notebook_code(notebook: Notebook, *, acting_user: Any, origin: Origin = SYSTEM) -> str:
    """A code that signs ``acting_user`` in to the notebook's server: single-use, valid for
    ``AUTH_CODE_TTL``, bound to this notebook and user. The caller has checked that the user may
    use the notebook; only the code's hash is stored. Logged as the user opening the notebook."""
    now = timezone.now()
    NotebookAuthCode.objects.filter(expires_at__lt=now - AUTH_CODE_TTL).delete()  # long dead: keep the table small
    code = secrets.token_urlsafe(32)
    NotebookAuthCode.objects.create(
        notebook=notebook, user=acting_user, code_hash=_code_hash(code), expires_at=now + AUTH_CODE_TTL
    )
    do_log_event(Event.NOTEBOOK_OPEN, notebook, acting_user=acting_user, origin=origin, workspace=notebook.workspace)
    return code


@transaction.atomic(durable=True)
def do_redeem_notebook_code(notebook: Notebook, code: str) -> Any | None:
    """The user a code was issued to, if it is this notebook's, unused and unexpired, and the user
    may still use the notebook; the code is spent either way. None otherwise."""
    now = timezone.now()
    spent = NotebookAuthCode.objects.filter(
        code_hash=_code_hash(code), notebook=notebook, used_at__isnull=True, expires_at__gt=now
    ).update(used_at=now)
    if spent != 1:
        return None
    user = NotebookAuthCode.objects.select_related("user").get(code_hash=_code_hash(code)).user
    if not user.is_active or not may_use_notebook(notebook, user):
        return None
    return user


def check_notebook_secret(notebook: Notebook | None, presented: str) -> bool:
    """Whether ``presented`` is the notebook's own secret (its server's token), in constant time."""
    expected = notebook.access_token if notebook is not None else secrets.token_urlsafe(32)
    return bool(presented) and hmac.compare_digest(expected.encode(), presented.encode())


def notebook_user(notebook: Notebook, username: str, stamp: str) -> Any | None:
    """The active user of that name, if they may use the notebook and ``stamp`` (what their session
    on the notebook's server carries: apps/accounts/stamps.py) is still their credential stamp. A
    password change, a deactivation or the end of their single sign-on ends that session."""
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None or not stamp_matches(user, stamp):
        return None
    return user if may_use_notebook(notebook, user) else None


def _drop_unredeemed_codes(notebook: Notebook) -> None:
    """The sign-in codes of a notebook whose server is gone: none is redeemed by the next one."""
    NotebookAuthCode.objects.filter(notebook=notebook, used_at__isnull=True).delete()


def record_instance_start(instance: Instance, *, endpoint: str, restarted: bool) -> None:
    """Its processes run (the host set its backend state); its waiting notebooks start next."""
    instance.state = Instance.State.RUNNING
    instance.started_at = instance.started_at or timezone.now()
    instance.save()
    devices = list(
        Allocation.objects.filter(workload=instance).order_by("gpu__index").values_list("gpu__index", flat=True)
    )
    do_log_event(
        Event.INSTANCE_RESTART if restarted else Event.INSTANCE_START,
        instance,
        workspace=instance.workspace,
        data={"endpoint": endpoint, "devices": [str(d) for d in devices]},
    )
    notify(instance.workspace_id, "instance", {"id": instance.pk, "state": instance.state})
    for notebook_id in instance.notebooks.filter(state=Notebook.State.PENDING).values_list("pk", flat=True):
        request_workload("notebook", notebook_id)


def record_instance_failure(instance: Instance, reason: str) -> None:
    """It could not start, or its processes died too often: its notebooks fail with it."""
    for notebook in instance.notebooks.filter(state__in=Notebook.LIVE_STATES):
        record_notebook_end(notebook, Notebook.State.FAILED, f"its instance failed: {reason}")
    Allocation.objects.filter(workload=instance).delete()
    instance.state = Instance.State.FAILED
    instance.failure_reason = reason[:2000]
    instance.finished_at = timezone.now()
    instance.save()
    do_log_event(Event.INSTANCE_FAIL, instance, workspace=instance.workspace, data={"reason": reason})
    notify(instance.workspace_id, "instance", {"id": instance.pk, "state": instance.state, "reason": reason})
    request_cycle()


def record_instance_deleted(instance: Instance) -> None:
    """Its backend stopped a deleted instance: its GPUs go back."""
    Allocation.objects.filter(workload=instance).delete()
    instance.state = Instance.State.DELETED
    instance.finished_at = timezone.now()
    instance.save()
    do_log_event(Event.INSTANCE_DELETED, instance, workspace=instance.workspace)
    notify(instance.workspace_id, "instance", {"id": instance.pk, "state": instance.state})
    request_cycle()


def record_notebook_starting(notebook: Notebook) -> None:
    if notebook.state != Notebook.State.STARTING:
        _mark_starting(notebook)


def record_notebook_lost(notebook: Notebook) -> None:
    """Its server's processes were found gone (the host starts it again next): it is starting, and
    the codes issued for the server that died are void. Its route is removed by the caller."""
    _drop_unredeemed_codes(notebook)
    _mark_starting(notebook)


def _mark_starting(notebook: Notebook) -> None:
    notebook.state = Notebook.State.STARTING
    notebook.save(update_fields=["state"])
    state = {"id": notebook.pk, "state": notebook.state}
    notify(notebook.workspace_id, "notebook", state, instance_id=notebook.instance_id)


def record_notebook_ready(notebook: Notebook, *, target: str) -> None:
    """Its server answers, behind the proxy at `target`."""
    notebook.state = Notebook.State.READY
    notebook.started_at = notebook.started_at or timezone.now()
    notebook.failure_reason = ""
    notebook.proxy_target = target
    notebook.save()
    do_log_event(Event.NOTEBOOK_READY, notebook, workspace=notebook.workspace, data={"target": target})
    notify(
        notebook.workspace_id,
        "notebook",
        {"id": notebook.pk, "state": notebook.state, "url": notebook.url},
        instance_id=notebook.instance_id,
    )


def record_notebook_end(notebook: Notebook, state: str, reason: str = "") -> None:
    """Record a notebook's end (its processes already stopped, or never started); the sign-in
    codes issued for it and not redeemed are void."""
    _drop_unredeemed_codes(notebook)
    notebook.state = state
    notebook.failure_reason = reason[:2000]
    notebook.stopped_at = timezone.now()
    notebook.backend_state = notebook.start_claim = None
    notebook.proxy_target = ""
    notebook.save()
    event = Event.NOTEBOOK_FAIL if state == Notebook.State.FAILED else Event.NOTEBOOK_STOPPED
    do_log_event(event, notebook, workspace=notebook.workspace, data={"reason": reason} if reason else None)
    notify(
        notebook.workspace_id,
        "notebook",
        {"id": notebook.pk, "state": notebook.state},
        instance_id=notebook.instance_id,
    )
