"""Invitations to an instance name it by its new id (compute 0012): repointed with no constraint,
then checked."""

import django.db.models.deletion
from django.db import migrations, models

from apps.workloads import migrating


def forwards(apps, schema_editor):
    migrating.repoint(schema_editor, table="invitations_invitation", column="instance_id", kind="instance")
    migrating.settle(schema_editor)


def _field(constraint: bool) -> models.ForeignKey:
    return models.ForeignKey(
        blank=True,
        null=True,
        db_constraint=constraint,
        on_delete=django.db.models.deletion.CASCADE,
        related_name="invitations",
        to="compute.newinstance",
    )


class Migration(migrations.Migration):
    dependencies = [
        ("invitations", "0002_collaborators"),
        ("compute", "0012_workload_table"),
    ]

    operations = [
        migrations.AlterField(model_name="invitation", name="instance", field=_field(False)),
        migrations.RunPython(forwards, migrations.RunPython.noop),
        migrations.AlterField(model_name="invitation", name="instance", field=_field(True)),
    ]
