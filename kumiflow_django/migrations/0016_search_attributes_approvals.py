"""Search attributes and approvals (issue 25).

- ``WorkflowRun.attributes``: the run's search attributes, folded from
  ``run-started`` and ``attributes-set`` (an empty object for every run
  that exists: a constant default, added without rewriting the table on
  PostgreSQL 11+ and MariaDB 10.3+).
- ``RunAttribute``: one row per attribute of a run, indexed by
  ``(name, value, started_at)``: "the runs of customer C-17, newest first"
  reads one index range on every database. Derived from the run rows: a
  reverse migration drops it and loses nothing the log does not hold.
- the ``decide_approval_workflowrun`` permission (the approvals inbox).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiflow", "0015_pause_and_bulk"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="workflowrun",
            options={
                "permissions": [
                    ("cancel_workflowrun", "Can cancel workflow runs"),
                    ("retry_workflowrun", "Can retry failed workflow runs"),
                    ("wake_workflowrun", "Can wake waiting workflow runs"),
                    (
                        "send_event_workflowrun",
                        "Can send the awaited event to a waiting workflow run",
                    ),
                    ("decide_approval_workflowrun", "Can decide approvals workflow runs wait at"),
                    ("pause_workflowrun", "Can pause and resume workflow runs"),
                    ("fail_workflowrun", "Can fail workflow runs"),
                ],
                "verbose_name": "workflow run",
                "verbose_name_plural": "workflow runs",
            },
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="attributes",
            field=models.JSONField(blank=True, default=dict, verbose_name="search attributes"),
        ),
        migrations.CreateModel(
            name="RunAttribute",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("run_id", models.UUIDField(verbose_name="run")),
                ("tenant_id", models.CharField(max_length=64, verbose_name="tenant")),
                ("workflow", models.CharField(max_length=200, verbose_name="workflow")),
                ("name", models.CharField(max_length=64, verbose_name="name")),
                ("value", models.CharField(max_length=200, verbose_name="value")),
                ("started_at", models.DateTimeField(verbose_name="run started at")),
            ],
            options={
                "verbose_name": "search attribute",
                "verbose_name_plural": "search attributes",
                "indexes": [
                    models.Index(
                        fields=["name", "value", "-started_at"], name="kumiflow_attr_lookup_idx"
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("run_id", "name"), name="kumiflow_attr_run_name_uq"
                    )
                ],
            },
        ),
    ]
