"""Lock rows: a named lock one process holds across many transactions
(retention: one process at a time), with a lease that frees it if the
process dies."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("kumiflow", "0007_definition_snapshot")]

    operations = [
        migrations.CreateModel(
            name="ProcessLock",
            fields=[
                (
                    "name",
                    models.CharField(
                        max_length=100, primary_key=True, serialize=False, verbose_name="name"
                    ),
                ),
                ("owner", models.CharField(blank=True, max_length=100, verbose_name="held by")),
                (
                    "acquired_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="acquired at"),
                ),
                (
                    "expires_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="expires at"),
                ),
            ],
            options={"verbose_name": "process lock", "verbose_name_plural": "process locks"},
        ),
    ]
