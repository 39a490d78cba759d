"""The log becomes append-only in the database, and stream ids unique across tenants.

- The version guard is ``(stream_id, version)`` instead of ``(tenant_id,
  stream_id, version)``: two tenants creating the same new stream at once can
  no longer both succeed. A database that already holds one stream id in two
  tenants cannot take this migration: rename one of the streams first.
- ``kumiflow_event_stream_idx`` (stream_id, version) is the new unique index's
  job now.
- Triggers refuse UPDATE and DELETE of events outside erasure and retention
  (see ``kumiflow_django.store.immutability``).
"""

from django.db import migrations, models

from kumiflow_django.store import immutability


class Migration(migrations.Migration):
    dependencies = [("kumiflow", "0001_initial")]

    operations = [
        migrations.RemoveConstraint(model_name="event", name="kumiflow_event_stream_version_uq"),
        migrations.AddConstraint(
            model_name="event",
            constraint=models.UniqueConstraint(
                fields=["stream_id", "version"], name="kumiflow_event_stream_version_uq"
            ),
        ),
        migrations.RemoveIndex(model_name="event", name="kumiflow_event_stream_idx"),
        migrations.RunPython(
            immutability.install, immutability.uninstall, atomic=False, elidable=False
        ),
    ]
