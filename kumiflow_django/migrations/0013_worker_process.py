"""The heartbeat row of each worker process: which definitions it serves
(rolling deploys leave a run for a process that has its definition)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("kumiflow", "0012_run_waits_one_way")]

    operations = [
        migrations.CreateModel(
            name="WorkerProcess",
            fields=[
                (
                    "worker_id",
                    models.CharField(
                        max_length=100, primary_key=True, serialize=False, verbose_name="worker"
                    ),
                ),
                ("host", models.CharField(max_length=255, verbose_name="host")),
                ("pid", models.PositiveIntegerField(verbose_name="process id")),
                ("started_at", models.DateTimeField(verbose_name="started at")),
                ("last_seen", models.DateTimeField(verbose_name="last seen")),
                (
                    "definitions",
                    models.JSONField(default=list, verbose_name="definitions served"),
                ),
            ],
            options={
                "verbose_name": "worker process",
                "verbose_name_plural": "worker processes",
                "indexes": [models.Index(fields=["last_seen"], name="kumiflow_worker_seen_idx")],
            },
        ),
    ]
