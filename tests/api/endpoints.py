"""Every API endpoint in one table: how to make one of its objects, who may do what, valid bodies.

test_isolation runs the tenancy checks over every row and test_malformed sends garbage to every
write route a row names. `test_it_has_a_row_for_every_endpoint` keeps the table in step with the
router, so a new endpoint is covered by adding one line here.

Personas, weakest first (see tests/personas.py): victor views team-a, bob is a member of it
through its group, alice owns it, admin is a platform admin. charlie is in team-b.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.actions import do_save_group, do_save_user
from apps.accounts.tokens import workload_token
from apps.alerts.actions import do_save_rule
from apps.alerts.evaluate import evaluate
from apps.alerts.models import Alert, AlertRule
from apps.audit.actions import do_log_event
from apps.audit.events import Event
from apps.catalog.actions import do_save_profile
from apps.catalog.models import ComputeProfile, InferenceProfile, NotebookProfile
from apps.compute.actions import check_launch_instance, check_launch_notebook, do_delete_notebook
from apps.compute.collaborators import do_set_collaborator
from apps.compute.models import Collaborator, Instance, Notebook
from apps.elastic.models import PoolScaling
from apps.inference.actions import check_create_endpoint
from apps.inference.models import Endpoint as InferenceEndpoint
from apps.inventory.actions import do_save_cluster, do_sync_local_cluster
from apps.inventory.discovery import parse_declared
from apps.inventory.maintenance import check_save_window
from apps.inventory.models import GPU, Cluster, MaintenanceWindow, Node, NodePool
from apps.invitations.actions import do_invite
from apps.invitations.models import Invitation
from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.provisioning.actions import check_request, do_request
from apps.rayclusters.actions import check_create_cluster
from apps.rayclusters.models import RayCluster
from apps.workspaces.actions import (
    do_create_workspace,
    do_save_cohort,
    do_set_gpu_quota,
    do_set_membership,
    do_update_workspace,
)
from apps.workspaces.models import Cohort, Role, Workspace
from tests.inference.endpoints import model_in
from tests.personas import World

PERSONAS = ("victor", "bob", "alice", "admin")


def rank(persona: str) -> int:
    return PERSONAS.index(persona)


def user_of(world: World, persona: str) -> Any:
    return getattr(world, persona)


@dataclass(frozen=True)
class Endpoint:
    """One router-registered endpoint.

    `obj(world, workspace)` makes an object of the endpoint in `workspace` through the actions
    (shared endpoints ignore the workspace). `*_by` name the weakest persona allowed to do it to
    team-a's object; everyone weaker is refused. `tenant`: objects belong to a workspace, and
    another tenant's are not found on any route. `hidden(world)` makes a shared object alice may
    not see. `more(world, rows)` adds one listed row per number in `rows` for the list query test.
    """

    prefix: str
    obj: Callable[[World, Workspace], Any]
    lookup: str = "pk"
    tenant: bool = True
    hidden: Callable[[World], Any] | None = None
    read_by: str = "victor"
    create: Callable[[World, Workspace], dict[str, Any]] | None = None
    create_by: str = "bob"
    patch: dict[str, Any] | None = None
    change_by: str = "bob"
    delete: bool = False
    delete_by: str = "bob"
    actions: tuple[str, ...] = ()  # POST detail actions
    # POST detail actions the table does not drive (other roles or states; tested where named in the row)
    other_actions: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()  # GET detail actions: readers may use them, other tenants get a 404
    # GET detail actions that hand out a credential: writers (change_by) may use them, readers get a 403
    secret_reads: tuple[str, ...] = ()
    # A workload's own token may change these (the workloads themselves); every other write is refused
    # to it, whatever its launcher's role (apps/api/permissions.py).
    workload_writes: bool = False
    more: Callable[[World, range], None] | None = None

    def __str__(self) -> str:
        return self.prefix

    @property
    def list_url(self) -> str:
        return f"/api/v1/{self.prefix}/"

    @property
    def key(self) -> str:
        """The key of the lookup value in a response."""
        return "id" if self.lookup == "pk" else self.lookup

    def detail_url(self, obj: Any) -> str:
        return f"/api/v1/{self.prefix}/{getattr(obj, self.lookup)}/"

    def missing_url(self) -> str:
        return f"/api/v1/{self.prefix}/{'987654321' if self.lookup == 'pk' else 'no-such-thing'}/"

    def hidden_object(self, world: World) -> Any | None:
        if self.hidden is not None:
            return self.hidden(world)
        return self.obj(world, world.team_b) if self.tenant else None

    def writes(self, obj: Any, create: dict[str, Any] | None = None) -> list[Write]:
        """Every write route on `obj`, and creating with the body `create` if one is given."""
        url = self.detail_url(obj)
        routes = [Write("POST", "post", self.list_url, create, self.create_by)] if create is not None else []
        routes += [Write(f"POST {name}", "post", f"{url}{name}/", None, self.change_by) for name in self.actions]
        if self.patch is not None:
            routes.append(Write("PATCH", "patch", url, self.patch, self.change_by))
        if self.delete:
            routes.append(Write("DELETE", "delete", url, None, self.delete_by))
        return routes


class Write(NamedTuple):
    label: str
    method: str
    url: str
    body: dict[str, Any] | None
    writer: str  # the weakest persona allowed to send it


def acting(world: World, workspace: Workspace) -> Any:
    """Someone who may change things in the workspace."""
    return {world.team_a.pk: world.alice, world.team_b.pk: world.charlie}.get(workspace.pk, world.admin)


def group(name: str) -> Group:
    return Group.objects.get(name=name)


# --- Objects, made through the actions ---------------------------------------------------------


def instance(world: World, workspace: Workspace, name: str = "box") -> Instance:
    return check_launch_instance(workspace, name=name, profile=world.cpu_small, acting_user=acting(world, workspace))


def notebook(world: World, workspace: Workspace, name: str = "nb") -> Notebook:
    host = Instance.objects.filter(workspace=workspace, name="nb-host", state__in=Instance.LIVE_STATES).first()
    return check_launch_notebook(
        workspace,
        instance=host or instance(world, workspace, "nb-host"),
        name=name,
        profile=world.minimal,
        acting_user=acting(world, workspace),
    )


def stopped_notebook(world: World, workspace: Workspace) -> Notebook:
    """A notebook stopped (as when culled), so that it can be started again."""
    return do_delete_notebook(notebook(world, workspace), acting_user=acting(world, workspace))


def job(world: World, workspace: Workspace, name: str = "train") -> Job:
    return check_submit_job(workspace, name=name, command="python train.py", acting_user=acting(world, workspace))


def ray_cluster(world: World, workspace: Workspace, name: str = "ray") -> RayCluster:
    return check_create_cluster(workspace, name=name, workers=1, acting_user=acting(world, workspace))


def more_ray_clusters(world: World, rows: range) -> None:
    for i in rows:
        ray_cluster(world, world.team_a, f"ray-{i}")


def llama_profile_of(world: World, workspace: Workspace) -> InferenceProfile:
    return llama_profile(world)


def llama_profile(world: World) -> InferenceProfile:
    profile, _ = InferenceProfile.objects.get_or_create(
        name="llama-cpu", defaults={"cpu_cores": 1, "memory_gb": 2, "published": True}
    )
    return profile


def inference_endpoint(world: World, workspace: Workspace, name: str = "chat") -> InferenceEndpoint:
    return check_create_endpoint(
        workspace, name=name, profile=llama_profile(world), path=model_in(workspace),
        acting_user=acting(world, workspace),
    )  # fmt: skip


def more_endpoints(world: World, rows: range) -> None:
    for i in rows:
        inference_endpoint(world, world.team_a, f"chat-{i}")


def more_workloads(world: World, rows: range) -> None:
    more_ray_clusters(world, rows)
    more_jobs(world, rows)


def membership(world: World, workspace: Workspace) -> Any:
    guest = do_save_user(get_user_model()(), username=f"guest-of-{workspace.name}", acting_user=world.admin)
    return do_set_membership(workspace, guest, Role.MEMBER, acting_user=world.admin)


def invitation(world: World, workspace: Workspace, email: str = "") -> Any:
    return do_invite(
        workspace,
        email or f"guest@{workspace.name}.example.org",
        Role.MEMBER,
        base_url="http://testserver/",
        acting_user=world.admin,
    )


def collaborator(world: World, workspace: Workspace) -> Any:
    """Someone an instance of the workspace is shared with, read-only."""
    n = Collaborator.objects.count()
    box = instance(world, workspace, f"shared-{n}")
    guest = do_save_user(get_user_model()(), username=f"guest-{n}-of-{workspace.name}", acting_user=world.admin)
    return do_set_collaborator(box, guest, "read", acting_user=acting(world, workspace))


def more_collaborators(world: World, rows: range) -> None:
    do_update_workspace(world.team_a, max_instances=100, acting_user=world.admin)
    for _ in rows:
        collaborator(world, world.team_a)


def more_invitations(world: World, rows: range) -> None:
    """Rows to list, written directly: sending this many would pass the hourly limit."""
    for i in rows:
        Invitation.objects.create(
            workspace=world.team_a,
            email=f"guest-{i}@example.org",
            digest=f"{i:064x}",
            invited_by=world.alice,
            expires_at=timezone.now() + timedelta(days=7),
        )


def gpr(world: World, workspace: Workspace) -> Any:
    """A GPU provisioning request left to an admin (beyond the workspace's quota), two days ahead."""
    asked = check_request(workspace, gpu_type="h100", gpus=6, duration_s=3600,
                          start_at=timezone.now() + timedelta(days=2))  # fmt: skip
    return do_request(asked, priority=0, justification="Tests.", acting_user=acting(world, workspace))


def more_gprs(world: World, rows: range) -> None:
    for _ in rows:
        gpr(world, world.team_a)


def slurm_pool(name: str, nodes: int = 1) -> NodePool:
    """A pool of Slurm cluster burst with `nodes` nodes, all up."""
    burst, _ = Cluster.objects.get_or_create(
        name="burst", defaults={"kind": "slurm", "connection": {"partition": "gpu"}}
    )
    pool = NodePool.objects.create(cluster=burst, name=name)
    Node.objects.bulk_create(Node(pool=pool, name=f"{name}-{i}") for i in range(nodes))
    return pool


def pool_scaling(world: World, workspace: Workspace) -> PoolScaling:
    return PoolScaling.objects.create(pool=slurm_pool("elastic", 2), max_nodes=2)


def more_pool_scaling(world: World, rows: range) -> None:
    for n in rows:
        PoolScaling.objects.create(pool=slurm_pool(f"pool-{n}", 2), max_nodes=2)


def _in_hours(hours: int) -> str:
    return (timezone.now() + timedelta(hours=hours)).isoformat().replace("+00:00", "Z")


def maintenance_window(world: World, workspace: Workspace) -> MaintenanceWindow:
    fields = {"cluster": Cluster.objects.get(name="local"), "start_at": timezone.now() + timedelta(days=1),
              "end_at": timezone.now() + timedelta(days=1, hours=2), "reason": "New power supply"}  # fmt: skip
    return check_save_window(MaintenanceWindow(), fields, acting_user=world.admin)


def more_maintenance_windows(world: World, rows: range) -> None:
    for _ in rows:
        maintenance_window(world, world.team_a)


def quota(world: World, workspace: Workspace) -> Any:
    return do_set_gpu_quota(workspace, "a100", gpus=Decimal("2"), acting_user=world.admin)


def event(world: World, workspace: Workspace) -> Any:
    return do_log_event(Event.WORKSPACE_UPDATE, workspace, acting_user=acting(world, workspace), workspace=workspace)


def cohort(world: World, workspace: Workspace, name: str = "") -> Cohort:
    made = do_save_cohort(None, name=name or f"cohort-{workspace.name}", acting_user=world.admin)
    do_update_workspace(workspace, cohort=made, acting_user=world.admin)
    return made


def reviewers(world: World) -> Group:
    made = do_save_group(Group(), name="reviewers", acting_user=world.admin)
    do_save_user(world.bob, groups=[group("team-a"), made], acting_user=world.admin)
    return made


def team_b_profile(model: type[ComputeProfile] | type[NotebookProfile], **fields: Any) -> Callable[[World], Any]:
    def make(world: World) -> Any:
        return do_save_profile(
            model(), name="team-b-only", published=True, visible_to=[group("team-b")], acting_user=world.admin, **fields
        )

    return make


def alert_rule(world: World, workspace: Workspace, name: str = "queue too long") -> AlertRule:
    return do_save_rule(None, name=name, kind="queue_wait", workspace=workspace, threshold=Decimal("600"),
                        emails=[acting(world, workspace).email], acting_user=acting(world, workspace))  # fmt: skip


def alert(world: World, workspace: Workspace, name: str = "quota") -> Alert:
    """A firing alert: any use of the workspace's quota, at once."""
    rule = do_save_rule(None, name=name, kind="quota_used", workspace=workspace, threshold=Decimal("0"),
                        acting_user=acting(world, workspace))  # fmt: skip
    evaluate(rules=[rule])
    return Alert.objects.get(rule=rule)


def running_workload(world: World, user: Any, kind: str) -> Job | Instance | Notebook:
    """A job, instance or notebook of `user` in team-a, as the worker sees it while it runs (its
    token works): rows written directly, since neither the scheduler nor a backend is under test."""
    do_update_workspace(world.team_a, max_instances=50, max_notebooks=50, acting_user=world.admin)
    n = Job.objects.count() + Instance.objects.count()
    if kind == "job":
        row = Job.objects.create(workspace=world.team_a, name=f"run-{n}", command="true", created_by=user)
        Job.objects.filter(pk=row.pk).update(state=Job.State.RUNNING)
        return Job.objects.get(pk=row.pk)
    host = Instance.objects.create(workspace=world.team_a, name=f"run-{n}", profile=world.cpu_small, created_by=user)
    Instance.objects.filter(pk=host.pk).update(state=Instance.State.RUNNING, backend_state={})
    if kind == "instance":
        return Instance.objects.get(pk=host.pk)
    notebook = Notebook.objects.create(
        workspace=world.team_a, instance=host, name=f"lab-{n}", profile=world.minimal, created_by=user
    )
    Notebook.objects.filter(pk=notebook.pk).update(state=Notebook.State.READY, backend_state={})
    return Notebook.objects.get(pk=notebook.pk)


def token_client(workload: Job | Instance | Notebook) -> APIClient:
    """An API client that signs in with the workload's own token, as the SDK inside it does."""
    token = workload_token(workload)
    assert token is not None
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


# --- More rows, for the list query counts ------------------------------------------------------


def shared_workspace(world: World, name: str) -> Workspace:
    """A workspace alice is a member of."""
    workspace = do_create_workspace(name=name, acting_user=world.admin)
    do_set_membership(workspace, world.alice, Role.MEMBER, acting_user=world.admin)
    do_set_gpu_quota(workspace, "h100", gpus=Decimal("1"), acting_user=world.admin)
    return workspace


def more_workspaces(world: World, rows: range) -> None:
    for i in rows:
        shared_workspace(world, f"ws-{i}")


def more_instances(world: World, rows: range) -> None:
    do_update_workspace(world.team_a, max_instances=100, acting_user=world.admin)
    for i in rows:
        instance(world, world.team_a, f"box-{i}")


def more_notebooks(world: World, rows: range) -> None:
    do_update_workspace(world.team_a, max_notebooks=100, acting_user=world.admin)
    for i in rows:
        notebook(world, world.team_a, f"nb-{i}")


def more_jobs(world: World, rows: range) -> None:
    for i in rows:
        job(world, world.team_a, f"job-{i}")


def more_quotas(world: World, rows: range) -> None:
    for i in rows:
        do_set_gpu_quota(world.team_a, f"gpu-{i}", gpus=Decimal("1"), acting_user=world.admin)


def more_events(world: World, rows: range) -> None:
    for _ in rows:
        event(world, world.team_a)


def more_cohorts(world: World, rows: range) -> None:
    for i in rows:
        cohort(world, shared_workspace(world, f"ws-{i}"), f"cohort-{i}")


def more_profiles(model: type[ComputeProfile] | type[NotebookProfile], **fields: Any) -> Callable[[World, range], None]:
    def more(world: World, rows: range) -> None:
        for i in rows:
            do_save_profile(
                model(), name=f"p-{i}", published=True, visible_to=[group("team-a")], acting_user=world.admin, **fields
            )

    return more


def more_clusters(world: World, rows: range) -> None:
    for i in rows:
        do_save_cluster(Cluster(), {"name": f"slurm-{i}", "kind": Cluster.Kind.SLURM}, acting_user=world.admin)


def more_gpus(world: World, rows: range) -> None:
    do_sync_local_cluster(parse_declared(f"{rows.stop}xh100"))


def more_alert_rules(world: World, rows: range) -> None:
    for i in rows:
        alert_rule(world, world.team_a, f"rule-{i}")


def more_alerts(world: World, rows: range) -> None:
    for i in rows:
        alert(world, world.team_a, f"quota-{i}")


def more_users(world: World, rows: range) -> None:
    for i in rows:
        do_save_user(get_user_model()(), username=f"user-{i}", groups=[group("team-a")], acting_user=world.admin)


def more_groups(world: World, rows: range) -> None:
    for i in rows:
        made = do_save_group(Group(), name=f"group-{i}", acting_user=world.admin)
        do_save_user(get_user_model()(), username=f"user-{i}", groups=[made], acting_user=world.admin)


# --- The table ---------------------------------------------------------------------------------

ENDPOINTS = [
    Endpoint("workspaces", lambda w, ws: ws, lookup="name", create=lambda w, ws: {"name": "team-c"},
             create_by="admin", patch={"display_name": "Team A!"}, change_by="alice", delete=True,
             delete_by="admin", more=more_workspaces),
    Endpoint("memberships", membership,
             create=lambda w, ws: {"workspace": ws.name, "user": "charlie", "role": "viewer"}, create_by="alice",
             patch={"role": "viewer"}, change_by="alice", delete=True, delete_by="alice", more=more_workspaces),
    Endpoint("invitations", invitation,
             create=lambda w, ws: {"workspace": ws.name, "email": "newcomer@example.org", "role": "viewer"},
             create_by="alice", delete=True, delete_by="alice", actions=("resend",), change_by="alice",
             more=more_invitations),
    Endpoint("quotas", quota, create=lambda w, ws: {"workspace": ws.name, "gpu_type": "l4", "gpus": "1.00"},
             create_by="admin", patch={"gpus": "3.00"}, change_by="admin", delete=True, delete_by="admin",
             more=more_quotas),
    Endpoint("cohorts", cohort, lookup="name", tenant=False, hidden=lambda w: cohort(w, w.team_b),
             create=lambda w, ws: {"name": "cohort-new"}, create_by="admin", patch={"description": "Lenders"},
             change_by="admin", delete=True, delete_by="admin", more=more_cohorts),
    Endpoint("compute-profiles", lambda w, ws: w.gpu_1, lookup="name", tenant=False,
             hidden=team_b_profile(ComputeProfile, cpu_cores=1, memory_gb=1),
             create=lambda w, ws: {"name": "big", "gpu_type": "h100", "gpu_count": "2.00", "cpu_cores": 16},
             create_by="admin", patch={"description": "One H100"}, change_by="admin", delete=True,
             delete_by="admin", more=more_profiles(ComputeProfile, cpu_cores=1, memory_gb=1)),
    Endpoint("notebook-profiles", lambda w, ws: w.minimal, lookup="name", tenant=False,
             hidden=team_b_profile(NotebookProfile, image="quay.io/jupyter/base-notebook"),
             create=lambda w, ws: {"name": "torch", "image": "quay.io/jupyter/pytorch-notebook"},
             create_by="admin", patch={"python_packages": ["jupyterlab", "torch"]}, change_by="admin", delete=True,
             delete_by="admin", more=more_profiles(NotebookProfile, image="quay.io/jupyter/base-notebook")),
    Endpoint("inference-profiles", llama_profile_of, lookup="name", tenant=False,
             hidden=team_b_profile(InferenceProfile, cpu_cores=1, memory_gb=1),
             create=lambda w, ws: {"name": "llama-big", "server": "llamacpp", "cpu_cores": 4}, create_by="admin",
             patch={"description": "On CPU"}, change_by="admin", delete=True, delete_by="admin",
             more=more_profiles(InferenceProfile, cpu_cores=1, memory_gb=1)),
    Endpoint("endpoints", inference_endpoint,
             create=lambda w, ws: {"workspace": ws.name, "name": "chat-2", "profile": llama_profile(w).name,
                                   "path": model_in(ws)},
             patch={"description": "Chat"}, delete=True, actions=("tokens",), reads=("events", "metrics", "logs"),
             more=more_endpoints),
    Endpoint("instances", instance, create=lambda w, ws: {"workspace": ws.name, "name": "box-2", "profile": "gpu-1"},
             patch={"description": "Tuning"}, delete=True, secret_reads=("kubeconfig",), more=more_instances,
             workload_writes=True),
    Endpoint("notebooks", stopped_notebook, actions=("start",),
             create=lambda w, ws: {"instance": instance(w, ws, "host-2").pk, "name": "nb-2", "profile": "minimal"},
             patch={"description": "Plots"}, delete=True, more=more_notebooks, workload_writes=True),
    Endpoint("collaborators", collaborator, patch={"access": "write"}, delete=True, more=more_collaborators),
    Endpoint("jobs", job, create=lambda w, ws: {"workspace": ws.name, "name": "train-2", "command": "python t.py",
                                                 "gpu_type": "h100", "gpus_per_replica": "0.50", "replicas": 2},
             actions=("cancel",), reads=("logs", "artifact"), more=more_jobs, workload_writes=True),
    Endpoint("ray-clusters", ray_cluster, create=lambda w, ws: {"workspace": ws.name, "name": "ray-2", "workers": 1},
             delete=True, reads=("logs", "artifact"), more=more_ray_clusters, workload_writes=True),
    Endpoint("workloads", ray_cluster, more=more_workloads),
    Endpoint("clusters", lambda w, ws: Cluster.objects.get(name="local"), lookup="name", tenant=False,
             create=lambda w, ws: {"name": "slurm-1", "kind": "slurm", "connection": {"partition": "gpu"}},
             create_by="admin", patch={"placement": "spread"}, change_by="admin", delete=True, delete_by="admin",
             actions=("discover",), more=more_clusters),
    # Admins cordon, drain and bring back a node, in that order (tests/maintenance/ for the rest).
    Endpoint("nodes", lambda w, ws: Node.objects.get(), tenant=False, actions=("cordon", "drain", "uncordon"),
             change_by="admin"),
    Endpoint("maintenance-windows", maintenance_window, tenant=False, read_by="admin",
             create=lambda w, ws: {"cluster": "local", "start_at": _in_hours(2), "end_at": _in_hours(4),
                                   "reason": "Firmware update"},
             create_by="admin", patch={"reason": "Firmware and BIOS update"}, change_by="admin", delete=True,
             delete_by="admin", more=more_maintenance_windows),
    Endpoint("gpus", lambda w, ws: GPU.objects.order_by("index").first(), tenant=False, more=more_gpus),
    Endpoint("pool-scaling", pool_scaling, tenant=False, read_by="admin",
             create=lambda w, ws: {"pool": slurm_pool("static").pk, "max_nodes": 1}, create_by="admin",
             patch={"scale_down_delay_s": 1200}, change_by="admin", delete=True, delete_by="admin",
             reads=("decisions",), more=more_pool_scaling),
    Endpoint("audit-events", event, more=more_events),
    Endpoint("users", lambda w, ws: w.bob, lookup="username", tenant=False, read_by="admin",
             create=lambda w, ws: {"username": "newbie", "email": "newbie@example.org", "groups": ["team-a"]},
             create_by="admin", patch={"first_name": "Bobby"}, change_by="admin", delete=True, delete_by="admin",
             more=more_users),
    Endpoint("groups", lambda w, ws: reviewers(w), lookup="name", tenant=False, read_by="admin",
             create=lambda w, ws: {"name": "team-c"}, create_by="admin", patch={"name": "team-a2"},
             change_by="admin", delete=True, delete_by="admin", more=more_groups),
    Endpoint("alert-rules", alert_rule,
             create=lambda w, ws: {"workspace": ws.name, "name": "Queue wait", "kind": "queue_wait",
                                   "threshold": "600.00", "for_s": 60, "emails": ["bob@example.org"]},
             create_by="alice", patch={"name": "Queue wait, long"}, change_by="alice", delete=True,
             delete_by="alice", actions=("silence",), more=more_alert_rules),
    Endpoint("alerts", alert, change_by="alice", actions=("silence",), more=more_alerts),
    # Cancel (which ends it), release (of an active one) and admins' decisions: tests/provisioning/test_api.py.
    Endpoint("gprs", gpr,
             create=lambda w, ws: {"workspace": ws.name, "gpu_type": "h100", "gpus": 1, "duration_s": 3600,
                                   "start_at": (timezone.now() + timedelta(days=3)).isoformat().replace("+00:00", "Z"),
                                   "justification": "More."},
             patch={"gpus": 5}, reads=("events",), more=more_gprs,
             other_actions=("cancel", "release", "approve", "reject", "decide-change")),
]  # fmt: skip

# API routes outside the router: who you are, the one route open without signing in, and your own
# tokens (tests/api/test_tokens.py).
OTHER_ROUTES = {
    "me/": "GET",
    "auth/token/": "POST",
    "auth/device/": "POST",
    "auth/device/token/": "POST",
    "tokens/": "GET",
    "tokens/<int:pk>/": "GET",
    "audit-events/export/": "GET",
    "usage/": "GET",  # tests/accounting/test_api.py checks who sees what
    "admin/whatif/": "GET",  # admins only: tests/scheduling/test_whatif_api.py checks who may do what
    "admin/whatif/<int:pk>/": "GET",
    "admin/whatif/<int:pk>/csv/": "GET",
    "admin/manifests/": "GET",  # admins only: tests/manifests/test_apply.py checks who may do what
    # tests/provisioning/test_api.py: estimates save nothing; the calendar shows only what the queue shows
    "gprs/estimate/": "POST",
    "gprs/calendar/": "GET",
    "gpr-policies/<str:workspace>/": "GET",  # tests/provisioning/test_policy_api.py checks who may do what
}
