"""Requests into the outbox: the dispatch streams a segment opens.

A step's :class:`~kumiflow_django.definition.context.DispatchRequest`
becomes a new dispatch stream in the segment's transaction:
``step.dispatch-requested`` (and ``step.dispatch-failed`` at once when the
request can never be delivered: its body was not JSON, its kind is unknown,
the kind's check refuses it), folded into a ``Dispatch`` row.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime

from kumiflow_django.definition.context import DispatchRequest
from kumiflow_django.outbox.kinds import dispatch_kinds
from kumiflow_django.projections.dispatches import DISPATCHES, Dispatch, metadata
from kumiflow_django.projections.stream import Change
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl
from kumiflow_django.store import telemetry


def opened(
    requests: Iterable[DispatchRequest], *, tenant: str, run_id: uuid.UUID, now: datetime
) -> list[Change[Dispatch]]:
    """The dispatch streams that the requests of one run's segment open."""
    changes = []
    for request in requests:
        # telemetry: the segment's trace context, which the delivery continues
        meta = telemetry.stamp(metadata(run_id))
        change = Change(DISPATCHES, str(request.id), tenant, None, now=now, metadata=meta)
        requested: pl.DispatchRequested = {
            "kind": request.kind,
            "request": request.request,
            "retry": request.retry,
            "run_id": str(run_id),
            "step": request.step,
        }
        change.add(ev.DISPATCH_REQUESTED, requested)
        problem = request.problem or dispatch_kinds.problem(request.kind, request.request)
        if problem:
            failed: pl.DispatchFailed = {"kind": request.kind, "attempt": 0, "error": problem}
            change.add(ev.DISPATCH_FAILED, failed)
        changes.append(change)
    return changes
