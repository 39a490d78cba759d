"""The outbox: side effects requested by steps, committed with the run.

``mail_send`` and ``webhook_send`` call :func:`request`, which records the
request in the segment; the segment writes a ``Dispatch`` row and a
``step.dispatch-requested`` event in its transaction. The dispatch loop
delivers later. A request that can never be delivered (an unknown kind, a
body that is not JSON, a URL that is not http(s)) is written as dead at once,
with its reason: a delivery problem never fails the step.

This module also holds the outbox projection (:func:`apply`), shared by the
engine and ``kumiflow_rebuild``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kumiflow_django import run_events as ev
from kumiflow_django.backoff import BackoffPolicy
from kumiflow_django.context import Context, Suspend, path_text
from kumiflow_django.durations import parse_instant
from kumiflow_django.exceptions import InvalidEvent
from kumiflow_django.jsonvalues import clean_text, to_json
from kumiflow_django.models.dispatch import DELIVERABLE, Dispatch, DispatchStatus
from kumiflow_django.models.event import Event

#: The awaited "event type" of a step that waits for its delivery: either outcome.
SETTLED = "kumiflow.step.dispatch-settled"
OUTCOME_TYPES = (ev.DISPATCHED, ev.DISPATCH_FAILED)


@dataclass(frozen=True)
class DispatchKind:
    """A way of delivering: ``deliver(request, dispatch)`` raises on failure.

    ``check(request)`` returns a reason the request can never be delivered
    (then it is dead at once), or None.
    """

    name: str
    deliver: Callable[[Mapping[str, Any], Dispatch], Any]
    check: Callable[[Mapping[str, Any]], str | None] | None = None


_KINDS: dict[str, DispatchKind] = {}


def register_dispatch_kind(
    name: str,
    deliver: Callable[[Mapping[str, Any], Dispatch], Any],
    *,
    check: Callable[[Mapping[str, Any]], str | None] | None = None,
    replace: bool = False,
) -> DispatchKind:
    """Add a way of delivering (for example ``"sms"``) without touching the engine."""
    if name in _KINDS and not replace:
        raise ValueError(f"dispatch kind {name!r} is already registered")
    kind = DispatchKind(name, deliver, check)
    _KINDS[name] = kind
    return kind


def get_dispatch_kind(name: str) -> DispatchKind | None:
    return _KINDS.get(name)


def policy_for(retry: Mapping[str, Any] | None) -> BackoffPolicy:
    from kumiflow_django.conf import settings

    values = dict(settings.DISPATCH_RETRY)
    values.update(retry or {})
    return BackoffPolicy.from_mapping(values)


def request(
    ctx: Context,
    path: list[Any],
    kind: str,
    payload: Mapping[str, Any],
    retry: Mapping[str, Any] | None,
    await_delivery: bool = False,
) -> dict[str, Any]:
    """Record a delivery request in the segment; return what the step stores."""
    dispatch_id = uuid.uuid4()
    problem: str | None = None
    try:
        body = to_json(dict(payload), f"the {kind} request")
    except InvalidEvent as exc:
        # Kept for the operator to read, in a form every database stores.
        body = {clean_text(str(k), 100): clean_text(repr(v), 200) for k, v in payload.items()}
        problem = str(exc)
    policy = policy_for(retry)
    if problem is None:
        dispatch_kind = get_dispatch_kind(kind)
        if dispatch_kind is None:
            problem = f"unknown dispatch kind {kind!r}"
        elif dispatch_kind.check is not None:
            problem = dispatch_kind.check(body)
    ctx.effects.append(
        (
            "dispatch",
            {
                "id": dispatch_id,
                "kind": kind,
                "request": body,
                "retry": policy.as_dict(),
                "step": path_text(path),
                "problem": problem,
            },
        )
    )
    if await_delivery:
        raise Suspend(
            "event",
            path,
            event_type=SETTLED,
            match={"stream_id": str(dispatch_id)},
            correlation_key=_settled_key(dispatch_id),
            timeout_at=None,
            after=ctx.since_position,
        )
    return {"dispatch_id": str(dispatch_id)}


def _settled_key(dispatch_id: uuid.UUID) -> str:
    from kumiflow_django.matching import correlation_key

    return correlation_key({"stream_id": str(dispatch_id)})


def delivery_result(ctx: Context) -> dict[str, Any]:
    """What a step that awaited its delivery stores: the outcome."""
    event = ctx.wake.event if ctx.wake is not None else None
    if event is None:
        return {"delivered": False, "error": "no outcome"}
    return {
        "dispatch_id": event.stream_id,
        "delivered": event.type == ev.DISPATCHED,
        "status_code": event.payload.get("status_code"),
        "error": event.payload.get("error"),
    }


def requested_events(effect: dict[str, Any], ctx: Context, now: Any) -> list[Event]:
    """The events that open a dispatch stream for a recorded request."""
    events = [
        Event(
            tenant_id=ctx.tenant,
            stream_type=ev.DISPATCH_STREAM,
            stream_id=str(effect["id"]),
            version=1,
            type=ev.DISPATCH_REQUESTED,
            payload={
                "kind": effect["kind"],
                "request": effect["request"],
                "retry": effect["retry"],
                "run_id": str(ctx.run.id),
                "step": effect["step"],
            },
            metadata={"run_id": str(ctx.run.id)},
            created_at=now,
        )
    ]
    if effect["problem"]:
        events.append(
            Event(
                tenant_id=ctx.tenant,
                stream_type=ev.DISPATCH_STREAM,
                stream_id=str(effect["id"]),
                version=2,
                type=ev.DISPATCH_FAILED,
                payload={"kind": effect["kind"], "attempt": 0, "error": effect["problem"]},
                metadata={"run_id": str(ctx.run.id)},
                created_at=now,
            )
        )
    return events


def apply(dispatch: Dispatch | None, event: Event) -> Dispatch:
    """The outbox row after ``event`` (the outbox projection)."""
    p = event.payload
    if event.type == ev.DISPATCH_REQUESTED:
        dispatch = Dispatch(
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
    if dispatch is None:
        raise ValueError(f"event {event.type} precedes dispatch-requested")
    dispatch.version = event.version
    dispatch.updated_at = event.created_at
    if event.type == ev.DISPATCH_ATTEMPT_STARTED:
        # A lease: if the dispatcher dies while delivering, the row is due
        # again when it runs out, and another attempt is made.
        dispatch.attempts = p["attempt"]
        dispatch.next_attempt_at = parse_instant(p["lease_until"])
    elif event.type == ev.DISPATCH_ATTEMPT_FAILED:
        dispatch.status = DispatchStatus.FAILED
        dispatch.attempts = p["attempt"]
        dispatch.last_error = p["error"]
        dispatch.last_status_code = p.get("status_code")
        dispatch.next_attempt_at = parse_instant(p["next_attempt_at"])
    elif event.type == ev.DISPATCHED:
        dispatch.status = DispatchStatus.DELIVERED
        dispatch.attempts = p["attempt"]
        dispatch.last_status_code = p.get("status_code")
        dispatch.last_error = ""
        dispatch.next_attempt_at = None
        dispatch.delivered_at = event.created_at
    elif event.type == ev.DISPATCH_FAILED:
        dispatch.status = DispatchStatus.DEAD
        dispatch.attempts = max(dispatch.attempts, p["attempt"])
        dispatch.last_error = p["error"]
        dispatch.last_status_code = p.get("status_code")
        dispatch.next_attempt_at = None
    elif event.type == ev.DISPATCH_CANCELLED:
        dispatch.status = DispatchStatus.CANCELLED
        dispatch.last_error = p.get("reason", "")
        dispatch.next_attempt_at = None
    elif event.type == ev.DISPATCH_REDELIVERY:
        dispatch.status = DispatchStatus.PENDING
        dispatch.attempts = 0
        dispatch.next_attempt_at = event.created_at
    return dispatch


def record(dispatch: Dispatch, type_: str, payload: dict[str, Any]) -> Dispatch:
    """Append one event to a dispatch's stream at its next version and update the row.

    Call inside a transaction. A concurrent writer makes this raise
    ``IntegrityError`` (the stream version is taken) or ``Conflict``.
    """
    from kumiflow_django import clock, eventstore, rowsql
    from kumiflow_django.engine import Conflict

    base = dispatch.version
    event = Event(
        tenant_id=dispatch.tenant_id,
        stream_type=ev.DISPATCH_STREAM,
        stream_id=str(dispatch.id),
        version=base + 1,
        type=type_,
        payload=payload,
        metadata={"run_id": str(dispatch.run_id)} if dispatch.run_id else {},
        created_at=clock.now(),
    )
    before = rowsql.snapshot(dispatch)
    updated = apply(dispatch, event)  # the reducer reassigns fields: ``before`` stays intact
    eventstore.insert([event])
    where = {"id": dispatch.pk, "version": base}
    if not rowsql.update_changed(updated, before, where=where, using="default"):
        raise Conflict(f"dispatch {dispatch.pk} is no longer at version {base}")
    eventstore.notify([event])
    return updated


def _builtin_kinds() -> None:
    from kumiflow_django import mail_delivery, webhook_delivery

    for name, module in (("mail", mail_delivery), ("webhook", webhook_delivery)):
        if name not in _KINDS:
            register_dispatch_kind(name, module.deliver, check=module.check)


_builtin_kinds()


def _locked(dispatch_id: uuid.UUID | str) -> Dispatch:
    from kumiflow_django.exceptions import DispatchNotFound
    from kumiflow_django.locking import for_update

    try:
        pk = dispatch_id if isinstance(dispatch_id, uuid.UUID) else uuid.UUID(str(dispatch_id))
    except ValueError:
        raise DispatchNotFound(f"{dispatch_id!r} is not a dispatch id") from None
    dispatch = for_update(Dispatch.objects.filter(pk=pk)).first()
    if dispatch is None:
        raise DispatchNotFound(f"no dispatch {dispatch_id}")
    return dispatch


def redeliver(dispatch_id: uuid.UUID | str) -> Dispatch:
    """Deliver a dead (or cancelled) dispatch again, with a fresh retry budget
    and the same idempotency key."""
    from django.db import transaction

    from kumiflow_django.exceptions import InvalidDispatchState

    with transaction.atomic():
        dispatch = _locked(dispatch_id)
        if dispatch.status not in (DispatchStatus.DEAD, DispatchStatus.CANCELLED):
            raise InvalidDispatchState(
                f"dispatch {dispatch.id} is {dispatch.status}; only dead or cancelled ones "
                "are redelivered"
            )
        updated = record(dispatch, ev.DISPATCH_REDELIVERY, {})
    from kumiflow_django import wakeups

    wakeups.work_committed("dispatch")
    return updated


def cancel_dispatch(dispatch_id: uuid.UUID | str, *, reason: str = "") -> Dispatch:
    """Stop a dispatch that has not been delivered yet."""
    from django.db import transaction

    from kumiflow_django.exceptions import InvalidDispatchState

    with transaction.atomic():
        dispatch = _locked(dispatch_id)
        if dispatch.status not in DELIVERABLE:
            raise InvalidDispatchState(
                f"dispatch {dispatch.id} is {dispatch.status}; only pending or failed ones "
                "are cancelled"
            )
        return record(dispatch, ev.DISPATCH_CANCELLED, {"reason": reason or "cancelled"})


def prune(older_than: Any, *, dry_run: bool = False) -> int:
    """Delete delivered and cancelled dispatches last changed before ``older_than``,
    with their streams (their requests may hold personal data). Returns the count."""
    from django.db import transaction

    from kumiflow_django.eventstore import erase_stream

    qs = Dispatch.objects.filter(
        status__in=(DispatchStatus.DELIVERED, DispatchStatus.CANCELLED), updated_at__lt=older_than
    )
    if dry_run:
        return qs.count()
    count = 0
    for dispatch_id, tenant in qs.values_list("id", "tenant_id").iterator(chunk_size=500):
        with transaction.atomic():
            erase_stream(str(dispatch_id), tenant=tenant)
            Dispatch.objects.filter(pk=dispatch_id).delete()
        count += 1
    return count
