"""Every reference to the old tables was repointed (jobs 0008 to audit 0003): the workloads'
record of their old ids goes."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("workloads", "0001_initial"),
        ("jobs", "0009_drop_old_job_table"),
        ("compute", "0013_drop_old_tables"),
        ("audit", "0003_workload_ids"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="workload", name="workload_legacy_unique"),
        migrations.RemoveField(model_name="workload", name="legacy_kind"),
        migrations.RemoveField(model_name="workload", name="legacy_id"),
    ]
