"""GPU counts in thousandths, so that a third of a device (0.333) can be asked for."""

import django.core.validators
from decimal import Decimal
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('compute', '0007_host_bookkeeping'),
    ]

    operations = [
        migrations.AlterField(
            model_name='instance',
            name='gpus_per_replica',
            field=models.DecimalField(decimal_places=3, default=Decimal('0'), max_digits=7, validators=[django.core.validators.MinValueValidator(Decimal('0')), django.core.validators.MaxValueValidator(Decimal('1024'))]),
        ),
    ]
