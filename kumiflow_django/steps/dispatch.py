"""What a step that asks for a side effect does: ``mail_send``, ``webhook_send``
and your own kinds that deliver through the outbox.

:func:`request` records the request on the context; the segment writes it
to the outbox (a ``Dispatch`` row and its ``step.dispatch-requested``
event) in its transaction, and the dispatch loop delivers it after commit.
A request that can never be delivered (a body that is not JSON, an unknown
kind, a URL that is not http(s)) is written as dead at once, with its
reason: a delivery problem never fails the step.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from kumiflow_django.conf import settings
from kumiflow_django.definition.backoff import BackoffPolicy
from kumiflow_django.definition.context import Context, DispatchRequest
from kumiflow_django.definition.matching import correlation_key
from kumiflow_django.definition.step import path_text
from kumiflow_django.steps.control import EventWait, Suspend
from kumiflow_django.store import names as ev
from kumiflow_django.store.errors import InvalidEvent
from kumiflow_django.store.values import clean_text, to_json


def policy_for(retry: Mapping[str, Any] | None) -> BackoffPolicy:
    """The delivery's retry policy: ``KUMIFLOW_DISPATCH_RETRY`` with the step's overrides."""
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
    """Record a delivery request in the segment; return what the step stores.

    With ``await_delivery``, the run suspends until the delivery is done or dead.
    """
    dispatch_id = uuid.uuid4()
    problem: str | None = None
    try:
        body = to_json(dict(payload), f"the {kind} request")
    except InvalidEvent as exc:
        # Kept for the operator to read, in a form every database stores.
        body = {clean_text(str(k), 100): clean_text(repr(v), 200) for k, v in payload.items()}
        problem = str(exc)
    ctx.effects.append(
        DispatchRequest(
            id=dispatch_id,
            kind=kind,
            request=body,
            retry=policy_for(retry).as_dict(),
            step=path_text(path),
            problem=problem,
        )
    )
    if await_delivery:
        match = {"stream_id": str(dispatch_id)}
        wait = EventWait(
            event_type=ev.SETTLED,
            match=match,
            correlation_key=correlation_key(match),
            timeout_at=None,
            after=ctx.since_position,
        )
        raise Suspend(wait, path)
    return {"dispatch_id": str(dispatch_id)}


def delivery_result(ctx: Context) -> dict[str, Any]:
    """What a step that awaited its delivery stores: the outcome."""
    event = ctx.wake.event if ctx.wake is not None else None
    if event is None:
        return {"delivered": False, "error": "no outcome"}
    result = {
        "dispatch_id": event.stream_id,
        "delivered": event.type == ev.DISPATCHED,
        "status_code": event.payload.get("status_code"),
        "error": event.payload.get("error"),
    }
    response = event.payload.get("response")
    if isinstance(response, dict):  # a webhook's answer: what a workflow calls an API for
        result |= {
            "headers": response.get("headers") or {},
            "body": response.get("body"),
            "truncated": bool(response.get("truncated")),
        }
    return result
