"""Parallel branches, child runs and compensation.

- ``RunWait``: one row per event a branch of a waiting run awaits (indexed by
  its correlation key, like a run's own wait);
- the run's links in its tree (parent, root, the parent's step, whether the
  parent waits, whether cancelling the parent cancels it, its depth), with an
  index on the parent for the admin's list and cancel cascades;
- how many branch waits and children the run waits for, the version it
  suspended at (children that ended since are the events after it), and its
  compensation outcome.

Every new column has a default: existing rows are root runs without branches.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiflow", "0005_step_task"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunWait",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("run_id", models.UUIDField(verbose_name="run")),
                ("tenant_id", models.CharField(max_length=64, verbose_name="tenant")),
                ("branch", models.CharField(max_length=200, verbose_name="branch")),
                ("event_type", models.CharField(max_length=200, verbose_name="awaited event type")),
                (
                    "correlation_key",
                    models.CharField(max_length=64, verbose_name="correlation key"),
                ),
                ("match", models.JSONField(default=dict, verbose_name="awaited match")),
                ("after", models.BigIntegerField(verbose_name="awaits events after")),
            ],
            options={
                "verbose_name": "branch wait",
                "verbose_name_plural": "branch waits",
            },
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="branch_waits",
            field=models.PositiveIntegerField(default=0, verbose_name="branch waits"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="cancel_with_parent",
            field=models.BooleanField(default=True, verbose_name="cancelled with its parent"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="child_waits",
            field=models.PositiveIntegerField(default=0, verbose_name="children awaited"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="compensation",
            field=models.CharField(
                blank=True,
                choices=[
                    ("running", "compensating"),
                    ("compensated", "compensated"),
                    ("compensation_failed", "compensation failed"),
                ],
                max_length=20,
                verbose_name="compensation",
            ),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="depth",
            field=models.PositiveSmallIntegerField(default=0, verbose_name="depth in its tree"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="parent_id",
            field=models.UUIDField(blank=True, null=True, verbose_name="parent run"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="parent_step",
            field=models.CharField(blank=True, max_length=200, verbose_name="parent step"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="parent_waits",
            field=models.BooleanField(default=False, verbose_name="parent waits"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="root_id",
            field=models.UUIDField(blank=True, null=True, verbose_name="root run"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="suspended_version",
            field=models.PositiveIntegerField(default=0, verbose_name="suspended at version"),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(fields=["parent_id"], name="kumiflow_run_parent_idx"),
        ),
        migrations.AddIndex(
            model_name="runwait",
            index=models.Index(
                fields=["event_type", "correlation_key"], name="kumiflow_wait_key_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="runwait",
            index=models.Index(fields=["run_id"], name="kumiflow_wait_run_idx"),
        ),
    ]
