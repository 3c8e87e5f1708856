"""A sample names the workload that held its GPU (jobs 0008, compute 0012), no longer a job or
an instance."""

import django.db.models.deletion
from django.db import migrations, models

from apps.workloads import migrating


def forwards(apps, schema_editor):
    for kind in ("job", "instance"):
        migrating.repoint_into(schema_editor, table="telemetry_gpusample", column=f"{kind}_id", kind=kind)
    migrating.settle(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("telemetry", "0001_gpu_samples"),
        ("compute", "0012_workload_table"),
        ("jobs", "0008_workload_table"),
        ("workloads", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="gpusample",
            name="workload",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="workloads.workload",
            ),
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
        migrations.RemoveIndex(model_name="gpusample", name="telemetry_g_job_id_2c8314_idx"),
        migrations.RemoveIndex(model_name="gpusample", name="telemetry_g_instanc_5e7558_idx"),
        migrations.RemoveField(model_name="gpusample", name="instance"),
        migrations.RemoveField(model_name="gpusample", name="job"),
        migrations.AddIndex(
            model_name="gpusample",
            index=models.Index(fields=["workload", "at"], name="telemetry_sample_workload_at"),
        ),
    ]
