"""Instances and notebooks as kinds of workload of the host (apps/workloads/host.py).

An admitted instance is started; a running one is watched and, when its processes died (or
stopped with the embedded portal), started again in place, keeping its GPUs, up to
``PORTAL_RESTART_LIMIT`` times; a deleted one is stopped, its notebooks first. A notebook starts
once its instance runs, behind the notebook proxy (its own host name), and is watched and stopped
the same way.

A notebook's Python environment is built once per package list, which can take minutes: with a
worker, a start that finds it missing hands the build to a task of its own
(``build_notebook_environment``), and the start is asked again once it is built, so that nothing
waits on a build but its notebooks (workers/tasks.py routes both to the ``provision`` queue).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet

from apps.accounts.tokens import workload_env
from apps.alerts import evaluate as alert_evaluation
from apps.compute import actions, culling, proxy
from apps.compute.models import Instance, Notebook
from apps.inventory.models import Allocation
from apps.provisioning.models import backend_reservation
from apps.scheduling.trigger import request_environment_build, request_workload
from apps.workloads import claims, host, progress
from apps.workloads.host import Kind, Phase
from apps.workspaces.disks import disk_for
from apps.workspaces.unix import run_as_for
from workers.backends.base import Backend, BackendError, Endpoint, InstanceSpec, NotebookSpec, PolicyRefusal
from workers.backends.pyenv import ensure_env, ensure_sdk_env, env_is_built
from workers.backends.registry import backend_for

logger = logging.getLogger(__name__)


def _devices(instance: Instance) -> list[str]:
    indexes = Allocation.objects.filter(workload=instance).order_by("gpu__index").values_list("gpu__index", flat=True)
    return [str(i) for i in indexes]


def instance_dir(instance: Instance) -> str:
    return str(settings.PORTAL_WORK_DIR / instance.workspace.name / f"instance-{instance.pk}")


class InstanceKind(Kind):
    name = "instance"
    model = Instance
    start_states = (Instance.State.PROVISIONING,)
    live_states = Instance.LIVE_STATES
    restarts_in_place = True

    def rows(self) -> QuerySet[Instance]:
        return Instance.objects.select_related("workspace", "cluster", "profile")

    def phase(self, row: Instance) -> Phase | None:
        return {
            Instance.State.PROVISIONING: Phase.START,
            Instance.State.RUNNING: Phase.WATCH,
            Instance.State.DELETING: Phase.STOP,
        }.get(row.state)

    def due(self, lost_before: datetime) -> Iterable[int]:
        rows = Instance.objects.filter(
            Q(state__in=[Instance.State.RUNNING, Instance.State.DELETING])
            | Q(state=Instance.State.PROVISIONING, admitted_at__lt=lost_before)
        )
        return rows.values_list("pk", flat=True)

    def start_timeout_s(self) -> float:
        return float(settings.PORTAL_INSTANCE_START_TIMEOUT_S)

    def spec(self, instance: Instance) -> InstanceSpec:
        members = instance.workspace.memberships.values_list("user__username", flat=True)
        return InstanceSpec(
            key=self.key(instance.pk),
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
            disk=disk_for(instance.workspace, instance.cluster),
            reservation=backend_reservation(instance),
            portal_env=workload_env(instance),
            # Its own directory, not the workspace's: an instance may be shared with collaborators.
            writable_dir=instance_dir(instance),
        )

    def record_start(self, row: Instance, endpoint: Endpoint, *, restarted: bool) -> None:
        actions.record_instance_start(row, endpoint=f"{endpoint.host}:{endpoint.port}", restarted=restarted)

    def record_start_failure(self, row: Instance, reason: str, *, timed_out: bool) -> None:
        actions.record_instance_failure(row, reason)

    def before_stop(self, row: Instance) -> None:
        notebooks = Notebook.objects.filter(instance_id=row.pk, state__in=Notebook.LIVE_STATES)
        for notebook_id in notebooks.values_list("pk", flat=True):
            host.stop(NOTEBOOKS, notebook_id)

    def record_stop(self, row: Instance, ran: bool) -> None:
        actions.record_instance_deleted(row)

    def record_host_stop(self, row: Instance) -> None:
        row.save()  # still RUNNING: the next reconcile starts it again


def notebook_auth_url(notebook: Notebook) -> str:
    """Where the notebook's server reaches the portal, server to server (apps/compute/views.py)."""
    base = settings.PORTAL_INTERNAL_URL.rstrip("/")
    return f"{base}/internal/notebooks/{notebook.pk}/"


class NotebookKind(Kind):
    name = "notebook"
    model = Notebook
    cluster_field = "instance__cluster"
    start_states = (Notebook.State.PENDING, Notebook.State.STARTING)
    live_states = Notebook.LIVE_STATES
    restarts_in_place = True
    start_errors = (proxy.ProxyError,)

    def rows(self) -> QuerySet[Notebook]:
        return Notebook.objects.select_related("workspace", "profile", "instance__workspace", "instance__cluster")

    def phase(self, row: Notebook) -> Phase | None:
        if row.state in self.start_states:
            return Phase.START if row.instance.state == Instance.State.RUNNING else None
        return {Notebook.State.READY: Phase.WATCH, Notebook.State.STOPPING: Phase.STOP}.get(row.state)

    def due(self, lost_before: datetime) -> Iterable[int]:
        rows = Notebook.objects.filter(
            Q(state__in=[Notebook.State.READY, Notebook.State.STOPPING])
            | Q(state__in=self.start_states, instance__state=Instance.State.RUNNING)
        )
        return rows.values_list("pk", flat=True)

    def start_timeout_s(self) -> float:
        return float(settings.PORTAL_NOTEBOOK_START_TIMEOUT_S)

    def claim_timeout_s(self) -> float:
        """A notebook's start or environment build may hold its claim this long."""
        return self.start_timeout_s() + 600

    def spec(self, notebook: Notebook) -> NotebookSpec:
        instance = notebook.instance
        return NotebookSpec(
            key=self.key(notebook.pk),
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
            instance_state=dict(instance.backend_state or {}),
            auth_url=notebook_auth_url(notebook),
            run_as=run_as_for(notebook.workspace, instance.cluster),
            disk=disk_for(notebook.workspace, instance.cluster),
            portal_env=workload_env(notebook),
            writable_dir=instance_dir(instance),  # its instance's files, and nothing else of the workspace
        )

    def start_wait(self, row: Notebook) -> str:
        """A notebook waits for its instance to run first."""
        if row.instance.state != Instance.State.RUNNING:
            return f"waiting for its instance {row.instance.name} to run"
        return super().start_wait(row)

    def start_waits(self, row: Notebook) -> list[tuple[float, str]]:
        """Its instance to run (where it started after the notebook was asked for), then a worker."""
        [(since, worker)] = super().start_waits(row)
        ran = row.instance.started_at
        if ran is None or ran.timestamp() <= since:
            return [(since, worker)]
        return [(since, f"waiting for its instance {row.instance.name} to run"), (ran.timestamp(), worker)]

    def prepare_start(self, row: Notebook, backend: Backend) -> bool:
        with transaction.atomic():
            actions.record_notebook_starting(Notebook.objects.select_for_update().get(pk=row.pk))
        if settings.PORTAL_WORKLOAD_TRIGGER == "task" and _environment_to_build(backend, row):
            if backend.steps is not None:
                progress.hand_on(backend.steps, "waiting for a provisioning worker to build the environment")
            request_environment_build(row.pk)  # which asks for the start again once built
            return False
        return True

    def connect(self, row: Notebook, endpoint: Endpoint) -> None:
        if not proxy.configured():
            raise BackendError("no notebook proxy is configured (PORTAL_PROXY_API_URL)", permanent=True)
        row.proxy_target = endpoint.url or f"http://{endpoint.host}:{endpoint.port}"
        proxy.add_route(row.host, row.proxy_target, row.pk)

    def disconnect(self, row: Notebook) -> None:
        try:
            proxy.remove_route(proxy.host_route(row.host))
        except proxy.ProxyError:
            logger.warning("could not remove the route of notebook %s; reconcile will", row.pk, exc_info=True)

    def record_start(self, row: Notebook, endpoint: Endpoint, *, restarted: bool) -> None:
        actions.record_notebook_ready(row, target=endpoint.url or f"http://{endpoint.host}:{endpoint.port}")

    def record_start_failure(self, row: Notebook, reason: str, *, timed_out: bool) -> None:
        actions.record_notebook_end(row, Notebook.State.FAILED, reason)

    def mark_restarting(self, row: Notebook) -> None:
        """Its server died: its route and its unredeemed sign-in codes go at once, before it is
        started again (a code issued for the dead server opens nothing, nor does its host)."""
        self.disconnect(row)
        actions.record_notebook_lost(row)

    def before_stop(self, row: Notebook) -> None:
        self.disconnect(row)

    def record_stop(self, row: Notebook, ran: bool) -> None:
        actions.record_notebook_end(row, Notebook.State.STOPPED)

    def record_host_stop(self, row: Notebook) -> None:
        row.save()  # still READY: the next reconcile starts it again

    def upkeep(self) -> dict[str, int]:
        """The notebook proxy's routes follow the ready notebooks (see ``sync_routes``); idle
        notebooks and workloads past their maximum runtime are stopped (apps/compute/culling.py);
        alert rules are evaluated (apps/alerts/evaluate.py)."""
        counts = {**culling.upkeep(), **alert_evaluation.upkeep()}
        try:
            removed, added = sync_routes()
        except proxy.ProxyError:
            logger.warning("could not read the notebook proxy's routes", exc_info=True)
            return counts
        return {**counts, "routes_removed": removed, "routes_added": added}


INSTANCES = InstanceKind()
NOTEBOOKS = NotebookKind()


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
    start is not asked again), then ask for its start, which finds the environment built. The
    build's steps go on the notebook's start (apps/workloads/progress.py) as it makes them."""
    held = claims.claim(Notebook, notebook_id, NOTEBOOKS.start_states, NOTEBOOKS.claim_timeout_s())
    if held is None:
        return Notebook.objects.filter(pk=notebook_id).first()
    notebook = Notebook.objects.select_related("profile", "instance__cluster").get(pk=notebook_id)
    steps = progress.begin_start(notebook, waits=NOTEBOOKS.start_waits(notebook))
    write_steps = progress.Writer(notebook, NOTEBOOKS.name, held.token, steps)
    try:
        environment = _environment(backend_for(notebook.instance.cluster), notebook)
        if environment is not None:
            packages, root, python = environment
            progress.while_writing(lambda: ensure_env(packages, root, python, steps=steps), write_steps)
    except (PolicyRefusal, BackendError) as exc:
        if isinstance(exc, BackendError) and not exc.permanent:
            progress.hand_on(steps, f"waiting to try the environment build again: {exc}")
            write_steps()
            claims.release(Notebook, notebook_id, held.token)
            raise
        steps.finish()
        with transaction.atomic():
            notebook = Notebook.objects.select_for_update().select_related("workspace").get(pk=notebook_id)
            if claims.holds(notebook, held.token):
                notebook.start_progress = steps.snapshot()
                actions.record_notebook_end(notebook, Notebook.State.FAILED, str(exc))
        return notebook
    progress.hand_on(steps, "waiting for a worker to start the Jupyter server")
    write_steps()
    claims.release(Notebook, notebook_id, held.token)
    request_workload("notebook", notebook_id)
    return notebook


def prebuild_environments(profile_ids: list[int] | None = None) -> list[str]:
    """Build the shared environments ahead of any start, so that no one waits for them: the SDK's
    (jobs and instances) and those of the published notebook profiles (``profile_ids``: only
    these), for every enabled cluster whose workers build them here. Each build is skipped where
    it is done already, and waited for where another process makes it. Returns what it built or
    found, as directory names; a profile whose packages cannot be built is logged and skipped."""
    from apps.catalog.models import NotebookProfile
    from apps.inventory.models import Cluster

    roots: dict[tuple[str, str], None] = {}
    for cluster in Cluster.objects.filter(enabled=True, kind__in=["local", "slurm"]).order_by("pk"):
        backend = backend_for(cluster)
        root = getattr(backend, "env_root", "")
        if root:
            roots[(root, getattr(backend, "python", sys.executable))] = None
    profiles = NotebookProfile.objects.filter(published=True).order_by("pk")
    if profile_ids is not None:
        profiles = profiles.filter(pk__in=profile_ids)
    wanted: list[list[str] | None] = [None] if profile_ids is None else []  # None: the SDK's
    wanted += [list(profile.python_packages) for profile in profiles]
    done: list[str] = []
    for root, python in roots:
        for packages in wanted:
            try:
                if packages is None:
                    done.append(ensure_sdk_env(Path(root), python, by="the portal").name)
                else:
                    done.append(ensure_env(packages, Path(root), python, by="the portal").name)
            except (PolicyRefusal, BackendError):
                logger.warning("could not build an environment ahead of its starts", exc_info=True)
    return done


def sync_routes() -> tuple[int, int]:
    """Remove the proxy's routes of notebooks that are neither ready nor starting (a crash between
    a stop and its record), and route ready notebooks the proxy lost (a proxy restart). Returns
    (removed, added).

    The proxy's table is read first: a start connects its route, then records the notebook ready,
    so a route the table has belongs to a notebook that the rows read after it show starting or
    ready. The other order would take the route of a notebook that became ready in between, and a
    person opening it at once would find no server behind its host name."""
    if not proxy.configured():
        return 0, 0
    table = proxy.routes()
    live = Notebook.objects.filter(state__in=[Notebook.State.STARTING, Notebook.State.READY])
    routed = {
        proxy.host_route(notebook.host): notebook for notebook in live.only("pk", "name", "state", "proxy_target")
    }
    ready = {route: notebook for route, notebook in routed.items() if notebook.state == Notebook.State.READY}
    removed = added = 0
    for route, entry in table.items():
        if "portal_notebook" not in entry:
            continue  # not one of ours
        notebook = routed.get(route.rstrip("/"))
        if notebook is None or entry["portal_notebook"] != notebook.pk:
            proxy.remove_route(route)
            removed += 1
    for route, notebook in ready.items():
        if route not in table and notebook.proxy_target:
            proxy.add_route(notebook.host, notebook.proxy_target, notebook.pk)
            added += 1
    return removed, added


def register() -> None:
    host.register(INSTANCES)
    host.register(NOTEBOOKS)
