"""A stream belongs to its tenant: the version guard becomes ``(tenant_id,
stream_id, version)``, and the same stream id in two tenants is two streams.

0002 made stream ids one namespace across tenants (``(stream_id, version)``),
so one tenant's append to an id blocked every other tenant's stream of that
id, and told it that the id existed elsewhere.

- The new constraint is added before the old one goes: the log is never
  without a version guard. It also serves every read of one stream (each
  names its tenant), so no other index is needed.
- SQLite changes a constraint by rebuilding the table, and the append-only
  triggers go with the old table: they are installed again at the end (and
  at the end of the way back). On PostgreSQL and MariaDB/MySQL the
  constraints change in place, and installing the triggers again changes
  nothing.
- Reversible while no stream id is used by two tenants: going back with
  such streams in the log fails on the old constraint, and nothing changes
  (rename or erase one of the streams first).
"""

from typing import Any

from django.db import migrations, models

from kumiflow_django.store import immutability


def triggers_again(apps: Any, schema_editor: Any) -> None:
    """The append-only triggers, installed again (SQLite dropped them with the table)."""
    immutability.uninstall(apps, schema_editor)
    immutability.install(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [("kumiflow", "0010_run_awaited_gaps")]

    operations = [
        # Backwards this runs last, after SQLite rebuilt the table again.
        migrations.RunPython(migrations.RunPython.noop, triggers_again, elidable=False),
        migrations.AddConstraint(
            model_name="event",
            constraint=models.UniqueConstraint(
                fields=["tenant_id", "stream_id", "version"],
                name="kumiflow_event_tenant_stream_version_uq",
            ),
        ),
        migrations.RemoveConstraint(model_name="event", name="kumiflow_event_stream_version_uq"),
        migrations.RunPython(triggers_again, migrations.RunPython.noop, elidable=False),
    ]
