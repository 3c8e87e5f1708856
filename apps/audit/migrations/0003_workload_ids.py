"""Audit events about instances and notebooks name them by their new ids (compute 0012)."""

from django.db import migrations

from apps.workloads import migrating


def forwards(apps, schema_editor):
    for kind in ("instance", "notebook"):
        migrating.execute(
            schema_editor,
            "UPDATE audit_auditevent SET target_id = (SELECT CAST(w.id AS VARCHAR(64)) FROM workloads_workload w "
            "WHERE w.legacy_kind = %s AND CAST(w.legacy_id AS VARCHAR(64)) = audit_auditevent.target_id) "
            "WHERE target_type = %s AND EXISTS (SELECT 1 FROM workloads_workload w "
            "WHERE w.legacy_kind = %s AND CAST(w.legacy_id AS VARCHAR(64)) = audit_auditevent.target_id)",
            [kind, f"compute.{kind}", kind],
        )


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0002_initial"),
        ("compute", "0012_workload_table"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
