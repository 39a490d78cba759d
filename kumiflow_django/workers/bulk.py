"""The bulk loop: continues recorded bulk operations (the admin's and the HTTP
API's, and any interrupted one) a time budget at a time.

An operation is recorded by :func:`~kumiflow_django.engine.bulk.bulk_runs`
with ``run=False``; this loop takes one whose lease ran out and works
through its batches from its cursor (``engine.bulk.continue_bulk``). Two
workers may take the same one: they take turns per batch, and no run is
done twice.
"""

from __future__ import annotations

from kumiflow_django.engine import bulk
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.workers.loop import Loop

logger = get_logger("kumiflow_django.workers.bulk")

#: Seconds of one operation per poll, so that a large one does not keep the
#: loop from stopping or from others.
BUDGET = 10.0


class BulkLoop(Loop):
    name = "bulk"

    def run_once(self) -> int:
        done = 0
        for operation_id in (
            bulk.unfinished().order_by("created_at").values_list("id", flat=True)[: self.batch_size]
        ):
            if self.stopping:
                break
            operation = bulk.continue_bulk(operation_id, budget=BUDGET)
            done += operation.done
        return done
