"""Shares of a GPU in thousandths (a third is 0.333). The column's type changes, and a column named
in a trigger cannot change type on PostgreSQL (and SQLite rebuilds the table without its triggers):
the triggers of 0003 are dropped first and made again after."""

from decimal import Decimal
from importlib import import_module

import django.core.validators
from django.db import migrations, models

within_device = import_module("apps.inventory.migrations.0003_allocation_within_device")
DROP = {"postgresql": within_device.POSTGRESQL_REVERSE, "sqlite": within_device.SQLITE_REVERSE}
CREATE = {"postgresql": within_device.POSTGRESQL, "sqlite": within_device.SQLITE}


class Migration(migrations.Migration):
    dependencies = [("inventory", "0003_allocation_within_device")]

    operations = [
        migrations.RunPython(within_device._run(DROP), within_device._run(CREATE)),
        migrations.AlterField(
            model_name="allocation",
            name="fraction",
            field=models.DecimalField(
                decimal_places=3,
                max_digits=4,
                validators=[
                    django.core.validators.MinValueValidator(Decimal("0.001")),
                    django.core.validators.MaxValueValidator(1),
                ],
            ),
        ),
        migrations.RunPython(within_device._run(CREATE), within_device._run(DROP)),
    ]
