"""Jobs move onto the one workload table: each job's shared columns become a workload (with the
job's id) and one pod set, its own columns a row of the new job table; attempts and artifacts
follow it. The old table goes in 0009, once allocations and samples no longer refer to it."""

import django.core.validators
import django.db.models.deletion
from decimal import Decimal
from django.db import migrations, models

import apps.names
from apps.workloads import migrating

DETAIL = [
    "description",
    "command",
    "image",
    "env",
    "artifact_paths",
    "checkpointable",
    "max_runtime_s",
    "failure_reason",
    "exit_code",
    "attempts",
    "progress",
    "stop_grace_s",
    "unready_requeues",
    "artifacts_pending_since",
    "artifacts_note",
    "gpu_type",
    "gpus_per_replica",
    "replicas",
    "cpu_cores",
    "memory_gb",
]


def forwards(apps, schema_editor):
    columns = {**migrating.SCHEDULED, "preemptible": "preemptible"}
    migrating.copy_workloads(schema_editor, source="jobs_job", kind="job", offset=0, columns=columns, constants={})
    migrating.copy_single_pod_sets(schema_editor, source="jobs_job", offset=0)
    migrating.copy_details(schema_editor, source="jobs_job", target="jobs_newjob", offset=0, columns=DETAIL)
    migrating.reset_workload_ids(schema_editor)
    migrating.settle(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0007_artifacts_pending_and_note"),
        ("workloads", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="NewJob",
            fields=[
                (
                    "workload_ptr",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        parent_link=True,
                        primary_key=True,
                        related_name="as_job",
                        serialize=False,
                        to="workloads.workload",
                    ),
                ),
                ("description", models.CharField(blank=True, max_length=2000)),
                ("command", models.TextField(blank=True, max_length=100000)),
                ("image", models.CharField(blank=True, max_length=300)),
                ("env", models.JSONField(blank=True, default=dict)),
                ("artifact_paths", models.JSONField(blank=True, default=list)),
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
                ("checkpointable", models.BooleanField(default=False, help_text="Gets a grace signal before preemption.")),
                (
                    "max_runtime_s",
                    models.PositiveIntegerField(
                        blank=True, null=True, validators=[django.core.validators.MaxValueValidator(31622400)]
                    ),
                ),
                ("failure_reason", models.CharField(blank=True, max_length=2000)),
                ("exit_code", models.IntegerField(blank=True, null=True)),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("progress", models.FloatField(blank=True, null=True)),
                ("stop_grace_s", models.FloatField(blank=True, null=True)),
                ("unready_requeues", models.PositiveIntegerField(default=0)),
                ("artifacts_pending_since", models.DateTimeField(blank=True, null=True)),
                ("artifacts_note", models.CharField(blank=True, max_length=500)),
            ],
            options={"ordering": ["-created_at", "-id"]},
            bases=("workloads.workload",),
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="jobattempt",
            name="job",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="attempt_set", to="jobs.newjob"
            ),
        ),
        migrations.AlterField(
            model_name="artifact",
            name="job",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="artifacts", to="jobs.newjob"
            ),
        ),
    ]
