"""Running instances and notebooks on their cluster's backend, and converging them to its truth.

Each object has one entry point, ``converge_instance`` / ``converge_notebook``, that does what
its state asks for: start it (PROVISIONING, PENDING/STARTING), tear it down (DELETING,
STOPPING), or check it still runs (RUNNING, READY) and restart it when its processes died. The
worker calls it when something changes; the scheduler loop's ``reconcile_compute`` calls it for
every live object, so a lost message or a crashed worker is caught up.

A notebook's Python environment is built once per package list, which can take minutes: with a
worker, a start that finds it missing hands the build to a task of its own
(``build_notebook_environment``), and the start is asked again once it is built, so that nothing
waits on a build but its notebooks (workers/tasks.py routes both to the ``provision`` queue).

A start can take a while all the same (a server to answer, a batch job to run), so it runs
outside any transaction: the object is first *claimed* (a token in ``backend_state``), the
backend started, and the outcome committed only if the claim still holds. A claim older than
the start timeout is stale and may be taken over; processes a dead worker left behind are found
by their key and stopped (``sweep_local_orphans``).
"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.accounts.tokens import workload_env
from apps.audit.actions import do_log_event
from apps.audit.events import Event
from apps.compute import proxy
from apps.compute.models import Instance, Notebook
from apps.inventory.models import Allocation
from apps.scheduling.backoff import RECONCILE
from apps.scheduling.trigger import request_cycle, request_environment_build, request_workload
from apps.workloads import claims
from apps.workspaces.live import notify
from apps.workspaces.unix import run_as_for
from workers.backends.base import Backend, BackendError, InstanceSpec, NotebookSpec, PolicyRefusal
from workers.backends.pyenv import ensure_env, env_is_built
from workers.backends.registry import backend_for

logger = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
SWEEP_EVERY_S = 30.0


def _devices(instance: Instance) -> list[str]:
    indexes = Allocation.objects.filter(instance=instance).order_by("gpu__index").values_list("gpu__index", flat=True)
    return [str(i) for i in indexes]


def instance_dir(instance: Instance) -> str:
    return str(settings.PORTAL_WORK_DIR / instance.workspace.name / f"instance-{instance.pk}")


def _instance_spec(instance: Instance) -> InstanceSpec:
    members = instance.workspace.memberships.values_list("user__username", flat=True)
    return InstanceSpec(
        key=f"instance-{instance.pk}",
        workspace=instance.workspace.name,
        name=instance.name,
        work_dir=str(settings.PORTAL_WORK_DIR / instance.workspace.name),
        kind=instance.profile.kind,
        devices=_devices(instance),
        gpu_type=instance.gpu_type,
        gpus=float(instance.gpus_per_replica),
        cpu_cores=float(instance.cpu_cores),
        memory_gb=float(instance.memory_gb),
        users=sorted(members),
        run_as=run_as_for(instance.workspace, instance.cluster),
        portal_env=workload_env(instance),
    )


def notebook_auth_url(notebook: Notebook) -> str:
    """Where the notebook's server reaches the portal, server to server (apps/compute/views.py)."""
    base = settings.PORTAL_INTERNAL_URL.rstrip("/")
    return f"{base}/internal/notebooks/{notebook.pk}/"


def _notebook_spec(notebook: Notebook) -> NotebookSpec:
    instance = notebook.instance
    return NotebookSpec(
        key=f"notebook-{notebook.pk}",
        workspace=notebook.workspace.name,
        name=notebook.name,
        work_dir=instance_dir(instance),
        base_url="/",  # the root of its own host
        token=notebook.access_token,
        python_packages=list(notebook.profile.python_packages),
        image=notebook.profile.image,
        devices=_devices(instance),
        cpu_cores=float(instance.cpu_cores),
        memory_gb=float(instance.memory_gb),
        instance_state=dict(instance.backend_state.get("run", {})),
        auth_url=notebook_auth_url(notebook),
        run_as=run_as_for(notebook.workspace, instance.cluster),
        portal_env=workload_env(notebook),
    )


def _backend(cluster: Any, state: dict[str, Any]) -> Backend:
    return backend_for(cluster, state.get("run", {}))


def _stop_quietly(backend: Backend, what: str) -> None:
    try:
        backend.stop(STOP_GRACE_S)
    except BackendError:
        logger.warning("stopping %s left something running; reconcile will retry", what, exc_info=True)


# -- instances ------------------------------------------------------------------------------------


def converge_instance(instance_id: int) -> Instance | None:
    """Do what the instance's state asks of its backend (see the module's docstring)."""
    instance = Instance.objects.select_related("workspace", "cluster", "profile").filter(pk=instance_id).first()
    if instance is None:
        return None
    if instance.state == Instance.State.PROVISIONING:
        return _start_instance(instance_id)
    if instance.state == Instance.State.DELETING:
        return _teardown_instance(instance_id)
    if instance.state == Instance.State.RUNNING:
        return _check_instance(instance_id)
    return instance


def _start_instance(instance_id: int, *, states: tuple[str, ...] = (Instance.State.PROVISIONING,)) -> Instance | None:
    token = claims.claim(Instance, instance_id, states, _instance_start_s())
    if token is None:
        return Instance.objects.filter(pk=instance_id).first()
    instance = Instance.objects.select_related("workspace", "cluster", "profile").get(pk=instance_id)
    backend = backend_for(instance.cluster)
    try:
        endpoint = claims.start_within(backend, _instance_spec(instance), _instance_start_s())
    except (PolicyRefusal, BackendError, claims.StartTimedOut) as exc:
        claims.stop_and_clear(backend, f"instance {instance_id}", STOP_GRACE_S)
        if isinstance(exc, BackendError) and not exc.permanent:
            claims.release(Instance, instance_id, token)
            raise
        return _fail_instance(instance_id, token, str(exc))
    with transaction.atomic():
        instance = Instance.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=instance_id)
        if not claims.holds(instance, token) or instance.state not in states:
            _stop_quietly(backend, f"instance {instance_id}")  # deleted, or taken over, meanwhile
            return instance
        restarted = instance.state == Instance.State.RUNNING
        instance.state = Instance.State.RUNNING
        instance.started_at = instance.started_at or timezone.now()
        instance.backend_state = {**claims.without(instance.backend_state, "starting"), "run": backend.get_state()}
        instance.save()
        do_log_event(
            Event.INSTANCE_RESTART if restarted else Event.INSTANCE_START,
            instance,
            workspace=instance.workspace,
            data={"endpoint": f"{endpoint.host}:{endpoint.port}", "devices": _devices(instance)},
        )
        notify(instance.workspace_id, "instance", {"id": instance.pk, "state": instance.state})
        for notebook_id in instance.notebooks.filter(state=Notebook.State.PENDING).values_list("pk", flat=True):
            request_compute_sync("notebook", notebook_id)
    return instance


def _fail_instance(instance_id: int, token: str | None, reason: str) -> Instance:
    with transaction.atomic():
        instance = Instance.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=instance_id)
        if token is not None and not claims.holds(instance, token):
            return instance
        for notebook in instance.notebooks.filter(state__in=Notebook.LIVE_STATES):
            _end_notebook(notebook, Notebook.State.FAILED, f"its instance failed: {reason}")
        Allocation.objects.filter(instance=instance).delete()
        instance.state = Instance.State.FAILED
        instance.failure_reason = reason[:2000]
        instance.finished_at = timezone.now()
        instance.backend_state = claims.without(instance.backend_state, "starting")
        instance.save()
        do_log_event(Event.INSTANCE_FAIL, instance, workspace=instance.workspace, data={"reason": reason})
        notify(instance.workspace_id, "instance", {"id": instance.pk, "state": instance.state, "reason": reason})
        request_cycle()
    return instance


def _check_instance(instance_id: int) -> Instance | None:
    """A running instance whose process group died (a crash) or was stopped with the embedded
    portal is started again in place, keeping its GPUs; after ``PORTAL_RESTART_LIMIT`` deaths it
    fails."""
    instance = Instance.objects.select_related("workspace", "cluster", "profile").get(pk=instance_id)
    state = instance.backend_state
    if state.get("run") and _backend(instance.cluster, state).poll().running:
        return instance
    restarts = int(state.get("restarts", 0)) + (1 if state.get("run") else 0)
    if restarts > settings.PORTAL_RESTART_LIMIT:
        return _fail_instance(instance_id, None, f"its processes ended {restarts} times")
    with transaction.atomic():
        Instance.objects.filter(pk=instance_id).update(
            backend_state={**claims.without(state, "run"), "restarts": restarts}
        )
    return _start_instance(instance_id, states=(Instance.State.RUNNING,))


def _teardown_instance(instance_id: int) -> Instance:
    """Stop the instance's notebooks and processes, then release its GPUs."""
    for notebook_id in Notebook.objects.filter(instance_id=instance_id, state__in=Notebook.LIVE_STATES).values_list(
        "pk", flat=True
    ):
        _teardown_notebook(notebook_id)
    instance = Instance.objects.select_related("cluster").get(pk=instance_id)
    if instance.state != Instance.State.DELETING:
        return instance
    run = instance.backend_state.get("run")
    if run:  # stopped with no row locked: the stop may wait out a grace period
        backend = _backend(instance.cluster, instance.backend_state)
        backend.stop(STOP_GRACE_S)  # raises if something survived: reconcile tries again
        backend.clear_state()
    with transaction.atomic():
        instance = Instance.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=instance_id)
        if instance.state != Instance.State.DELETING or instance.backend_state.get("run") != run:
            return instance  # changed meanwhile: the next reconcile looks again
        Allocation.objects.filter(instance=instance).delete()
        instance.state = Instance.State.DELETED
        instance.finished_at = timezone.now()
        instance.backend_state = claims.without(instance.backend_state, "run", "starting")
        instance.save()
        do_log_event(Event.INSTANCE_DELETED, instance, workspace=instance.workspace)
        notify(instance.workspace_id, "instance", {"id": instance.pk, "state": instance.state})
        request_cycle()
    return instance


# -- notebooks ------------------------------------------------------------------------------------


def converge_notebook(notebook_id: int) -> Notebook | None:
    """Do what the notebook's state asks of its backend (see the module's docstring)."""
    notebook = Notebook.objects.select_related("instance").filter(pk=notebook_id).first()
    if notebook is None:
        return None
    if notebook.state in (Notebook.State.PENDING, Notebook.State.STARTING):
        if notebook.instance.state == Instance.State.RUNNING:
            return _start_notebook(notebook_id)
        return notebook
    if notebook.state == Notebook.State.STOPPING:
        return _teardown_notebook(notebook_id)
    if notebook.state == Notebook.State.READY:
        return _check_notebook(notebook_id)
    return notebook


def _instance_start_s() -> float:
    """How long an instance's start may take (and hold its claim) before it fails."""
    return float(settings.PORTAL_INSTANCE_START_TIMEOUT_S)


def _notebook_claim_s() -> float:
    """How long a notebook's start or build may hold its claim before another may take it over."""
    return float(settings.PORTAL_NOTEBOOK_START_TIMEOUT_S) + 600


def _start_notebook(notebook_id: int) -> Notebook | None:
    states = (Notebook.State.PENDING, Notebook.State.STARTING, Notebook.State.READY)
    token = claims.claim(Notebook, notebook_id, states, _notebook_claim_s())
    if token is None:
        return Notebook.objects.filter(pk=notebook_id).first()
    with transaction.atomic():
        notebook = Notebook.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=notebook_id)
        if notebook.state != Notebook.State.STARTING:
            notebook.state = Notebook.State.STARTING
            notebook.save(update_fields=["state"])
            notify(notebook.workspace_id, "notebook", {"id": notebook.pk, "state": notebook.state})
    notebook = Notebook.objects.select_related("workspace", "profile", "instance__workspace", "instance__cluster").get(
        pk=notebook_id
    )
    backend = backend_for(notebook.instance.cluster)
    if settings.PORTAL_WORKLOAD_TRIGGER == "task" and _environment_to_build(backend, notebook):
        claims.release(Notebook, notebook_id, token)
        request_environment_build(notebook_id)  # which asks for the start again once built
        return notebook
    try:
        endpoint = claims.start_within(backend, _notebook_spec(notebook), _notebook_claim_s())
        target = endpoint.url or f"http://{endpoint.host}:{endpoint.port}"
        if not proxy.configured():
            raise BackendError("no notebook proxy is configured (PORTAL_PROXY_API_URL)", permanent=True)
        proxy.add_route(notebook.host, target, notebook.pk)
    except (PolicyRefusal, BackendError, proxy.ProxyError, claims.StartTimedOut) as exc:
        claims.stop_and_clear(backend, f"notebook {notebook_id}", STOP_GRACE_S)
        if isinstance(exc, BackendError | proxy.ProxyError) and not getattr(exc, "permanent", False):
            claims.release(Notebook, notebook_id, token)
            raise
        return _fail_notebook(notebook_id, token, str(exc))
    with transaction.atomic():
        notebook = Notebook.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=notebook_id)
        if not claims.holds(notebook, token) or notebook.state != Notebook.State.STARTING:
            _stop_quietly(backend, f"notebook {notebook_id}")  # deleted, or taken over, meanwhile
            if notebook.state != Notebook.State.READY:
                _remove_route(notebook)
            return notebook
        notebook.state = Notebook.State.READY
        notebook.started_at = notebook.started_at or timezone.now()
        notebook.failure_reason = ""
        notebook.backend_state = {
            **claims.without(notebook.backend_state, "starting"),
            "run": backend.get_state(),
            "target": target,
        }
        notebook.save()
        do_log_event(Event.NOTEBOOK_READY, notebook, workspace=notebook.workspace, data={"target": target})
        notify(notebook.workspace_id, "notebook", {"id": notebook.pk, "state": notebook.state, "url": notebook.url})
    return notebook


def _environment(backend: Backend, notebook: Notebook) -> tuple[list[str], Path, str] | None:
    """The packages, root and Python of the environment the backend builds for the notebook where
    the worker runs (local and Slurm: under their ``env_root``); None where the image has it."""
    root = getattr(backend, "env_root", "")
    if not root:
        return None
    return list(notebook.profile.python_packages), Path(root), getattr(backend, "python", sys.executable)


def _environment_to_build(backend: Backend, notebook: Notebook) -> bool:
    environment = _environment(backend, notebook)
    try:
        return environment is not None and not env_is_built(*environment)
    except PolicyRefusal:
        return False  # the start refuses it, with the reason


def build_notebook_environment(notebook_id: int) -> Notebook | None:
    """Build the environment a starting notebook needs, claiming the notebook meanwhile (so its
    start is not asked again), then ask for its start, which finds the environment built."""
    token = claims.claim(Notebook, notebook_id, (Notebook.State.PENDING, Notebook.State.STARTING), _notebook_claim_s())
    if token is None:
        return Notebook.objects.filter(pk=notebook_id).first()
    notebook = Notebook.objects.select_related("profile", "instance__cluster").get(pk=notebook_id)
    try:
        environment = _environment(backend_for(notebook.instance.cluster), notebook)
        if environment is not None:
            ensure_env(*environment)
    except (PolicyRefusal, BackendError) as exc:
        if isinstance(exc, BackendError) and not exc.permanent:
            claims.release(Notebook, notebook_id, token)
            raise
        return _fail_notebook(notebook_id, token, str(exc))
    claims.release(Notebook, notebook_id, token)
    request_compute_sync("notebook", notebook_id)
    return notebook


def _remove_route(notebook: Notebook) -> None:
    try:
        proxy.remove_route(proxy.host_route(notebook.host))
    except proxy.ProxyError:
        logger.warning("could not remove the route of notebook %s; reconcile will", notebook.pk, exc_info=True)


def _fail_notebook(notebook_id: int, token: str | None, reason: str) -> Notebook:
    with transaction.atomic():
        notebook = Notebook.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=notebook_id)
        if token is not None and not claims.holds(notebook, token):
            return notebook
        _end_notebook(notebook, Notebook.State.FAILED, reason)
    return notebook


def _end_notebook(notebook: Notebook, state: str, reason: str = "") -> None:
    """Record a notebook's end (its processes already stopped, or never started)."""
    notebook.state = state
    notebook.failure_reason = reason[:2000]
    notebook.stopped_at = timezone.now()
    notebook.backend_state = claims.without(notebook.backend_state, "run", "starting", "target")
    notebook.save()
    event = Event.NOTEBOOK_FAIL if state == Notebook.State.FAILED else Event.NOTEBOOK_STOPPED
    do_log_event(event, notebook, workspace=notebook.workspace, data={"reason": reason} if reason else None)
    notify(notebook.workspace_id, "notebook", {"id": notebook.pk, "state": notebook.state})


def _check_notebook(notebook_id: int) -> Notebook | None:
    """A ready notebook whose server died is started again (its route pointed at nothing), as is
    one whose server was stopped with the embedded portal; after ``PORTAL_RESTART_LIMIT`` deaths
    it fails."""
    notebook = Notebook.objects.select_related("instance__cluster").get(pk=notebook_id)
    state = notebook.backend_state
    if state.get("run") and _backend(notebook.instance.cluster, state).poll().running:
        return notebook
    restarts = int(state.get("restarts", 0)) + (1 if state.get("run") else 0)
    if restarts > settings.PORTAL_RESTART_LIMIT:
        _remove_route(notebook)
        return _fail_notebook(notebook_id, None, f"its server ended {restarts} times")
    with transaction.atomic():
        Notebook.objects.filter(pk=notebook_id).update(
            state=Notebook.State.STARTING, backend_state={**claims.without(state, "run"), "restarts": restarts}
        )
    return _start_notebook(notebook_id)


def _teardown_notebook(notebook_id: int) -> Notebook:
    """Stop a notebook's server with no row locked (a stop may wait out a grace period), then
    record it stopped. A start that records a server meanwhile has it stopped too; one still
    under way stops what it made when it finds the notebook stopped."""
    for _ in range(3):
        notebook = Notebook.objects.select_related("instance__cluster").get(pk=notebook_id)
        if notebook.state in (Notebook.State.STOPPED, Notebook.State.FAILED):
            return notebook
        _remove_route(notebook)
        run = notebook.backend_state.get("run")
        if run:
            backend = _backend(notebook.instance.cluster, notebook.backend_state)
            backend.stop(STOP_GRACE_S)  # raises if something survived: reconcile tries again
            backend.clear_state()
        with transaction.atomic():
            notebook = Notebook.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=notebook_id)
            if notebook.state in (Notebook.State.STOPPED, Notebook.State.FAILED):
                return notebook
            if notebook.backend_state.get("run") in (None, run):
                _end_notebook(notebook, Notebook.State.STOPPED)
                return notebook
    raise BackendError(f"notebook {notebook_id} was started again while it was being stopped")


# -- triggers and reconcile -----------------------------------------------------------------------


def request_compute_sync(kind: str, pk: int) -> None:
    """Once committed, have the worker converge an instance or notebook (see PORTAL_WORKLOAD_TRIGGER)."""
    request_workload(kind, pk)


def reconcile_compute(*, sweep: bool = True) -> dict[str, int]:
    """Converge every live instance and notebook, drop stale proxy routes and restore lost ones,
    stop orphaned processes. One object that fails is logged and retried next time."""
    counts = {"instances": 0, "notebooks": 0, "failed": 0, "routes_removed": 0, "routes_added": 0, "orphans_stopped": 0}
    lost = timezone.now() - timedelta(seconds=settings.PORTAL_START_LOST_AFTER_S)
    instances = Instance.objects.filter(
        Q(state__in=[Instance.State.RUNNING, Instance.State.DELETING])
        | Q(state=Instance.State.PROVISIONING, admitted_at__lt=lost)
    ).values_list("pk", flat=True)
    notebooks = Notebook.objects.filter(
        Q(state__in=[Notebook.State.READY, Notebook.State.STOPPING])
        | Q(state__in=[Notebook.State.PENDING, Notebook.State.STARTING], instance__state=Instance.State.RUNNING)
    ).values_list("pk", flat=True)
    for converge, name, ids in (
        (converge_instance, "instances", list(instances)),
        (converge_notebook, "notebooks", list(notebooks)),
    ):
        for pk in ids:
            if not RECONCILE.due(name[:-1], pk):
                continue
            try:
                _converge_or_dispatch(converge, name[:-1], pk)
                counts[name] += 1
                RECONCILE.succeeded(name[:-1], pk)
            except Exception:  # per object, with backoff: one broken workload must not wedge the loop
                counts["failed"] += 1
                delay = RECONCILE.failed(name[:-1], pk)
                logger.exception("reconcile of %s %s failed; retrying in %.0f s", name[:-1], pk, delay)
    try:
        counts["routes_removed"], counts["routes_added"] = _sync_routes()
    except proxy.ProxyError:
        logger.warning("could not read the notebook proxy's routes", exc_info=True)
    if sweep:  # reads /proc and squeue: the scheduler loop asks for it every SWEEP_EVERY_S
        counts["orphans_stopped"] = sweep_orphans()
    return counts


def _converge_or_dispatch(converge: Any, kind: str, pk: int) -> None:
    """Starts can be slow (a notebook environment's first build): with a worker, they go to it,
    unless a start is already under way; checks and teardowns are quick and done here."""
    model = Instance if kind == "instance" else Notebook
    row = model.objects.filter(pk=pk).values("state", "backend_state").first()
    if row is None:
        return
    starting = row["state"] in (Instance.State.PROVISIONING, Notebook.State.PENDING, Notebook.State.STARTING)
    if starting and settings.PORTAL_WORKLOAD_TRIGGER == "task":
        if not claims.claim_live(row["backend_state"].get("starting"), float(settings.PORTAL_NOTEBOOK_START_TIMEOUT_S)):
            request_compute_sync(kind, pk)
        return
    converge(pk)


def _sync_routes() -> tuple[int, int]:
    """Remove the proxy's routes of notebooks that are not ready (a crash between a stop and its
    record), and route ready notebooks the proxy lost (a proxy restart). Returns (removed, added)."""
    if not proxy.configured():
        return 0, 0
    ready = {
        proxy.host_route(notebook.host): notebook
        for notebook in Notebook.objects.filter(state=Notebook.State.READY).only("pk", "name", "backend_state")
    }
    table = proxy.routes()
    removed = added = 0
    for route, entry in table.items():
        if "portal_notebook" not in entry:
            continue  # not one of ours
        notebook = ready.get(route.rstrip("/"))
        if notebook is None or entry["portal_notebook"] != notebook.pk:
            proxy.remove_route(route)
            removed += 1
    for route, notebook in ready.items():
        if route not in table and notebook.backend_state.get("target"):
            proxy.add_route(notebook.host, notebook.backend_state["target"], notebook.pk)
            added += 1
    return removed, added


def sweep_orphans() -> int:
    """Stop what a worker killed between starting a workload and recording it left behind, on every
    cluster that is enabled or holds a live workload: its backend's ``sweep_orphans()`` keeps what
    live workloads recorded and the workloads starting right now. Returns how many were stopped."""
    from apps.inventory.models import Cluster
    from workers.backends.base import Keep

    recorded, starting = _recorded_and_starting()
    clusters = list(Cluster.objects.filter(Q(enabled=True) | Q(pk__in=recorded)).order_by("pk"))
    # Clusters of one kind may see each other's workloads (this machine's processes, the jobs one
    # Slurm controller lists): each keeps what any of them recorded.
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for cluster in clusters:
        by_kind.setdefault(cluster.kind, []).extend(recorded.get(cluster.pk, []))
    stopped = 0
    for cluster in clusters:
        keep = Keep(tuple(by_kind[cluster.kind]), frozenset(starting))
        try:
            stopped += len(backend_for(cluster).sweep_orphans(str(settings.PORTAL_WORK_DIR), keep))
        except BackendError:
            logger.warning("could not look for orphaned workloads on cluster %s", cluster.name, exc_info=True)
    return stopped


def _recorded_and_starting() -> tuple[dict[int, list[dict[str, Any]]], set[str]]:
    """The backend states that live workloads recorded, by cluster id, and the keys of the
    workloads being started right now (not recorded yet)."""
    from apps.jobs.models import Job

    timeout = float(settings.PORTAL_NOTEBOOK_START_TIMEOUT_S) + 600
    recorded: dict[int, list[dict[str, Any]]] = {}
    starting = {f"job-{pk}" for pk in Job.objects.filter(state=Job.State.ADMITTED).values_list("pk", flat=True)}
    for model, prefix, states, cluster in (
        (Job, "job", Job.ACTIVE_STATES, "cluster"),
        (Instance, "instance", Instance.LIVE_STATES, "cluster"),
        (Notebook, "notebook", Notebook.LIVE_STATES, "instance__cluster"),
    ):
        for pk, state, cluster_id in model.objects.filter(state__in=states).values_list("pk", "backend_state", cluster):
            if state.get("run") and cluster_id is not None:
                recorded.setdefault(cluster_id, []).append(state["run"])
            if claims.claim_live(state.get("starting"), timeout):
                starting.add(f"{prefix}-{pk}")
    return recorded, starting


def stop_local_compute() -> int:
    """Stop the processes of every instance and notebook on this machine, keeping their rows
    running: the embedded portal's shutdown. At the next start, reconcile starts them again."""
    stopped = 0
    for model in (Notebook, Instance):
        cluster = "instance__cluster" if model is Notebook else "cluster"
        rows = model.objects.filter(**{f"{cluster}__kind": "local", "backend_state__has_key": "run"})
        for pk in rows.values_list("pk", flat=True):
            with transaction.atomic():
                row = model.objects.select_for_update(of=("self",)).select_related(cluster).get(pk=pk)
                owner = row.instance.cluster if isinstance(row, Notebook) else row.cluster
                _stop_quietly(_backend(owner, row.backend_state), f"{model.__name__} {pk}")
                row.backend_state = claims.without(row.backend_state, "run")
                row.save(update_fields=["backend_state"])
                stopped += 1
    return stopped
