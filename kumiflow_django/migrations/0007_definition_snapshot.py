"""The console: the definitions runs started on, its indexes and a permission.

- ``DefinitionSnapshot``: each definition version's canonical form and
  outline, once per fingerprint (the picture of a run's steps is drawn from
  the definition it ran on, also after a deploy changed it);
- ``kumiflow_run_finished_idx``: completions and failures per minute for the
  overview, from an index range;
- ``kumiflow_run_wf_started_idx``: the run list filtered by workflow, newest
  first, a page at a time;
- ``kumiflow_run_key_idx``: search by idempotency key prefix (with the
  pattern operators on PostgreSQL, where ``LIKE 'k%'`` needs them);
- ``send_event_workflowrun``: sending the awaited event to a waiting run.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("kumiflow", "0006_branches_children_compensation")]

    operations = [
        migrations.CreateModel(
            name="DefinitionSnapshot",
            fields=[
                (
                    "fingerprint",
                    models.CharField(
                        max_length=64,
                        primary_key=True,
                        serialize=False,
                        verbose_name="definition fingerprint",
                    ),
                ),
                ("workflow", models.CharField(max_length=200, verbose_name="workflow")),
                (
                    "version",
                    models.CharField(blank=True, max_length=50, verbose_name="workflow version"),
                ),
                ("canonical", models.JSONField(default=dict, verbose_name="canonical form")),
                ("outline", models.JSONField(default=dict, verbose_name="outline")),
                ("created_at", models.DateTimeField(verbose_name="first run at")),
            ],
            options={
                "verbose_name": "definition snapshot",
                "verbose_name_plural": "definition snapshots",
            },
        ),
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
                ],
                "verbose_name": "workflow run",
                "verbose_name_plural": "workflow runs",
            },
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(
                fields=["workflow", "-started_at"], name="kumiflow_run_wf_started_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(fields=["status", "finished_at"], name="kumiflow_run_finished_idx"),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(
                fields=["idempotency_key"],
                name="kumiflow_run_key_idx",
                opclasses=["varchar_pattern_ops"],
            ),
        ),
    ]
