"""A run's timeline as an operator reads it: one line per event, payload on demand.

Each event of the run's stream becomes a :class:`Line`: what happened in
words ("waits for order.paid where payload.order = 7"), who did it and why
(an operator action's ``by`` and ``reason``), when, and the raw payload
behind a click.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kumiflow_django.admin.display import compact, json_text, plain_when
from kumiflow_django.conf import settings
from kumiflow_django.definition.durations import parse_instant
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import Event


@dataclass
class Line:
    event: Event
    summary: str
    operator: str
    reason: str
    payload: str
    kind: str  # a CSS hint: "failed", "operator", "wait", "done", ""


def _at(value: Any) -> str:
    if not isinstance(value, str) or not value:
        return "—"
    try:
        moment = parse_instant(value)
    except (TypeError, ValueError):
        return value
    return plain_when(moment)


def _cursor(value: Any) -> str:
    if isinstance(value, list) and value:
        return ".".join(str(p) for p in value)
    return "the start"


def _first_line(text: Any, limit: int = 200) -> str:
    line = str(text or "").strip().splitlines()[0] if str(text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _started(p: dict[str, Any]) -> str:
    trigger = p.get("trigger") or {}
    text = f"started by {trigger.get('type', '?')}"
    if trigger.get("position") is not None:
        text += f" #{trigger['position']} (stream {trigger.get('stream_id', '?')})"
    if p.get("idempotency_key"):
        text += f", key {p['idempotency_key']}"
    if p.get("mode") == "deferred":
        text += ", for a worker to run"
    return text


def _waiting_for_event(p: dict[str, Any]) -> str:
    match = p.get("match") or {}
    where = ", ".join(f"{k} = {compact(v, 60)}" for k, v in match.items()) or "any"
    text = f"waits at step {_cursor(p.get('cursor'))} for {p.get('event_type')} where {where}"
    if p.get("timeout_at"):
        text += f"; times out at {_at(p['timeout_at'])}"
    return text


def _resumed(p: dict[str, Any]) -> str:
    text = f"resumed at step {_cursor(p.get('cursor'))} by {p.get('by', '?')}"
    if p.get("event"):
        text += f" (event #{p['event'].get('position')})"
    if p.get("recovered"):
        text += f", taken over from {p['recovered'].get('from', '?')} (its lease ran out)"
    return text


def _retried(p: dict[str, Any]) -> str:
    restore = p.get("restore") or {}
    text = f"retried from {_cursor(restore.get('cursor'))}"
    if p.get("fingerprint"):
        text += f", on the current definition {str(p['fingerprint'])[:12]}…"
        if p.get("version"):
            text += f" (version {p['version']})"
    return text


_SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    ev.RUN_STARTED: _started,
    ev.STEP_WAITING: lambda p: (
        f"waits at step {_cursor(p.get('cursor'))} until {_at(p.get('wake_at'))}"
    ),
    ev.STEP_WAITING_FOR_EVENT: _waiting_for_event,
    ev.RETRY_SCHEDULED: lambda p: (
        f"attempt {p.get('attempt')} of {p.get('max_attempts', '?')} at step "
        f"{_cursor(p.get('cursor'))} failed ({_first_line(p.get('error'), 160)}); "
        f"the next one at {_at(p.get('wake_at'))}"
    ),
    ev.EVENT_MATCHED: lambda p: f"the awaited event #{(p.get('event') or {}).get('position')} came",
    ev.STEP_RESUMED: _resumed,
    ev.RUN_COMPLETED: lambda p: f"completed with result {compact(p.get('result'), 160)}",
    ev.RUN_FAILED: lambda p: f"failed ({p.get('reason', '?')}): {_first_line(p.get('error'))}",
    ev.RUN_CANCELLED: lambda p: "cancelled",
    ev.RUN_RETRIED: _retried,
    ev.RUN_WOKEN: lambda p: "woken now",
    ev.RUN_RECOVERED: lambda p: "recovered after a stalled worker",
    ev.SEGMENT_REFUSED: lambda p: (
        f"the database refused the segment (refusal {p.get('attempt')}: "
        f"{_first_line(p.get('error'), 160)}); tried again at {_at(p.get('retry_at'))}"
    ),
}

_KINDS = {
    ev.RUN_FAILED: "failed",
    ev.SEGMENT_REFUSED: "failed",
    ev.RETRY_SCHEDULED: "failed",
    ev.STEP_WAITING: "wait",
    ev.STEP_WAITING_FOR_EVENT: "wait",
    ev.RUN_COMPLETED: "done",
}

#: Operator actions whose payload ``reason`` is the operator's (not a default).
_DEFAULT_REASONS = {ev.RUN_CANCELLED: "cancelled"}


def line(event: Event) -> Line:
    payload = event.payload if isinstance(event.payload, dict) else {}
    summarise = _SUMMARIES.get(event.type)
    try:
        summary = summarise(payload) if summarise else event.type
    except (KeyError, TypeError, ValueError, AttributeError):  # an odd payload: say so
        summary = f"{event.type} (unusual payload)"
    by = payload.get("by") if isinstance(payload.get("by"), str) else ""
    by = by or event.created_by
    reason = payload.get("reason") if isinstance(payload.get("reason"), str) else ""
    if event.type == ev.RUN_FAILED or reason == _DEFAULT_REASONS.get(event.type):
        reason = ""  # a failure's reason is a machine reason, in the summary
    kind = "operator" if by else _KINDS.get(event.type, "")
    return Line(
        event=event,
        summary=summary,
        operator=by,
        reason=reason,
        payload=json_text(event.payload, settings.ADMIN_PAYLOAD_CHARS),
        kind=kind,
    )


def lines(events: list[Event]) -> list[Line]:
    return [line(e) for e in events]
