"""Pause and resume (a run, a workflow, a tenant) and bulk operations by filter."""

import uuid

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiflow", "0014_run_started_version"),
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
                    ("pause_workflowrun", "Can pause and resume workflow runs"),
                    ("fail_workflowrun", "Can fail workflow runs"),
                ],
                "verbose_name": "workflow run",
                "verbose_name_plural": "workflow runs",
            },
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="paused",
            field=models.BooleanField(default=False, verbose_name="paused"),
        ),
        migrations.CreateModel(
            name="BulkOperation",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=uuid.uuid4,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                        verbose_name="id",
                    ),
                ),
                ("action", models.CharField(max_length=20, verbose_name="action")),
                ("filters", models.JSONField(default=dict, verbose_name="filters")),
                ("reason", models.TextField(blank=True, verbose_name="reason")),
                ("by", models.CharField(blank=True, max_length=150, verbose_name="by")),
                (
                    "status",
                    models.CharField(
                        choices=[("running", "running"), ("done", "done")],
                        default="running",
                        max_length=10,
                        verbose_name="status",
                    ),
                ),
                ("batch_size", models.PositiveIntegerField(default=500, verbose_name="batch size")),
                ("cursor", models.UUIDField(blank=True, null=True, verbose_name="cursor")),
                ("total", models.PositiveIntegerField(default=0, verbose_name="matching runs")),
                ("done", models.PositiveIntegerField(default=0, verbose_name="runs done")),
                ("skipped", models.PositiveIntegerField(default=0, verbose_name="runs skipped")),
                ("errors", models.PositiveIntegerField(default=0, verbose_name="errors")),
                ("skipped_reasons", models.JSONField(default=dict, verbose_name="why skipped")),
                ("error_texts", models.JSONField(default=dict, verbose_name="errors seen")),
                (
                    "lease_until",
                    models.DateTimeField(blank=True, null=True, verbose_name="lease until"),
                ),
                ("created_at", models.DateTimeField(verbose_name="created at")),
                ("updated_at", models.DateTimeField(verbose_name="updated at")),
                (
                    "finished_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="finished at"),
                ),
            ],
            options={
                "verbose_name": "bulk operation",
                "verbose_name_plural": "bulk operations",
                "indexes": [
                    models.Index(fields=["status", "created_at"], name="kumiflow_bulk_status_idx")
                ],
            },
        ),
        migrations.CreateModel(
            name="PausedScope",
            fields=[
                (
                    "id",
                    models.CharField(
                        max_length=200, primary_key=True, serialize=False, verbose_name="scope"
                    ),
                ),
                (
                    "kind",
                    models.CharField(
                        choices=[("workflow", "workflow"), ("tenant", "tenant")],
                        max_length=10,
                        verbose_name="kind",
                    ),
                ),
                ("name", models.CharField(max_length=200, verbose_name="name")),
                ("paused", models.BooleanField(default=True, verbose_name="paused")),
                ("reason", models.CharField(blank=True, max_length=1000, verbose_name="reason")),
                ("by", models.CharField(blank=True, max_length=150, verbose_name="by")),
                (
                    "paused_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="paused at"),
                ),
                ("version", models.PositiveIntegerField(verbose_name="stream version")),
                ("updated_at", models.DateTimeField(verbose_name="updated at")),
            ],
            options={
                "verbose_name": "paused scope",
                "verbose_name_plural": "paused scopes",
                "permissions": [
                    ("pause_pausedscope", "Can pause and resume workflows and tenants")
                ],
                "indexes": [
                    models.Index(fields=["kind", "paused", "name"], name="kumiflow_pause_kind_idx")
                ],
            },
        ),
    ]
