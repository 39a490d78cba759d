"""Every wait is a ``RunWait`` row (issue 23, "a wait stored one way").

A run suspended in ``wait_for_event`` kept its wait in five columns of its row
(``awaited_event_type``, ``correlation_key``, ``awaited_match``,
``awaited_after``, ``awaited_gaps``), the waits of parallel branches were
``RunWait`` rows. Now both are rows: a run's own wait is the row of the root
branch (``branch = ''``).

- ``RunWait.run_id`` becomes the column of a relation to the run (no
  constraint, no new index: the column and its index stay as they are), so
  that the wake-up's look-up joins the waiting run in the same statement;
- the waits of runs waiting now are copied into rows, then the columns go;
- the look-up's index puts the correlation key first (the admin's search by a
  matched value reads it too), as the run row's index did.

``matched_position``, ``since_position`` and ``since_gaps`` stay on the run:
where the run resumes (the event that satisfied its wait) and the run's own
cut-off, which every wait of the run shares.

Reversible: going back copies each run's own wait into the columns again and
deletes those rows (the branches' rows stay, as before).
"""

from __future__ import annotations

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

ROOT = ""
BATCH = 1000


def copy_waits_to_rows(apps: Any, schema_editor: Any) -> None:
    """Each run waiting in ``wait_for_event`` gets the row of its wait."""
    WorkflowRun = apps.get_model("kumiflow", "WorkflowRun")
    RunWait = apps.get_model("kumiflow", "RunWait")
    alias = schema_editor.connection.alias
    have = set(RunWait.objects.using(alias).filter(branch=ROOT).values_list("run_id", flat=True))
    waiting = (
        WorkflowRun.objects.using(alias)
        .filter(status="waiting_event")
        .exclude(awaited_event_type="")
        .values_list(
            "id",
            "tenant_id",
            "awaited_event_type",
            "correlation_key",
            "awaited_match",
            "awaited_after",
            "awaited_gaps",
        )
        .order_by("id")
    )
    batch = []
    for run_id, tenant, event_type, key, match, after, gaps in waiting.iterator(chunk_size=BATCH):
        if run_id in have:
            continue
        batch.append(
            RunWait(
                run_id=run_id,
                tenant_id=tenant,
                branch=ROOT,
                event_type=event_type,
                correlation_key=key,
                match=match if match is not None else {},
                after=after or 0,
                gaps=gaps,
            )
        )
        if len(batch) >= BATCH:
            RunWait.objects.using(alias).bulk_create(batch)
            batch = []
    if batch:
        RunWait.objects.using(alias).bulk_create(batch)


def copy_rows_to_waits(apps: Any, schema_editor: Any) -> None:
    """Back: each run's own wait into its columns, and its row removed."""
    WorkflowRun = apps.get_model("kumiflow", "WorkflowRun")
    RunWait = apps.get_model("kumiflow", "RunWait")
    alias = schema_editor.connection.alias
    rows = RunWait.objects.using(alias).filter(branch=ROOT).order_by("id")
    for wait in rows.iterator(chunk_size=BATCH):
        WorkflowRun.objects.using(alias).filter(pk=wait.run_id).update(
            awaited_event_type=wait.event_type,
            correlation_key=wait.correlation_key,
            awaited_match=wait.match,
            awaited_after=wait.after,
            awaited_gaps=wait.gaps,
        )
    rows.delete()


class Migration(migrations.Migration):
    dependencies = [("kumiflow", "0011_event_stream_per_tenant")]

    operations = [
        migrations.AlterModelOptions(
            name="runwait",
            options={"verbose_name": "wait", "verbose_name_plural": "waits"},
        ),
        # run_id: the same column and index, now those of a relation.
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.RemoveIndex(model_name="runwait", name="kumiflow_wait_run_idx"),
                migrations.RemoveField(model_name="runwait", name="run_id"),
                migrations.AddField(
                    model_name="runwait",
                    name="run",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="kumiflow.workflowrun",
                        verbose_name="run",
                    ),
                    preserve_default=False,
                ),
                migrations.AddIndex(
                    model_name="runwait",
                    index=models.Index(fields=["run"], name="kumiflow_wait_run_idx"),
                ),
            ],
        ),
        migrations.RunPython(copy_waits_to_rows, copy_rows_to_waits, elidable=False),
        migrations.RemoveIndex(model_name="runwait", name="kumiflow_wait_key_idx"),
        migrations.AddIndex(
            model_name="runwait",
            index=models.Index(
                fields=["correlation_key", "event_type", "tenant_id"],
                name="kumiflow_wait_awaiting_idx",
            ),
        ),
        migrations.RemoveIndex(model_name="workflowrun", name="kumiflow_run_awaiting_idx"),
        migrations.RemoveField(model_name="workflowrun", name="awaited_after"),
        migrations.RemoveField(model_name="workflowrun", name="awaited_event_type"),
        migrations.RemoveField(model_name="workflowrun", name="awaited_gaps"),
        migrations.RemoveField(model_name="workflowrun", name="awaited_match"),
        migrations.RemoveField(model_name="workflowrun", name="correlation_key"),
    ]
