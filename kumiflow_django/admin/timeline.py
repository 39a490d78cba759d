"""A run's timeline as an operator reads it: one line per event, payload on demand.

Each event of the run's stream becomes a :class:`Line`: what happened in
words ("waits for order.paid where payload.order = 7"), who did it and why
(an operator action's ``by`` and ``reason``), when, and the raw payload
behind a click.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse

from kumiflow_django.admin.display import compact, json_text, plain_when
from kumiflow_django.conf import settings
from kumiflow_django.definition.durations import parse_instant
from kumiflow_django.projections.runs import COMPENSATE, Compensation
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
    source: str = ""  # whose stream, when a timeline mixes streams ("outbox 1a2b3c4d")


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
    restart = p.get("restart")
    if isinstance(restart, dict):  # an operator's restart of an earlier run
        who = f" by {restart['by']}" if restart.get("by") else ""
        why = f" ({restart['reason']})" if restart.get("reason") else ""
        text += f"; restarted{who} from step {restart.get('step')} of run {restart.get('run')}{why}"
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


def _switched(p: dict[str, Any]) -> str:
    before = str(p.get("from_fingerprint") or "?")[:12]
    after = str(p.get("to_fingerprint") or "?")[:12]
    text = f"carried on from definition {before}… to {after}…"
    if p.get("to_version") or p.get("from_version"):
        text += f" (version {p.get('from_version') or '—'} → {p.get('to_version') or '—'})"
    return text + f": a {p.get('classification', '?')} change (deploy)"


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
    ev.RUN_RESTARTED: lambda p: (
        f"restarted from step {p.get('from_step')} as run {p.get('run')} "
        f"(on {'the current' if p.get('definition') == 'current' else 'its own'} definition)"
    ),
    ev.RUN_RECOVERED: lambda p: "recovered after a stalled worker",
    ev.DEFINITION_SWITCHED: _switched,
    ev.SEGMENT_REFUSED: lambda p: (
        f"the database refused the segment (refusal {p.get('attempt')}: "
        f"{_first_line(p.get('error'), 160)}); tried again at {_at(p.get('retry_at'))}"
    ),
}


def _waiting_branches(p: dict[str, Any]) -> str:
    waits = p.get("waits") or []
    children = p.get("children") or []
    parts = [f"{len(waits)} event(s)"] if waits else []
    if children:
        parts.append(f"{len(children)} child run(s)")
    if p.get("wake_at"):
        parts.append(f"a timer ({_at(p['wake_at'])})")
    return f"waits at step {_cursor(p.get('cursor'))} in branches for " + (
        ", ".join(parts) or "nothing more"
    )


def _child_settled(p: dict[str, Any]) -> str:
    text = f"child run {str(p.get('child_id', '?'))[:8]} ({p.get('workflow', '?')}) ended "
    text += str(p.get("status", "?"))
    if p.get("error"):
        text += f": {_first_line(p['error'], 160)}"
    return text


_SUMMARIES.update(
    {
        ev.STEP_WAITING_FOR_CHILD: lambda p: (
            f"waits at step {_cursor(p.get('cursor'))} for child run "
            f"{str(p.get('child_id', '?'))[:8]}"
        ),
        ev.STEP_WAITING_BRANCHES: _waiting_branches,
        ev.CHILD_SETTLED: _child_settled,
    }
)


def _dispatch_failed(p: dict[str, Any]) -> str:
    code = f" (HTTP {p['status_code']})" if p.get("status_code") else ""
    return f"attempt {p.get('attempt')} failed{code}: {_first_line(p.get('error'), 160)}"


_SUMMARIES.update(
    {
        ev.DISPATCH_REQUESTED: lambda p: (
            f"{p.get('kind', '?')} requested by step {p.get('step') or '?'}"
        ),
        ev.DISPATCH_ATTEMPT_STARTED: lambda p: f"delivery attempt {p.get('attempt')} started",
        ev.DISPATCH_ATTEMPT_FAILED: lambda p: (
            f"{_dispatch_failed(p)}; the next at {_at(p.get('next_attempt_at'))}"
        ),
        ev.DISPATCHED: lambda p: (
            f"delivered at attempt {p.get('attempt')}"
            + (f" (HTTP {p['status_code']})" if p.get("status_code") else "")
        ),
        ev.DISPATCH_FAILED: lambda p: f"dead: {_dispatch_failed(p)}",
        ev.DISPATCH_CANCELLED: lambda p: "delivery cancelled",
        ev.DISPATCH_REDELIVERY: lambda p: "redelivery requested (a fresh retry budget)",
        ev.CRON_REGISTERED: lambda p: (
            f"scheduled {p.get('expression')} ({p.get('timezone')}); "
            f"next {_at(p.get('next_fire_at'))}"
        ),
        ev.CRON_CHANGED: lambda p: (
            f"changed to {p.get('expression')} ({p.get('timezone')})"
            + (f"; next {_at(p['next_fire_at'])}" if p.get("next_fire_at") else "")
        ),
        ev.CRON_REMOVED: lambda p: f"disabled: {p.get('reason')}",
        ev.CRON_FIRED: lambda p: (
            f"fired{' by hand' if p.get('manual') else ''}: "
            f"{len(p.get('run_ids') or [])} run(s) started"
            + (f", {p['skipped']} skipped" if p.get("skipped") else "")
        ),
        ev.CRON_SKIPPED: lambda p: f"{p.get('skipped')} occurrence(s) skipped",
        ev.CRON_ENABLED: lambda p: f"enabled; next {_at(p.get('next_fire_at'))}",
        ev.CRON_DISABLED: lambda p: (
            "disabled" if p.get("by") else f"disabled: {_first_line(p.get('reason'))}"
        ),
    }
)

_KINDS = {
    ev.RUN_FAILED: "failed",
    ev.SEGMENT_REFUSED: "failed",
    ev.RETRY_SCHEDULED: "failed",
    ev.STEP_WAITING: "wait",
    ev.STEP_WAITING_FOR_EVENT: "wait",
    ev.STEP_WAITING_FOR_CHILD: "wait",
    ev.STEP_WAITING_BRANCHES: "wait",
    ev.RUN_COMPLETED: "done",
    ev.DISPATCHED: "done",
    ev.DISPATCH_FAILED: "failed",
    ev.DISPATCH_ATTEMPT_FAILED: "failed",
}

#: The events operator actions append: their ``reason`` is a person's.
_OPERATOR_EVENTS = frozenset(
    {
        ev.RUN_CANCELLED,
        ev.RUN_WOKEN,
        ev.RUN_RETRIED,
        ev.RUN_RESTARTED,
        ev.DISPATCH_CANCELLED,
        ev.DISPATCH_REDELIVERY,
        ev.CRON_FIRED,
        ev.CRON_ENABLED,
        ev.CRON_DISABLED,
    }
)
#: The reasons they store when none is given.
_DEFAULT_REASONS = {
    ev.RUN_CANCELLED: "cancelled",
    ev.DISPATCH_CANCELLED: "cancelled",
    ev.CRON_DISABLED: "disabled by an operator",
}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def line(event: Event) -> Line:
    payload = event.payload if isinstance(event.payload, dict) else {}
    summarise = _SUMMARIES.get(event.type)
    try:
        summary = summarise(payload) if summarise else event.type
    except (KeyError, TypeError, ValueError, AttributeError):  # an odd payload: say so
        summary = f"{event.type} (unusual payload)"
    by = event.created_by
    if event.type in _OPERATOR_EVENTS:  # elsewhere "by" is the engine's (resumed by timer)
        by = _text(payload.get("by")) or by
    reason = _text(payload.get("reason"))
    if (
        event.type not in _OPERATOR_EVENTS
        or reason == _DEFAULT_REASONS.get(event.type)
        or (not by and reason.startswith("broken: "))
    ):
        reason = ""  # a machine reason: the summary says it
    kind = "operator" if by else _KINDS.get(event.type, "")
    return Line(
        event=event,
        summary=summary,
        operator=by,
        reason=reason,
        payload=json_text(event.payload, settings.ADMIN_PAYLOAD_CHARS),
        kind=kind,
    )


#: How a run's error goes on when a compensation failed after the step's failure.
_THEN_FAILED = "Then a compensation failed: "


class _Compensations:
    """Reads a run's compensations as its timeline goes: which step each one
    undoes (``compensation-started`` lists them, in the order they run), so a
    line at cursor ``[$compensate, k, ...]`` says "compensating step 2 (...)"."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.steps: list[str] = []
        self.done = 0  # how many compensations are known to be over

    def name(self, k: int) -> str:
        if 0 <= k < len(self.steps):
            path = self.steps[k]
            label = self.labels.get(path)
            return f"step {path} ({label})" if label else f"step {path}"
        return f"compensation {k + 1}"

    def names(self, upto: int) -> str:
        return ", ".join(self.name(k) for k in range(self.done, upto))

    def summary(self, item: Line) -> None:
        event = item.event
        p = event.payload if isinstance(event.payload, dict) else {}
        if event.type == ev.COMPENSATION_STARTED:
            self.steps = [
                _cursor(path) if isinstance(path, list) else str(path)
                for path in p.get("steps") or []
            ]
            self.done = 0
            what = "was cancelled" if p.get("then") == "cancelled" else "failed"
            error = _first_line(p.get("error"), 160)
            item.summary = f"the run {what} ({p.get('reason') or '?'}: {error}); compensating " + (
                ", then ".join(self.name(k) for k in range(len(self.steps))) or "its steps"
            )
            item.kind = "failed"
            return
        cursor = p.get("cursor")
        if isinstance(cursor, list) and len(cursor) >= 2 and cursor[0] == COMPENSATE:
            k = int(cursor[1]) if isinstance(cursor[1], int) else 0
            inner = ".".join(str(c) for c in cursor[2:])
            before = f"compensated {self.names(k)}; " if k > self.done else ""
            self.done = max(self.done, k)
            where = self.steps[k] + ".compensate" if k < len(self.steps) else ""
            if where and inner:
                where += f".{inner}"
            text = item.summary.replace(_cursor(cursor), where or _cursor(cursor))
            item.summary = f"{before}compensating {self.name(k)}: {text}"
            return
        if event.type == ev.RUN_FAILED and p.get("compensation") == Compensation.FAILED:
            error = str(p.get("error") or "")
            cause = error.split(_THEN_FAILED, 1)[-1]
            at = re.search(r"at step ([\w.$]+?)\.compensate\b", cause)
            path = at.group(1) if at else None
            k = self.steps.index(path) if path in self.steps else self.done
            before = f"compensated {self.names(k)}; " if k > self.done else ""
            what = self.name(k) if path is None or path in self.steps else f"step {path}"
            item.summary = f"{before}the compensation of {what} failed: {_first_line(cause)}"
            return
        if (
            event.type in (ev.RUN_FAILED, ev.RUN_CANCELLED)
            and p.get("compensation") == Compensation.COMPENSATED
        ):
            done = self.names(len(self.steps)) if self.steps else "its steps"
            self.done = len(self.steps)
            item.summary = f"compensated {done}; then {item.summary}"


def lines(
    events: list[Event], *, own_stream: str | None = None, labels: dict[str, str] | None = None
) -> list[Line]:
    """The lines of ``events``; those of another stream than ``own_stream``
    (a run's dispatches, in the run's timeline) say whose they are.
    ``labels`` (step path to label) name the steps a compensation undoes."""
    out = []
    compensations = _Compensations(labels or {})
    for event in events:
        item = line(event)
        if own_stream is not None and event.stream_id != own_stream:
            item.source = f"outbox {event.stream_id[:8]}"
        else:
            try:
                compensations.summary(item)
            except (KeyError, TypeError, ValueError, AttributeError):
                pass  # an odd payload: the plain summary stands
        out.append(item)
    return out


#: The latest events a dispatch's or a schedule's page shows.
STREAM_EVENTS = 100


def stream_url(stream_id: str, tenant: str) -> str:
    """The event list of one stream: its id and its tenant name it."""
    query = urlencode({"stream": stream_id, "tenant": tenant})
    return f"{reverse('admin:kumiflow_event_changelist')}?{query}"


def stream_context(stream_id: str, tenant: str) -> dict[str, Any]:
    """The timeline of one stream (a dispatch's, a schedule's) for its page."""
    events = list(reversed(Event.objects.for_stream(stream_id, tenant).reverse()[:STREAM_EVENTS]))
    return {
        "timeline": lines(events),
        "timeline_capped": len(events) == STREAM_EVENTS,
        "events_url": stream_url(stream_id, tenant),
    }
