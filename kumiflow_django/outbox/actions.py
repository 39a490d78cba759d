"""What an operator does with the outbox: redeliver, cancel, prune.

The admin's actions and ``kumiflow_prune_outbox`` call these, nothing else.
Each change is an event on the dispatch's stream, like every other.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from kumiflow_django.projections.dispatches import DELIVERABLE, Dispatch, DispatchStatus, append
from kumiflow_django.projections.lock_order import lock_owned
from kumiflow_django.store import db
from kumiflow_django.store import names as ev
from kumiflow_django.store.audit import audited, check_operator
from kumiflow_django.store.errors import DispatchNotFound, InvalidDispatchState, raise_refusal
from kumiflow_django.store.log import erase_stream
from kumiflow_django.store.wakeups import WorkKind, work_committed


def _locked(dispatch_id: uuid.UUID | str) -> Dispatch:
    try:
        pk = dispatch_id if isinstance(dispatch_id, uuid.UUID) else uuid.UUID(str(dispatch_id))
    except ValueError:
        raise DispatchNotFound(f"{dispatch_id!r} is not a dispatch id") from None
    dispatch = lock_owned(Dispatch, pk)  # after its run: its outcome may wake the run
    if dispatch is None:
        raise DispatchNotFound(f"no dispatch {dispatch_id}")
    return dispatch


def refuse_redeliver(dispatch: Dispatch) -> str | None:
    """Why :func:`redeliver` does not apply to ``dispatch`` (None: it does); the
    admin asks it what to offer, the operation before it acts."""
    if dispatch.status not in (DispatchStatus.DEAD, DispatchStatus.CANCELLED):
        return f"the dispatch is {dispatch.status}; only dead or cancelled ones are redelivered"
    return None


def refuse_cancel_dispatch(dispatch: Dispatch) -> str | None:
    """Why :func:`cancel_dispatch` does not apply to ``dispatch`` (None: it does)."""
    if dispatch.status not in DELIVERABLE:
        return f"the dispatch is {dispatch.status}; only pending or failed ones are cancelled"
    return None


def redeliver(dispatch_id: uuid.UUID | str, *, by: str = "", reason: str = "") -> Dispatch:
    """Deliver a dead (or cancelled) dispatch again, with a fresh retry budget
    and the same idempotency key. ``by`` and ``reason`` (the operator, and why)
    are stored in the event it appends."""
    by, reason = check_operator(by, reason)
    with db.atomic():
        dispatch = _locked(dispatch_id)
        raise_refusal(refuse_redeliver(dispatch), InvalidDispatchState, f"dispatch {dispatch.id}")
        updated = append(dispatch, ev.DISPATCH_REDELIVERY, audited({}, by, reason), created_by=by)
        work_committed(WorkKind.DISPATCH)
    return updated


def cancel_dispatch(dispatch_id: uuid.UUID | str, *, reason: str = "", by: str = "") -> Dispatch:
    """Stop a dispatch that has not been delivered yet; ``by`` and ``reason``
    are stored in the event it appends."""
    by, reason = check_operator(by, reason)
    with db.atomic():
        dispatch = _locked(dispatch_id)
        refusal = refuse_cancel_dispatch(dispatch)
        raise_refusal(refusal, InvalidDispatchState, f"dispatch {dispatch.id}")
        payload = audited({}, by, reason or "cancelled")
        return append(dispatch, ev.DISPATCH_CANCELLED, payload, created_by=by)


def prune(older_than: datetime, *, dry_run: bool = False) -> int:
    """Delete delivered and cancelled dispatches last changed before ``older_than``,
    with their streams (their requests may hold personal data). Returns the count."""
    qs = Dispatch.objects.filter(
        status__in=(DispatchStatus.DELIVERED, DispatchStatus.CANCELLED), updated_at__lt=older_than
    )
    if dry_run:
        return qs.count()
    count = 0
    for dispatch_id, tenant in qs.values_list("id", "tenant_id").iterator(chunk_size=500):
        with db.atomic():
            erase_stream(str(dispatch_id), tenant=tenant)
            Dispatch.objects.filter(pk=dispatch_id).delete()
        count += 1
    return count
