"""Flow control: the run's priority, limit scope and key, rate key, what holds a
queued run, a debounced run's key (and the status "queued"); a task's flow
control; the rows of keys, rate windows and operator overrides."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiflow", "0008_process_lock"),
    ]

    operations = [
        migrations.CreateModel(
            name="FlowKey",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("kind", models.CharField(default="run", max_length=10, verbose_name="kind")),
                ("scope", models.CharField(max_length=401, verbose_name="scope")),
                ("key", models.CharField(max_length=200, verbose_name="key")),
                ("held", models.PositiveIntegerField(default=0, verbose_name="parked")),
                ("created_at", models.DateTimeField(verbose_name="created at")),
            ],
            options={
                "verbose_name": "flow key",
                "verbose_name_plural": "flow keys",
            },
        ),
        migrations.CreateModel(
            name="FlowLimit",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("scope", models.CharField(max_length=401, verbose_name="scope")),
                (
                    "max_active",
                    models.PositiveIntegerField(
                        blank=True, null=True, verbose_name="max active per key"
                    ),
                ),
                (
                    "rate_limit",
                    models.PositiveIntegerField(
                        blank=True, null=True, verbose_name="admissions per window"
                    ),
                ),
                (
                    "changed_by",
                    models.CharField(blank=True, max_length=150, verbose_name="changed by"),
                ),
                ("changed_at", models.DateTimeField(verbose_name="changed at")),
            ],
            options={
                "verbose_name": "flow limit override",
                "verbose_name_plural": "flow limit overrides",
            },
        ),
        migrations.CreateModel(
            name="RateBucket",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("scope", models.CharField(max_length=401, verbose_name="scope")),
                ("key", models.CharField(max_length=200, verbose_name="key")),
                ("window_start", models.DateTimeField(verbose_name="window start")),
                (
                    "count",
                    models.PositiveIntegerField(default=0, verbose_name="admitted in the window"),
                ),
                ("skipped", models.PositiveIntegerField(default=0, verbose_name="skipped")),
                (
                    "skipped_positions",
                    models.JSONField(default=list, verbose_name="last skipped events"),
                ),
            ],
            options={
                "verbose_name": "rate bucket",
                "verbose_name_plural": "rate buckets",
            },
        ),
        migrations.RemoveConstraint(
            model_name="workflowrun",
            name="kumiflow_run_status_valid",
        ),
        migrations.AddField(
            model_name="steptask",
            name="flow",
            field=models.JSONField(blank=True, null=True, verbose_name="flow control"),
        ),
        migrations.AddField(
            model_name="steptask",
            name="flow_key",
            field=models.CharField(blank=True, max_length=200, verbose_name="limit key"),
        ),
        migrations.AddField(
            model_name="steptask",
            name="flow_scope",
            field=models.CharField(blank=True, max_length=401, verbose_name="limit scope"),
        ),
        migrations.AddField(
            model_name="steptask",
            name="held_by",
            field=models.CharField(blank=True, max_length=20, verbose_name="held by"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="debounce_key",
            field=models.CharField(blank=True, max_length=200, verbose_name="debounce key"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="flow_key",
            field=models.CharField(blank=True, max_length=200, verbose_name="limit key"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="flow_scope",
            field=models.CharField(blank=True, max_length=401, verbose_name="limit scope"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="held_by",
            field=models.CharField(blank=True, max_length=20, verbose_name="held by"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="priority",
            field=models.SmallIntegerField(default=0, verbose_name="priority"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="rate_key",
            field=models.CharField(blank=True, max_length=200, verbose_name="rate key"),
        ),
        migrations.AlterField(
            model_name="workflowrun",
            name="status",
            field=models.CharField(
                choices=[
                    ("queued", "queued"),
                    ("pending", "pending"),
                    ("running", "running"),
                    ("waiting", "waiting"),
                    ("waiting_event", "waiting for event"),
                    ("retry_scheduled", "retry scheduled"),
                    ("completed", "completed"),
                    ("failed", "failed"),
                    ("cancelled", "cancelled"),
                ],
                max_length=20,
                verbose_name="status",
            ),
        ),
        migrations.AddIndex(
            model_name="steptask",
            index=models.Index(
                fields=["flow_key", "flow_scope", "status"], name="kumiflow_task_flow_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(
                fields=["flow_key", "flow_scope", "status"], name="kumiflow_run_flow_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(
                fields=["debounce_key", "workflow", "status"], name="kumiflow_run_debounce_idx"
            ),
        ),
        migrations.AddConstraint(
            model_name="workflowrun",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "status__in",
                        [
                            "queued",
                            "pending",
                            "running",
                            "waiting",
                            "waiting_event",
                            "retry_scheduled",
                            "completed",
                            "failed",
                            "cancelled",
                        ],
                    )
                ),
                name="kumiflow_run_status_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="flowkey",
            constraint=models.UniqueConstraint(
                fields=("kind", "scope", "key"), name="kumiflow_flowkey_uq"
            ),
        ),
        migrations.AddConstraint(
            model_name="flowlimit",
            constraint=models.UniqueConstraint(
                fields=("scope",), name="kumiflow_flowlimit_scope_uq"
            ),
        ),
        migrations.AddConstraint(
            model_name="flowlimit",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("max_active__isnull", True), ("max_active__gte", 1), _connector="OR"
                ),
                name="kumiflow_flowlimit_max_gte_1",
            ),
        ),
        migrations.AddConstraint(
            model_name="flowlimit",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("rate_limit__isnull", True), ("rate_limit__gte", 1), _connector="OR"
                ),
                name="kumiflow_flowlimit_rate_gte_1",
            ),
        ),
        migrations.AddConstraint(
            model_name="ratebucket",
            constraint=models.UniqueConstraint(
                fields=("scope", "key"), name="kumiflow_ratebucket_uq"
            ),
        ),
    ]
