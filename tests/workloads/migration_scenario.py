"""Run by tests/workloads/test_workload_migration.py in a process of its own, on a database of its
own (DATABASE_URL): ``before`` migrates it as far as the release before the one workload table,
fills it through the historical models and prints what it holds; ``after`` migrates it to the
end and prints the same through today's models, with the usage report."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

from django.db import connection  # noqa: E402
from django.db.migrations.executor import MigrationExecutor  # noqa: E402

BEFORE = [
    ("jobs", "0007_artifacts_pending_and_note"),
    ("compute", "0011_instance_idle_warning"),
    ("inventory", "0004_alter_allocation_fraction"),
    ("telemetry", "0001_gpu_samples"),
    ("audit", "0002_initial"),
    ("accounts", "0005_device_login"),
    ("invitations", "0002_collaborators"),
    ("scheduling", "0001_initial"),
]
T0 = datetime(2026, 10, 31, 22, 0, tzinfo=UTC)  # runs span the end of a month


def before() -> dict[str, object]:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    apps = executor.loader.project_state(BEFORE).apps
    get = apps.get_model
    user = get("auth", "User").objects.create(username="alice")
    bob = get("auth", "User").objects.create(username="bob")
    workspace = get("workspaces", "Workspace").objects.create(name="team-a")
    cluster = get("inventory", "Cluster").objects.create(name="local", kind="local", is_default=True)
    pool = get("inventory", "NodePool").objects.create(cluster=cluster, name="default")
    node = get("inventory", "Node").objects.create(pool=pool, name="n1")
    gpus = [get("inventory", "GPU").objects.create(node=node, index=i, gpu_type="h100", model="H100") for i in range(4)]
    Job = get("jobs", "Job")
    common = {"workspace": workspace, "created_by": user, "gpu_type": "h100", "cluster": cluster}
    done = Job.objects.create(name="train", state="SUCCEEDED", gpus_per_replica=Decimal("2"), replicas=1,
                              started_at=T0, finished_at=T0 + timedelta(hours=4), command="true", **common)  # fmt: skip
    get("jobs", "JobAttempt").objects.create(job=done, number=1, started_at=T0, finished_at=T0 + timedelta(hours=4))
    get("jobs", "Artifact").objects.create(job=done, path="model.pt", size_bytes=5)
    running = Job.objects.create(name="tune", state="RUNNING", gpus_per_replica=Decimal("0.5"), replicas=2,
                                 started_at=T0, command="sleep 1", backend_state={"pid": 1}, **common)  # fmt: skip
    get("jobs", "JobAttempt").objects.create(job=running, number=1, started_at=T0, finished_at=T0 + timedelta(hours=1))
    profile = get("catalog", "ComputeProfile").objects.create(name="one", gpu_type="h100", gpu_count=Decimal(1))
    nb_profile = get("catalog", "NotebookProfile").objects.create(name="lab", image="x")
    Instance = get("compute", "Instance")
    # Ids that collide with the jobs': the instance and the notebook get new ones.
    instance = Instance.objects.create(pk=done.pk, name="box", state="RUNNING", profile=profile,
                                       gpus_per_replica=Decimal(1), replicas=1, started_at=T0,
                                       finished_at=T0 + timedelta(hours=2), **common)  # fmt: skip
    notebook = get("compute", "Notebook").objects.create(pk=running.pk, workspace=workspace, instance=instance,
                                                         name="nb", profile=nb_profile, state="READY",
                                                         created_by=user, proxy_target="http+unix://x")  # fmt: skip
    get("compute", "Collaborator").objects.create(instance=instance, user=bob, access="read")
    get("invitations", "Invitation").objects.create(
        workspace=workspace, email="carol@example.com", instance=instance, access="write", digest="h" * 64,
        expires_at=T0 + timedelta(days=7), invited_by=user,
    )  # fmt: skip
    Allocation = get("inventory", "Allocation")
    Allocation.objects.create(gpu=gpus[0], fraction=Decimal("0.5"), job=running, replica=0)
    Allocation.objects.create(gpu=gpus[0], fraction=Decimal("0.5"), job=running, replica=1)
    Allocation.objects.create(gpu=gpus[1], fraction=Decimal(1), instance=instance, replica=0)
    sample = {"resolution_s": 0, "utilisation": 50.0, "memory_used_mb": 1, "memory_total_mb": 2}
    get("telemetry", "GpuSample").objects.create(gpu=gpus[0], at=T0, job=running, workspace=workspace, **sample)
    get("telemetry", "GpuSample").objects.create(gpu=gpus[1], at=T0, instance=instance, workspace=workspace, **sample)
    get("audit", "AuditEvent").objects.create(action="instance.launch", target_type="compute.instance",
                                              target_id=str(instance.pk), target_repr="team-a/box")  # fmt: skip
    return {"jobs": [done.pk, running.pk], "instance": instance.pk, "notebook": notebook.pk}


def after(ids: dict[str, object]) -> dict[str, object]:
    from apps.accounting.queries import usage_cells
    from apps.audit.models import AuditEvent
    from apps.compute.models import Collaborator, Instance, Notebook
    from apps.inventory.models import Allocation
    from apps.invitations.models import Invitation
    from apps.jobs.models import Artifact, Job, JobAttempt
    from apps.telemetry.models import GpuSample
    from apps.workloads.models import PodSet, Workload

    MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    instance = Instance.objects.get(name="box")
    notebook = Notebook.objects.get(name="nb")
    cells = usage_cells(workspace_ids=None, workspace=None, month=None, now=T0 + timedelta(hours=6))
    return {
        "job_ids": sorted(Job.objects.values_list("pk", flat=True)),
        "job_states": sorted(Job.objects.values_list("name", "state", "gpus_per_replica", "replicas")),
        "kinds": sorted(Workload.objects.values_list("kind", flat=True)),
        "pod_sets": sorted(PodSet.objects.values_list("workload__kind", "role", "gpus", "replicas")),
        "instance_is_new": instance.pk not in ids["jobs"],  # type: ignore[operator]
        "notebook_on_instance": notebook.instance_id == instance.pk,
        "notebook_target": notebook.proxy_target,
        "collaborator": list(Collaborator.objects.values_list("instance_id", "user__username", "access")),
        "collaborator_on_instance": Collaborator.objects.get().instance_id == instance.pk,
        "invitation_on_instance": Invitation.objects.get().instance_id == instance.pk,
        "attempts": JobAttempt.objects.count(),
        "artifacts": list(Artifact.objects.values_list("job__name", "path")),
        "allocations": sorted(
            (a.workload.kind, a.podset.role, a.replica, str(a.fraction)) for a in Allocation.objects.all()
        ),
        "samples": sorted(GpuSample.objects.values_list("workload__kind", "workload__name")),
        "audit_on_instance": AuditEvent.objects.get(action="instance.launch").target_id == str(instance.pk),
        "backend_state": Job.objects.get(name="tune").backend_state,
        "usage": sorted((c.month, c.workspace, c.user, c.gpu_type, str(c.gpu_seconds)) for c in cells),
    }


if __name__ == "__main__":
    phase = sys.argv[1]
    print(json.dumps(before() if phase == "before" else after(json.loads(sys.argv[2])), default=str))
