"""The API's run list reads a page of one tenant's runs in order.

``kumiflow_run_tenant_idx`` on ``(tenant_id, -started_at, -id)``: the list
filters on the caller's tenant and orders by start, newest first, with the
id as the tie-break of its cursor. Without it the databases read every run
of the tenant through the idempotency index and sorted them for one page
(3.9 ms at 3,300 runs on SQLite, growing with the runs). Reversible: the
index is dropped.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiflow", "0018_bulk_log_position_child_idx"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(
                fields=["tenant_id", "-started_at", "-id"], name="kumiflow_run_tenant_idx"
            ),
        ),
    ]
