"""The old job table goes, once nothing refers to it (inventory 0005, telemetry 0002); the new
one takes its name."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0008_workload_table"),
        ("inventory", "0005_allocation_workload"),
        ("telemetry", "0002_sample_workload"),
    ]

    operations = [
        migrations.DeleteModel(name="Job"),
        migrations.RenameModel(old_name="NewJob", new_name="Job"),
    ]
