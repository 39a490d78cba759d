"""The dispatch loop: delivers outbox rows after their segment committed.

Each due row is claimed, delivered and recorded by
:func:`kumiflow_django.outbox.delivery.deliver_one`; one row that fails to
be processed is logged and stays due (its claim's lease bounds how soon it
comes back), the others go on.
"""

from __future__ import annotations

from datetime import datetime

from kumiflow_django.outbox.delivery import deliver_one, due_dispatches
from kumiflow_django.projections.dispatches import Dispatch
from kumiflow_django.store import clock, db, sql
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.wakeups import WorkKind
from kumiflow_django.workers.loop import Loop

logger = get_logger("kumiflow_django.dispatch")


class DispatchLoop(Loop):
    name = "dispatch"
    kinds = (WorkKind.DISPATCH,)

    def run_once(self) -> int:
        done = 0
        for dispatch_id, version in due_dispatches(clock.now(), self.batch_size):
            if self.stopping:
                break
            try:
                if deliver_one(dispatch_id, version):
                    done += 1
            except Exception as exc:
                if db.is_transient(exc):
                    raise  # the database is away: the loop's outage says so, once
                logger.exception("dispatch %s: could not be processed; it stays due", dispatch_id)
        return done

    def next_due(self) -> datetime | None:
        rows = sql.values(
            "next dispatch",
            lambda: (
                Dispatch.objects.filter(next_attempt_at__isnull=False)
                .order_by("next_attempt_at")
                .values_list("next_attempt_at")[:1]
            ),
            using=sql.routed(Dispatch),
        )
        return rows[0][0] if rows else None
