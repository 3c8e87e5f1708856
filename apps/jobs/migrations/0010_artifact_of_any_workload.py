"""An artifact belongs to a workload of any kind (a job's, a Ray cluster's); a job's id is its
workload's, so nothing moves."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0009_drop_old_job_table"),
        ("workloads", "0002_drop_legacy_ids"),
    ]

    operations = [
        migrations.AlterField(
            model_name="artifact",
            name="job",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="artifacts", to="workloads.workload"
            ),
        ),
    ]
