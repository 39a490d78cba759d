"""The outbox's rows: one ``Dispatch`` per requested side effect, a projection
of the dispatch's stream (mail, webhook, or a registered kind).

:func:`apply` is the fold, shared by the engine, the dispatch loop and
``kumiflow_rebuild``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from kumiflow_django.definition.durations import parse_instant
from kumiflow_django.projections.stream import Change, Stream, write_one
from kumiflow_django.store import clock, limits
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl
from kumiflow_django.store.models import EngineManager, Event


class DispatchStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    FAILED = "failed", _("failed, will retry")
    DELIVERED = "delivered", _("delivered")
    DEAD = "dead", _("dead")
    CANCELLED = "cancelled", _("cancelled")


#: Rows in these states are delivered when ``next_attempt_at`` has come.
DELIVERABLE = (DispatchStatus.PENDING, DispatchStatus.FAILED)


class DispatchQuerySet(models.QuerySet["Dispatch", "Dispatch"]):
    def due(self, now: object) -> DispatchQuerySet:
        """Rows to deliver now, from the ``next_attempt_at`` index alone: only
        deliverable rows have a next attempt. Callers re-check under lock."""
        return self.filter(next_attempt_at__lte=now)


class Dispatch(models.Model):
    id = models.UUIDField(_("dispatch id"), primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(_("tenant"), max_length=limits.TENANT)
    run_id = models.UUIDField(_("run"), null=True, blank=True)
    step_path = models.CharField(_("step"), max_length=limits.STEP_PATH, blank=True)
    kind = models.CharField(_("kind"), max_length=limits.DISPATCH_KIND)
    status = models.CharField(_("status"), max_length=20, choices=DispatchStatus.choices)
    request = models.JSONField(_("request"), default=dict)
    retry = models.JSONField(_("retry policy"), default=dict)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    next_attempt_at = models.DateTimeField(_("next attempt at"), null=True, blank=True)
    last_error = models.TextField(_("last error"), blank=True)
    last_status_code = models.PositiveIntegerField(_("last status code"), null=True, blank=True)
    version = models.PositiveIntegerField(_("stream version"))
    created_at = models.DateTimeField(_("created at"))
    updated_at = models.DateTimeField(_("updated at"))
    delivered_at = models.DateTimeField(_("delivered at"), null=True, blank=True)

    objects: ClassVar[DispatchQuerySet] = EngineManager.from_queryset(DispatchQuerySet)()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("dispatch")
        verbose_name_plural = _("outbox")
        permissions = [
            ("redeliver_dispatch", "Can redeliver dead dispatches"),
            ("cancel_dispatch", "Can cancel pending dispatches"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=[c.value for c in DispatchStatus]),
                name="kumiflow_dispatch_status_valid",
            ),
        ]
        indexes = [
            models.Index(fields=["next_attempt_at"], name="kumiflow_dispatch_due_idx"),
            models.Index(fields=["run_id"], name="kumiflow_dispatch_run_idx"),
            models.Index(fields=["status", "-created_at"], name="kumiflow_dispatch_status_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"

    @property
    def idempotency_key(self) -> str:
        """Sent with every delivery attempt, so receivers can drop duplicates."""
        return str(self.id)


# -- the fold ---------------------------------------------------------------


def _requested(event: Event) -> Dispatch:
    p: pl.DispatchRequested = event.payload
    return Dispatch(
        id=uuid.UUID(event.stream_id),
        tenant_id=event.tenant_id,
        run_id=uuid.UUID(p["run_id"]) if p.get("run_id") else None,
        step_path=p.get("step", ""),
        kind=p["kind"],
        status=DispatchStatus.PENDING,
        request=p["request"],
        retry=p.get("retry") or {},
        attempts=0,
        next_attempt_at=event.created_at,
        created_at=event.created_at,
    )


def _attempt_started(dispatch: Dispatch, event: Event) -> None:
    # A lease: if the dispatcher dies while delivering, the row is due
    # again when it runs out, and another attempt is made.
    p: pl.DispatchAttemptStarted = event.payload
    dispatch.attempts = p["attempt"]
    dispatch.next_attempt_at = parse_instant(p["lease_until"])


def _attempt_failed(dispatch: Dispatch, event: Event) -> None:
    p: pl.DispatchAttemptFailed = event.payload
    dispatch.status = DispatchStatus.FAILED
    dispatch.attempts = p["attempt"]
    dispatch.last_error = p["error"]
    dispatch.last_status_code = p.get("status_code")
    dispatch.next_attempt_at = parse_instant(p["next_attempt_at"])


def _delivered(dispatch: Dispatch, event: Event) -> None:
    p: pl.Dispatched = event.payload
    dispatch.status = DispatchStatus.DELIVERED
    dispatch.attempts = p["attempt"]
    dispatch.last_status_code = p.get("status_code")
    dispatch.last_error = ""
    dispatch.next_attempt_at = None
    dispatch.delivered_at = event.created_at


def _dead(dispatch: Dispatch, event: Event) -> None:
    p: pl.DispatchFailed = event.payload
    dispatch.status = DispatchStatus.DEAD
    dispatch.attempts = max(dispatch.attempts, p["attempt"])
    dispatch.last_error = p["error"]
    dispatch.last_status_code = p.get("status_code")
    dispatch.next_attempt_at = None


def _cancelled(dispatch: Dispatch, event: Event) -> None:
    p: pl.DispatchCancelled = event.payload
    dispatch.status = DispatchStatus.CANCELLED
    dispatch.last_error = p.get("reason", "")
    dispatch.next_attempt_at = None


def _redelivery(dispatch: Dispatch, event: Event) -> None:
    dispatch.status = DispatchStatus.PENDING
    dispatch.attempts = 0
    dispatch.next_attempt_at = event.created_at


#: How each dispatch event changes the row (after :func:`apply` set its version).
FOLD: dict[str, Callable[[Dispatch, Event], None]] = {
    ev.DISPATCH_ATTEMPT_STARTED: _attempt_started,
    ev.DISPATCH_ATTEMPT_FAILED: _attempt_failed,
    ev.DISPATCHED: _delivered,
    ev.DISPATCH_FAILED: _dead,
    ev.DISPATCH_CANCELLED: _cancelled,
    ev.DISPATCH_REDELIVERY: _redelivery,
}


def apply(dispatch: Dispatch | None, event: Event) -> Dispatch:
    """The outbox row after ``event`` (the outbox projection)."""
    if event.type == ev.DISPATCH_REQUESTED:
        dispatch = _requested(event)
    if dispatch is None:
        raise ValueError(f"event {event.type} precedes dispatch-requested")
    dispatch.version = event.version
    dispatch.updated_at = event.created_at
    handler = FOLD.get(event.type)
    if handler is not None:
        handler(dispatch, event)
    return dispatch


#: The dispatch streams: what the segment and the dispatch loop write through.
DISPATCHES = Stream(ev.DISPATCH_STREAM, Dispatch, apply)


def metadata(run_id: uuid.UUID | None) -> dict[str, str]:
    """What every event of a dispatch carries: the run that asked for it."""
    return {"run_id": str(run_id)} if run_id else {}


def append(
    dispatch: Dispatch, type_: str, payload: pl.Payload, *, created_by: str = ""
) -> Dispatch:
    """Append one event to a dispatch's stream at its next version, fold it and
    write it, in the caller's transaction. A concurrent writer makes it fail
    with a version clash or :class:`~kumiflow_django.projections.stream.StaleRow`."""
    change = Change(
        DISPATCHES,
        str(dispatch.id),
        dispatch.tenant_id,
        dispatch,
        now=clock.now(),
        metadata=metadata(dispatch.run_id),
    )
    change.add(type_, payload, created_by=created_by)
    return write_one(change)
