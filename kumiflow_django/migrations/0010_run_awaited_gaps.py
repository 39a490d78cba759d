"""A waiting run (and each event a branch awaits) keeps the positions below
its wait's cut-off that it has not seen yet: when an earlier wait of the
run took an event, events inserted before it could still be in flight.
Nullable: null means the run's start gaps apply (rows written before this
field, or a wait that looks back to the start), so existing rows need no
default.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("kumiflow", "0009_flow_control")]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="awaited_gaps",
            field=models.JSONField(blank=True, null=True, verbose_name="awaited gaps"),
        ),
        migrations.AddField(
            model_name="runwait",
            name="gaps",
            field=models.JSONField(blank=True, null=True, verbose_name="awaited gaps"),
        ),
    ]
