"""Run by tests/upgrade/test_upgrade.py in a process of its own, with one release's tree first on
the path and the working directory there (DATABASE_URL: the upgrade test's own database).

``seed``: the previous release migrates an empty database with its own migrations and fills every
one of its tables through its own code: its demo seed, the people and objects of its API tests'
table (every endpoint's object, made through its actions), a month's past runs, and rows of the
tables no action writes by hand (telemetry, traffic, scaling, sessions...). It fails naming any
table of its models still empty, so that a table added without data here is noticed when its
release becomes the previous one. ``report``: the usage report of every workspace, as the release
on the path computes it, as JSON.

It is written against the previous release's code (deploy/previous-release): when that moves on,
this is brought up to it in the same change.
"""

from __future__ import annotations

import io
import json
import os
import sys
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# As the tests run: a scheduling cycle in-process on commit, and no workload started for real.
os.environ["PORTAL_SCHEDULER_TRIGGER"] = "inline"
os.environ["PORTAL_WORKLOAD_TRIGGER"] = "off"
django.setup()

from django.conf import settings  # noqa: E402

settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# The report's "now": work still running counts up to here, in every release alike.
AS_OF = datetime(2026, 11, 15, 12, 0, tzinfo=UTC)
T0 = datetime(2026, 10, 31, 20, 0, tzinfo=UTC)  # past runs span the end of a month


def seed() -> dict[str, Any]:
    from django.core.exceptions import MultipleObjectsReturned
    from django.core.management import call_command

    from tests.api.endpoints import ENDPOINTS
    from tests.personas import api_token, make_world

    call_command("migrate", verbosity=0)
    world = make_world()
    call_command("seed_demo", "--quiet-passwords", stdout=io.StringIO())
    # The upgrade test's reads (a platform admin sees every workspace) and writes.
    tokens = {"reader": api_token(world.admin), "writer": api_token(world.alice)}
    made = set()
    for endpoint in ENDPOINTS:
        if endpoint.obj not in made:  # one row may share another's maker (workloads: Ray clusters)
            made.add(endpoint.obj)
            # A maker may make more rows than the one it looks up (alerts: one per GPU type): made all the same.
            with suppress(MultipleObjectsReturned):
                endpoint.obj(world, world.team_b)
    _past_runs(world)
    _unwritten_by_actions(world)
    empty = [table for table, rows in counts().items() if rows == 0]
    if empty:
        raise SystemExit(
            f"Tables of the previous release with no rows: {', '.join(empty)}. "
            "Give each some rows in tests/upgrade/release_data.py."
        )
    return {"tables": len(counts()), **tokens}


def _past_runs(world: Any) -> None:
    """A month of GPU use for the report: a job's two attempts across the month's end, an instance
    that ran for two hours and one still running, with a notebook, telemetry and artifacts."""
    from apps.compute.models import Notebook
    from apps.inventory.models import GPU, Allocation
    from apps.jobs.models import Artifact
    from apps.telemetry.models import GpuSample
    from tests.accounting.history import instance, job

    train = job(world.team_a, world.alice, [(T0, T0 + timedelta(hours=1)), (T0 + timedelta(hours=2), None)],
                gpus=Decimal("0.5"), replicas=2)  # fmt: skip
    Artifact.objects.create(job=train, path="model.pt", size_bytes=5, sha256="0" * 64)
    job(world.team_b, world.charlie, [(T0, T0 + timedelta(hours=3))], gpus=Decimal("2"))
    box = instance(world, world.team_a, world.bob, T0, T0 + timedelta(hours=2), notebooks=1)
    instance(world, world.team_b, world.charlie, T0 + timedelta(days=1), None, gpus=Decimal("0.25"))
    gpu = GPU.objects.order_by("pk").first()
    podset = train.podsets.get()
    for replica in range(2):  # what its start would hold: half of one GPU a replica
        Allocation.objects.create(gpu=gpu, fraction=Decimal("0.5"), workload=train, podset=podset, replica=replica)
    sample = {"resolution_s": 0, "utilisation": 50.0, "memory_used_mb": 1, "memory_total_mb": 2}
    GpuSample.objects.create(gpu=gpu, at=T0, workload=train, workspace=world.team_a, **sample)
    GpuSample.objects.create(gpu=gpu, at=T0 + timedelta(hours=1), workload=box, workspace=world.team_a, **sample)
    assert Notebook.objects.filter(instance=box).exists()


def _unwritten_by_actions(world: Any) -> None:
    """Rows of the tables that the portal's processes write as they run (sign-in, telemetry,
    traffic, scaling, the scheduler's bookkeeping) or that Django keeps, written directly."""
    from django.contrib.admin.models import ADDITION, LogEntry
    from django.contrib.auth.models import Group, Permission
    from django.contrib.sessions.backends.db import SessionStore
    from django.utils import timezone

    from apps.accounts.models import DeviceLogin, ExternalIdentity, SignInFailures
    from apps.catalog.models import ComputeProfile, InferenceProfile, NotebookProfile
    from apps.compute.models import Notebook, NotebookAuthCode
    from apps.elastic.models import NodePower, ScalingDecision
    from apps.inference.models import Endpoint, Replica, Sample, ScaleEvent, Traffic
    from apps.inventory.models import GPU, NodePool
    from apps.invitations.models import Invitation, ReplacedLink
    from apps.monitoring.models import SchedulerStats
    from apps.provisioning.models import ProvisioningPolicy, ProvisioningRequest
    from apps.rayclusters.models import RayCluster, RayDashboardCode
    from apps.scheduling.models import FairShareUsage, WhatIfReplay
    from apps.workspaces.models import WorkspaceDisk

    now = timezone.now()
    later = now + timedelta(hours=1)
    alice, team_a = world.alice, world.team_a
    SignInFailures.objects.create(key="alice", failures=2, since=now)
    ExternalIdentity.objects.create(user=alice, issuer="https://idp.example.org", subject="alice-1")
    DeviceLogin.objects.create(digest="d" * 64, user_code="ABCD-EFGH", name="laptop", expires_at=later)
    WorkspaceDisk.objects.update_or_create(workspace=team_a, defaults={"size_bytes": 10, "used_bytes": 5,
                                                                        "note": "", "measured_at": now})  # fmt: skip
    ReplacedLink.objects.create(invitation=Invitation.objects.first(), digest="r" * 64, replaced_at=now)
    SchedulerStats.objects.update_or_create(pk=1, defaults={"last_cycle_at": now})
    notebook = Notebook.objects.filter(workspace=team_a).first()
    NotebookAuthCode.objects.create(notebook=notebook, user=alice, code_hash="c" * 64, created_at=now, expires_at=later)
    RayDashboardCode.objects.create(cluster=RayCluster.objects.first(), user=alice, code_hash="c" * 64,
                                    created_at=now, expires_at=later)  # fmt: skip
    endpoint = Endpoint.objects.first()
    if not Replica.objects.exists():
        Replica.objects.create(workspace=endpoint.workspace, name=f"{endpoint.name}-r1", state="QUEUED",
                               endpoint=endpoint, version=1, gpu_type="", created_by=alice)  # fmt: skip
    ScaleEvent.objects.create(endpoint=endpoint, at=now, from_replicas=1, to_replicas=2, reason="busy")
    Traffic.objects.create(endpoint=endpoint, process="web-1", requests=7, updated_at=now)
    Sample.objects.create(endpoint=endpoint, at=now, replicas=1, serving=1, waiting=0, requests_per_s=1.5,
                          errors_per_s=0.0)  # fmt: skip
    ProvisioningPolicy.objects.update_or_create(workspace=team_a, defaults={"max_duration_s": 86400, "updated_at": now})
    ProvisioningRequest.objects.first().devices.add(GPU.objects.order_by("pk").first())
    pool = NodePool.objects.exclude(scaling=None).first()
    ScalingDecision.objects.create(pool=pool, at=now, action="up", nodes=[pool.nodes.first().name], reason="queue")
    NodePower.objects.update_or_create(node=pool.nodes.first(), defaults={"changed_at": now})
    FairShareUsage.objects.create(workspace=team_a, gpu_type="h100", gpu_seconds=3600.0, updated_at=now)
    WhatIfReplay.objects.create(created_by=world.admin, since=T0, until=AS_OF, message="")
    permission = Permission.objects.get(codename="view_workspace")
    Group.objects.get(name="team-a").permissions.add(permission)
    world.bob.user_permissions.add(permission)
    team_a.allowed_profiles.add(world.gpu_1)
    team_b_group = Group.objects.get(name="team-b")
    for model in (ComputeProfile, NotebookProfile, InferenceProfile):
        model.objects.order_by("pk").first().visible_to.add(team_b_group)
    session = SessionStore()
    session["_auth_user_id"] = str(alice.pk)
    session.create()
    LogEntry.objects.log_actions(alice.pk, [team_a], ADDITION, single_object=True)


def counts() -> dict[str, int]:
    """Rows of every table of this release's models (auto-created many-to-many tables included)."""
    from django.apps import apps
    from django.db import connection

    tables = sorted(
        {
            model._meta.db_table
            for model in apps.get_models(include_auto_created=True)
            if model._meta.managed and not model._meta.proxy
        }
    )
    with connection.cursor() as cursor:
        found = {}
        for table in tables:
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            found[table] = cursor.fetchone()[0]
    return found


def report() -> list[dict[str, Any]]:
    """Every workspace's usage, as a platform admin's report gives it."""
    from django.contrib.auth import get_user_model

    from apps.accounting.queries import usage_report

    admin = get_user_model().objects.get(username="admin")
    rows = usage_report(admin, now=AS_OF).rows
    return [{key: str(value) for key, value in row.as_dict().items()} for row in rows]


if __name__ == "__main__":
    import apps

    # The release under test, not another checkout that the environment might put first.
    assert Path(apps.__file__).resolve().parents[1] == Path.cwd().resolve(), apps.__file__
    phase = sys.argv[1]
    print(json.dumps({"seed": seed, "report": report}[phase]()))
