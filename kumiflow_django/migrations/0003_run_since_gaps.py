"""Runs keep the log positions that were still in flight when they started.

On PostgreSQL and MariaDB a position is taken at insert, not at commit: an
event that commits after a run started can have a smaller position than the
run's cut-off. Nullable, so existing rows need no default.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("kumiflow", "0002_append_only_log")]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="since_gaps",
            field=models.JSONField(
                blank=True, null=True, verbose_name="positions in flight at the start"
            ),
        ),
    ]
