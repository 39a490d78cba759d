"""A bulk operation's log position; the index of child runs holds only them.

- ``BulkOperation.log_position``: the log's last position when the operation
  was recorded. A bulk restart takes the runs started before it by this
  position, not by comparing ``created_at`` with the runs' ``started_at``
  (two hosts' clocks). NULL for the operations recorded before this
  migration: they keep the clock rule (``engine.bulk._started_before``).
- ``kumiflow_run_child_idx`` replaces ``kumiflow_run_parent_idx``: the same
  column, but only the rows of child runs where the database has partial
  indexes (SQLite, PostgreSQL; ``store.indexes.SetIndex``), a plain index on
  MariaDB. Most runs have no parent: once ANALYZE has run, SQLite's planner
  no longer used the full index to find a parent's children and scanned the
  run table. The new index is built before the old one is dropped, so the
  look-up always has one (MariaDB commits each DDL statement on its own).

Reversible: backward, the old index is built again, the new one dropped and
the column removed (the operations lose only their position: they would
then select by the clocks, the rule of that version).
"""

from django.db import migrations, models

import kumiflow_django.store.indexes


class Migration(migrations.Migration):
    dependencies = [
        ("kumiflow", "0017_attribute_top_bulk_restart"),
    ]

    operations = [
        migrations.AddField(
            model_name="bulkoperation",
            name="log_position",
            field=models.BigIntegerField(blank=True, null=True, verbose_name="log position"),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=kumiflow_django.store.indexes.SetIndex(
                fields=["parent_id"], name="kumiflow_run_child_idx"
            ),
        ),
        migrations.RemoveIndex(
            model_name="workflowrun",
            name="kumiflow_run_parent_idx",
        ),
    ]
