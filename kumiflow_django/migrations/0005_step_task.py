"""Task steps: one row per task a ``task`` step asked for (a projection of its
``step-task`` stream), with the indexes of due attempts and expired leases.
"""

import uuid

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiflow", "0004_api_token"),
    ]

    operations = [
        migrations.CreateModel(
            name="StepTask",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=uuid.uuid4,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                        verbose_name="task id",
                    ),
                ),
                ("tenant_id", models.CharField(max_length=64, verbose_name="tenant")),
                ("run_id", models.UUIDField(verbose_name="run")),
                (
                    "workflow",
                    models.CharField(blank=True, max_length=200, verbose_name="workflow"),
                ),
                (
                    "trace",
                    models.JSONField(blank=True, null=True, verbose_name="trace context"),
                ),
                ("step_path", models.CharField(max_length=200, verbose_name="step")),
                ("name", models.CharField(blank=True, max_length=200, verbose_name="step name")),
                ("function", models.CharField(max_length=300, verbose_name="function")),
                ("backend", models.CharField(blank=True, max_length=100, verbose_name="backend")),
                ("queue", models.CharField(blank=True, max_length=100, verbose_name="queue")),
                ("priority", models.IntegerField(default=0, verbose_name="priority")),
                ("args", models.JSONField(blank=True, null=True, verbose_name="arguments")),
                ("retry", models.JSONField(default=dict, verbose_name="retry policy")),
                ("non_retryable", models.JSONField(default=list, verbose_name="never retried")),
                ("timeout", models.FloatField(verbose_name="timeout per attempt (s)")),
                (
                    "heartbeat_timeout",
                    models.FloatField(blank=True, null=True, verbose_name="heartbeat timeout (s)"),
                ),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("pending", "pending"),
                            ("running", "running"),
                            ("completed", "completed"),
                            ("failed", "failed"),
                            ("cancelled", "cancelled"),
                        ],
                        max_length=20,
                        verbose_name="status",
                    ),
                ),
                ("attempt", models.PositiveIntegerField(default=0, verbose_name="attempt")),
                (
                    "max_attempt",
                    models.PositiveIntegerField(default=1, verbose_name="last attempt allowed"),
                ),
                (
                    "next_attempt_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="next attempt at"),
                ),
                (
                    "enqueued_attempt",
                    models.PositiveIntegerField(default=0, verbose_name="attempt enqueued"),
                ),
                (
                    "enqueued_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="enqueued at"),
                ),
                (
                    "started_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="attempt started at"),
                ),
                ("worker", models.CharField(blank=True, max_length=100, verbose_name="worker")),
                (
                    "lease_until",
                    models.DateTimeField(blank=True, null=True, verbose_name="lease until"),
                ),
                (
                    "heartbeat_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="last heartbeat"),
                ),
                (
                    "heartbeat_details",
                    models.JSONField(blank=True, null=True, verbose_name="heartbeat details"),
                ),
                ("result", models.JSONField(blank=True, null=True, verbose_name="result")),
                ("last_error", models.TextField(blank=True, verbose_name="last error")),
                (
                    "error_type",
                    models.CharField(blank=True, max_length=300, verbose_name="error type"),
                ),
                ("traceback", models.TextField(blank=True, verbose_name="traceback")),
                (
                    "duration",
                    models.FloatField(
                        blank=True, null=True, verbose_name="duration of the last attempt (s)"
                    ),
                ),
                ("version", models.PositiveIntegerField(verbose_name="stream version")),
                ("created_at", models.DateTimeField(verbose_name="created at")),
                ("updated_at", models.DateTimeField(verbose_name="updated at")),
                (
                    "finished_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="finished at"),
                ),
            ],
            options={
                "verbose_name": "task",
                "verbose_name_plural": "tasks",
                "indexes": [
                    models.Index(fields=["next_attempt_at"], name="kumiflow_task_due_idx"),
                    models.Index(fields=["lease_until"], name="kumiflow_task_lease_idx"),
                    models.Index(fields=["run_id"], name="kumiflow_task_run_idx"),
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                ["pending", "running", "completed", "failed", "cancelled"],
                            )
                        ),
                        name="kumiflow_task_status_valid",
                    )
                ],
            },
        ),
    ]
