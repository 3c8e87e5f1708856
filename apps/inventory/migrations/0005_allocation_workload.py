"""An allocation is held by one replica of one pod set of a workload (jobs 0008, compute 0012),
no longer by a job or an instance. SQLite rebuilds the table to drop a column, and its triggers
with it: 0003's are made again."""

import importlib

import django.db.models.deletion
from django.db import migrations, models

from apps.workloads import migrating

_within_device = importlib.import_module("apps.inventory.migrations.0003_allocation_within_device")


def forwards(apps, schema_editor):
    for kind in ("job", "instance"):
        migrating.repoint_into(schema_editor, table="inventory_allocation", column=f"{kind}_id", kind=kind)
    migrating.execute(
        schema_editor,
        "UPDATE inventory_allocation SET podset_id = (SELECT p.id FROM workloads_podset p "
        "WHERE p.workload_id = inventory_allocation.workload_id AND p.role = 'main')",
    )
    migrating.settle(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0004_alter_allocation_fraction"),
        ("compute", "0012_workload_table"),
        ("jobs", "0008_workload_table"),
        ("workloads", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="allocation",
            name="workload",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="allocations",
                to="workloads.workload",
            ),
        ),
        migrations.AddField(
            model_name="allocation",
            name="podset",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="allocations",
                to="workloads.podset",
            ),
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
        migrations.RemoveConstraint(model_name="allocation", name="allocation_one_holder"),
        migrations.RemoveField(model_name="allocation", name="instance"),
        migrations.RemoveField(model_name="allocation", name="job"),
        migrations.AlterField(
            model_name="allocation",
            name="workload",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="allocations",
                to="workloads.workload",
            ),
        ),
        migrations.AlterField(
            model_name="allocation",
            name="podset",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="allocations",
                to="workloads.podset",
            ),
        ),
        migrations.RunPython(_within_device._run({"sqlite": _within_device.SQLITE}), migrations.RunPython.noop),
    ]
