"""The old instance and notebook tables go, once nothing refers to them (inventory 0005,
telemetry 0002, audit 0003, invitations 0003); the new ones take their names."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("compute", "0012_workload_table"),
        ("inventory", "0005_allocation_workload"),
        ("telemetry", "0002_sample_workload"),
        ("audit", "0003_workload_ids"),
        ("invitations", "0003_invitation_instance_id"),
    ]

    operations = [
        migrations.DeleteModel(name="Notebook"),
        migrations.DeleteModel(name="Instance"),
        migrations.RenameModel(old_name="NewInstance", new_name="Instance"),
        migrations.RenameModel(old_name="NewNotebook", new_name="Notebook"),
    ]
