"""Instances and notebooks move onto the one workload table (after jobs, jobs 0008): each gets a
workload with a new id above every id in use (they shared numbers with jobs), an instance one pod
set; collaborators and sign-in codes follow. The old tables go in 0013."""

import django.core.validators
import django.db.models.deletion
from decimal import Decimal
from django.db import migrations, models

import apps.compute.models
import apps.names
from apps.workloads import migrating

INSTANCE = [
    "description",
    "profile_id",
    "failure_reason",
    "stop_reason",
    "idle_warned_at",
    "gpu_type",
    "gpus_per_replica",
    "replicas",
    "cpu_cores",
    "memory_gb",
]
NOTEBOOK = [
    "description",
    "profile_id",
    "failure_reason",
    "access_token",
    "stop_reason",
    "idle_warned_at",
    "proxy_target",
    "stopped_at",
]
NOTEBOOK_SHARED = {
    column: column
    for column in ("workspace_id", "name", "state", "created_by_id", "created_at", "started_at")
    + ("backend_state", "start_claim", "restarts", "backend_stopped")
}


def forwards(apps, schema_editor):
    offset = migrating.id_offset(schema_editor, "compute_instance")
    migrating.copy_workloads(
        schema_editor,
        source="compute_instance",
        kind="instance",
        offset=offset,
        columns=migrating.SCHEDULED,
        constants={"preemptible": False},
    )
    migrating.copy_single_pod_sets(schema_editor, source="compute_instance", offset=offset)
    migrating.copy_details(
        schema_editor, source="compute_instance", target="compute_newinstance", offset=offset, columns=INSTANCE
    )
    offset = migrating.id_offset(schema_editor, "compute_notebook")
    migrating.copy_workloads(
        schema_editor,
        source="compute_notebook",
        kind="notebook",
        offset=offset,
        columns=NOTEBOOK_SHARED,
        constants={"preemptible": False, "priority": 0, "wait_reason": ""},
    )
    migrating.copy_details(
        schema_editor,
        source="compute_notebook",
        target="compute_newnotebook",
        offset=offset,
        columns=[*NOTEBOOK, "instance_id"],
    )
    migrating.repoint(schema_editor, table="compute_newnotebook", column="instance_id", kind="instance")
    migrating.repoint(schema_editor, table="compute_collaborator", column="instance_id", kind="instance")
    migrating.repoint(schema_editor, table="compute_notebookauthcode", column="notebook_id", kind="notebook")
    migrating.reset_workload_ids(schema_editor)
    migrating.settle(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0002_alter_computeprofile_gpu_count"),
        ("compute", "0011_instance_idle_warning"),
        ("jobs", "0008_workload_table"),
        ("workloads", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="NewInstance",
            fields=[
                (
                    "workload_ptr",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        parent_link=True,
                        primary_key=True,
                        related_name="as_instance",
                        serialize=False,
                        to="workloads.workload",
                    ),
                ),
                ("description", models.CharField(blank=True, max_length=2000)),
                (
                    "profile",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="instances",
                        to="catalog.computeprofile",
                    ),
                ),
                ("gpu_type", models.CharField(blank=True, max_length=32, validators=[apps.names.validate_gpu_type])),
                (
                    "gpus_per_replica",
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
                    "replicas",
                    models.PositiveIntegerField(
                        default=1,
                        validators=[
                            django.core.validators.MinValueValidator(1),
                            django.core.validators.MaxValueValidator(1024),
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
                ("failure_reason", models.CharField(blank=True, max_length=2000)),
                ("stop_reason", models.CharField(blank=True, max_length=500)),
                ("idle_warned_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={"ordering": ["-created_at", "-id"]},
            bases=("workloads.workload",),
        ),
        migrations.CreateModel(
            name="NewNotebook",
            fields=[
                (
                    "workload_ptr",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        parent_link=True,
                        primary_key=True,
                        related_name="as_notebook",
                        serialize=False,
                        to="workloads.workload",
                    ),
                ),
                (
                    "instance",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="notebooks",
                        to="compute.newinstance",
                    ),
                ),
                ("description", models.CharField(blank=True, max_length=2000)),
                (
                    "profile",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="notebooks",
                        to="catalog.notebookprofile",
                    ),
                ),
                ("failure_reason", models.CharField(blank=True, max_length=2000)),
                ("access_token", models.CharField(default=apps.compute.models._new_access_token, max_length=100)),
                ("stop_reason", models.CharField(blank=True, max_length=500)),
                ("idle_warned_at", models.DateTimeField(blank=True, null=True)),
                ("proxy_target", models.CharField(blank=True, max_length=500)),
                ("stopped_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={"ordering": ["-created_at", "-id"]},
            bases=("workloads.workload",),
        ),
        # Repointed with no constraint, then checked once they hold the new ids.
        migrations.AlterField(
            model_name="collaborator",
            name="instance",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="collaborators",
                to="compute.newinstance",
            ),
        ),
        migrations.AlterField(
            model_name="notebookauthcode",
            name="notebook",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="compute.newnotebook",
            ),
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="collaborator",
            name="instance",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="collaborators", to="compute.newinstance"
            ),
        ),
        migrations.AlterField(
            model_name="notebookauthcode",
            name="notebook",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="+", to="compute.newnotebook"
            ),
        ),
    ]
