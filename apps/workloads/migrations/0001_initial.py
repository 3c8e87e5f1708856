"""The one workload table and its pod sets (jobs', instances' and notebooks' rows move here in
jobs 0008 and compute 0012). ``legacy_kind`` and ``legacy_id`` say which row of the old tables a
workload was made from, for the migrations that follow to repoint what referred to it; 0002
drops them."""

import django.core.validators
import django.db.models.deletion
from decimal import Decimal
from django.conf import settings
from django.db import migrations, models
from django.db.models import Q

import apps.names

LIVE_NAMED = {
    "instance": ("QUEUED", "PROVISIONING", "RUNNING", "DELETING"),
    "notebook": ("PENDING", "STARTING", "READY", "STOPPING"),
    "raycluster": ("QUEUED", "ADMITTED", "STARTING", "RUNNING", "DEGRADED", "PREEMPTED", "STOPPING"),
}


def _live_named() -> Q:
    condition = Q(pk__in=[])
    for kind, states in LIVE_NAMED.items():
        condition |= Q(kind=kind, state__in=states)
    return condition


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("inventory", "0004_alter_allocation_fraction"),
        ("workspaces", "0003_workspace_disk_quota"),
    ]

    operations = [
        migrations.CreateModel(
            name="Workload",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("kind", models.CharField(editable=False, max_length=32)),
                ("name", models.CharField(max_length=63, validators=[apps.names.validate_dns_label])),
                ("state", models.CharField(db_index=True, max_length=16)),
                (
                    "priority",
                    models.IntegerField(
                        default=0,
                        validators=[
                            django.core.validators.MinValueValidator(-1000),
                            django.core.validators.MaxValueValidator(1000),
                        ],
                    ),
                ),
                ("preemptible", models.BooleanField(default=True)),
                ("wait_reason", models.CharField(blank=True, max_length=500)),
                ("workspace_queue_position", models.PositiveIntegerField(blank=True, null=True)),
                ("cluster_queue_position", models.PositiveIntegerField(blank=True, null=True)),
                ("estimated_start_at", models.DateTimeField(blank=True, null=True)),
                ("eligible_at", models.DateTimeField(blank=True, null=True)),
                ("created_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                ("admitted_at", models.DateTimeField(blank=True, null=True)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("backend_state", models.JSONField(blank=True, default=None, null=True)),
                ("start_claim", models.JSONField(blank=True, default=None, null=True)),
                ("restarts", models.PositiveIntegerField(default=0)),
                ("backend_stopped", models.BooleanField(default=False)),
                ("legacy_kind", models.CharField(blank=True, max_length=16, null=True)),
                ("legacy_id", models.BigIntegerField(blank=True, null=True)),
                (
                    "cluster",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="inventory.cluster",
                    ),
                ),
                (
                    "created_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "requested_cluster",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="inventory.cluster",
                    ),
                ),
                (
                    "workspace",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="workloads",
                        to="workspaces.workspace",
                    ),
                ),
            ],
            options={
                "ordering": ["-created_at", "-id"],
                "indexes": [models.Index(fields=["workspace", "kind", "state"], name="workload_workspace_kind_state")],
                "constraints": [
                    models.UniqueConstraint(
                        condition=_live_named(), fields=("workspace", "kind", "name"), name="workload_live_name_unique"
                    ),
                    models.UniqueConstraint(fields=("legacy_kind", "legacy_id"), name="workload_legacy_unique"),
                ],
            },
        ),
        migrations.CreateModel(
            name="PodSet",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("role", models.CharField(max_length=32, validators=[apps.names.validate_dns_label])),
                ("position", models.PositiveSmallIntegerField(default=0)),
                (
                    "replicas",
                    models.PositiveIntegerField(default=1, validators=[django.core.validators.MaxValueValidator(1024)]),
                ),
                ("min_replicas", models.PositiveIntegerField(blank=True, null=True)),
                ("max_replicas", models.PositiveIntegerField(blank=True, null=True)),
                (
                    "gpu_type",
                    models.CharField(blank=True, max_length=32, validators=[apps.names.validate_gpu_type]),
                ),
                (
                    "gpus",
                    models.DecimalField(
                        decimal_places=3,
                        default=Decimal("0"),
                        max_digits=7,
                        validators=[
                            django.core.validators.MinValueValidator(Decimal("0")),
                            django.core.validators.MaxValueValidator(Decimal("1024")),
                        ],
                    ),
                ),
                (
                    "cpu_cores",
                    models.PositiveIntegerField(default=1, validators=[django.core.validators.MaxValueValidator(4096)]),
                ),
                (
                    "memory_gb",
                    models.PositiveIntegerField(default=4, validators=[django.core.validators.MaxValueValidator(65536)]),
                ),
                (
                    "workload",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="podsets",
                        to="workloads.workload",
                    ),
                ),
            ],
            options={
                "ordering": ["workload_id", "position"],
                "constraints": [models.UniqueConstraint(fields=("workload", "role"), name="podset_role_unique")],
            },
        ),
    ]
