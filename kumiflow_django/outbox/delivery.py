"""Delivering one dispatch: claim it, deliver it, record the outcome.

A delivery is three short steps, never one long transaction:

1. claim: lock the row (skip-locked where possible), append
   ``step.dispatch-attempt-started`` with a lease and commit;
2. deliver, outside any transaction;
3. record the outcome (``step.dispatched``, ``step.dispatch-attempt-failed``
   or ``step.dispatch-failed``) at the version the claim left.

A dispatcher killed between 1 and 3 leaves the row due again when its lease
runs out: delivery is at least once, always under the same idempotency key.
The dispatch loop (:mod:`kumiflow_django.workers.dispatch`) calls
:func:`deliver_one` for each due row.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError

from kumiflow_django.conf import settings
from kumiflow_django.definition.backoff import BackoffPolicy
from kumiflow_django.definition.durations import isoformat
from kumiflow_django.outbox.kinds import dispatch_kinds
from kumiflow_django.projections.claims import claim, unclaimed
from kumiflow_django.projections.dispatches import DELIVERABLE, Dispatch, append
from kumiflow_django.projections.lock_order import lock_owned
from kumiflow_django.projections.stream import StaleRow
from kumiflow_django.store import clock, db, sql, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store.errors import DeliveryFailure, PermanentFailure
from kumiflow_django.store.models import Event
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.values import clean_text

logger = get_logger("kumiflow_django.dispatch")


def _claim(dispatch_id: uuid.UUID, version: int) -> Dispatch | None:
    now = clock.now()

    def take() -> Dispatch | None:
        dispatch = unclaimed(Dispatch.objects.filter(pk=dispatch_id, version=version)).first()
        if dispatch is None or dispatch.status not in DELIVERABLE:
            return None
        if dispatch.next_attempt_at is None or dispatch.next_attempt_at > now:
            return None
        lease_until = now + timedelta(seconds=settings.LEASE_SECONDS)
        return append(
            dispatch,
            ev.DISPATCH_ATTEMPT_STARTED,
            {"attempt": dispatch.attempts + 1, "lease_until": isoformat(lease_until)},
        )

    return claim(take, lost=None)


def _attempt(dispatch: Dispatch) -> tuple[str, dict[str, Any]]:
    """Deliver once; return the outcome event to record."""
    attempt = dispatch.attempts
    base = {"kind": dispatch.kind, "attempt": attempt}
    try:
        kind = dispatch_kinds.find(dispatch.kind)
        if kind is None:
            raise PermanentFailure(f"unknown dispatch kind {dispatch.kind!r}")
        problem = kind.check(dispatch.request) if kind.check else None
        if problem:
            raise PermanentFailure(problem)
        result = kind.deliver(dispatch.request, dispatch) or {}
    except DeliveryFailure as failure:
        error, status, retryable = str(failure), failure.status_code, failure.retryable
        retry_after, response = failure.retry_after, failure.response
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a bug, an unexpected library error, a SystemExit: retried
        logger.exception("dispatch %s: delivery raised", dispatch.id)
        error, status, retryable, retry_after = f"{type(exc).__name__}: {exc}", None, True, None
        response = None
    else:
        status = result.get("status_code") if isinstance(result, dict) else None
        done: dict[str, Any] = {"status_code": status}
        if isinstance(result, dict) and result.get("response") is not None:
            done["response"] = result["response"]
        return ev.DISPATCHED, base | done
    error = clean_text(error, 1000)
    policy = BackoffPolicy.from_mapping(dispatch.retry) if dispatch.retry else BackoffPolicy()
    if retryable and attempt < policy.attempts:
        delay = policy.delay(attempt)
        if retry_after is not None:
            delay = max(delay, timedelta(seconds=retry_after))
        next_at = clock.now() + delay
        logger.info(
            "dispatch %s: attempt %d failed (%s); next at %s", dispatch.id, attempt, error, next_at
        )
        return ev.DISPATCH_ATTEMPT_FAILED, base | {
            "error": error,
            "status_code": status,
            "next_attempt_at": isoformat(next_at),
        }
    logger.warning("dispatch %s: dead after attempt %d: %s", dispatch.id, attempt, error)
    dead: dict[str, Any] = {"error": error, "status_code": status}
    if response is not None:
        dead["response"] = response
    return ev.DISPATCH_FAILED, base | dead


def deliver_one(dispatch_id: uuid.UUID, version: int) -> bool:
    """Claim, deliver and record one due dispatch; False if there was nothing to do."""
    dispatch = _claim(dispatch_id, version)
    if dispatch is None:
        return False
    # telemetry: the delivery's span, the run in the log fields, the metrics
    with (
        telemetry.run_fields(dispatch.run_id, None, dispatch.tenant_id),
        telemetry.StepScope(dispatch.step_path),
        _span(dispatch) as span,
    ):
        began = time.perf_counter()
        outcome, payload = _attempt(dispatch)
        elapsed = time.perf_counter() - began
        recorded = _record(dispatch, outcome, payload)
        _report(span, dispatch, outcome if recorded else None, payload, elapsed)
    return recorded


def _record(dispatch: Dispatch, outcome: str, payload: dict[str, Any]) -> bool:
    with db.atomic():
        # after its run: an awaited outcome wakes the run (docs: "Lock order")
        current = lock_owned(Dispatch, dispatch.id, version=dispatch.version)
        if current is None:
            # Our lease ran out and another dispatcher took the row over: its
            # outcome is the one that counts.
            logger.warning("dispatch %s: lease lost; outcome dropped", dispatch.id)
            return False
        try:
            append(current, outcome, payload)
        except (IntegrityError, StaleRow):
            return False
    return True


#: What each recorded outcome counts as (None: the outcome was not recorded).
OUTCOMES = {
    ev.DISPATCHED: "delivered",
    ev.DISPATCH_ATTEMPT_FAILED: "retry",
    ev.DISPATCH_FAILED: "dead",
}


def _span(dispatch: Dispatch) -> Any:
    """The delivery's span: a child of the segment that asked for the dispatch
    (whose trace context its ``dispatch-requested`` event stores)."""
    if not telemetry.tracing():
        return telemetry.NO_SPAN
    requested = (
        Event.objects.filter(tenant_id=dispatch.tenant_id, stream_id=str(dispatch.id), version=1)
        .values_list("metadata", flat=True)
        .first()
    )
    return telemetry.span(
        "delivery",
        parent=telemetry.carried(requested),
        dispatch_id=dispatch.id,
        kind=dispatch.kind,
        attempt=dispatch.attempts,
        run_id=dispatch.run_id,
        tenant=dispatch.tenant_id,
        step_path=dispatch.step_path or None,
    )


def _report(
    span: telemetry.Span,
    dispatch: Dispatch,
    recorded: str | None,
    payload: dict[str, Any],
    elapsed: float,
) -> None:
    outcome = "lost" if recorded is None else OUTCOMES[recorded]
    if recorded in (ev.DISPATCH_ATTEMPT_FAILED, ev.DISPATCH_FAILED):
        span.fail(str(payload.get("error", "")))
    span.set(outcome=outcome, status_code=payload.get("status_code"))
    telemetry.count(telemetry.DELIVERIES, kind=dispatch.kind, outcome=outcome)
    telemetry.observe(telemetry.DELIVERY_DURATION, elapsed, kind=dispatch.kind, outcome=outcome)
    if recorded == ev.DISPATCHED:
        latency = (clock.now() - dispatch.created_at).total_seconds()
        telemetry.observe(telemetry.DELIVERY_LATENCY, max(latency, 0.0), kind=dispatch.kind)


def due_dispatches(now: datetime, limit: int) -> list[tuple[uuid.UUID, int]]:
    """Up to ``limit`` due deliveries (id, version), the earliest first: the
    dispatch loop's poll, its query compiled once (``sql.values``)."""
    rows = sql.values(
        ("due dispatches", limit),
        lambda: (
            Dispatch.objects.due(sql.NOW)
            .order_by("next_attempt_at")
            .values_list("id", "version")[:limit]
        ),
        using=sql.routed(Dispatch),
        now=now,
    )
    return [(row[0], row[1]) for row in rows]
