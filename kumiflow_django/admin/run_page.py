"""What a run's page shows, gathered from the run row, its stream and its outbox rows.

- the failure panel (a failed run): reason, error, the traceback captured at
  failure and the step results the run had then, from its ``run-failed`` event;
- the wait panel (a run waiting for an event): what it waits for;
- the picture of its steps, drawn from the definition it started on (the
  snapshot stored by fingerprint), with each step's result, duration, the
  delivery of each mail or webhook, the state of each task and child run;
- its structure (:mod:`.structure`): the branches of its parallel steps side
  by side, its task attempts, its child runs (and a child's parent and root);
- the timeline, with the compensations in words.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from kumiflow_django.admin import structure
from kumiflow_django.admin.display import duration, value_details, when
from kumiflow_django.admin.picture import StepNote, find, render
from kumiflow_django.admin.timeline import Line, lines, stream_url
from kumiflow_django.conf import settings
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.snapshots import outline, snapshot
from kumiflow_django.engine import unserved
from kumiflow_django.flow import admission
from kumiflow_django.projections.dispatches import Dispatch, DispatchStatus
from kumiflow_django.projections.runs import COMPENSATE, FINISHED, RunStatus, WorkflowRun
from kumiflow_django.projections.tasks import StepTask
from kumiflow_django.projections.waiting_for import waiting_for
from kumiflow_django.projections.waits import own_wait
from kumiflow_django.store import clock
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import Event

#: The latest events of a run the page reads (its timeline, durations, failure).
TIMELINE_EVENTS = 200
#: Outbox rows of a run the picture reads.
DISPATCHES = 500

#: What to do about a failure, by its reason.
HINTS = {
    ev.STEP_FAILED: "Fix the cause (the data, the code, the service), then Retry: the failed "
    "segment runs again from where it began.",
    ev.DEFINITION_CHANGED: "The run's definition is not registered here, and the registered one "
    "changed a step the run executed or is at (the error says which). Retry on the current "
    "definition moves the run onto it, if the current definition still has the run's step; or "
    "register the old definition again with its version= (docs/deploying.md).",
    ev.DEFINITION_NOT_SERVED: "No live worker process had the run's definition within "
    "KUMIFLOW_UNKNOWN_DEFINITION_GRACE. Deploy a worker that has it (or keep it registered "
    "with its version=), then retry the run.",
    ev.NOT_REGISTERED: "No workflow of this name is registered in this deployment.",
    ev.TRIGGER_UNAVAILABLE: "The trigger event was erased: the run cannot continue.",
    ev.AWAITED_UNAVAILABLE: "The awaited event was erased: the run cannot continue.",
    ev.CORRUPT_STATE: "The run's stored state is unusable; cancel it and start a new run.",
    ev.STATE_TOO_LARGE: "Step results are kept in the run's state: keep large data in your own "
    "tables and store its key in the step result.",
    ev.UNSTORABLE_STATE: "The database refused to store the run's segment repeatedly.",
    ev.START_DEPTH_EXCEEDED: "Workflows started each other too deeply in one transaction.",
}

#: Per step kind: more to say about a step of a run (the kind's own state). The
#: delivery kinds (mail, webhook) are filled below; a kind with attempts of its
#: own adds its function here.
STEP_NOTES: dict[str, Callable[[WorkflowRun, dict[str, Any], list[Any]], list[SafeString]]] = {}


@dataclass
class Definition:
    """The outline the picture is drawn from, and where it came from."""

    outline: dict[str, Any] | None
    source: str  # "snapshot", "registered", "current", "none"
    current_fingerprint: str | None


def definition_of(run: WorkflowRun) -> Definition:
    """The definition the run started on: its snapshot, else the registered
    version with the run's fingerprint, else the current one (with a warning)."""
    current = registry.get(run.workflow) if registry.is_registered(run.workflow) else None
    current_fp = current.fingerprint if current else None
    stored = snapshot(run.fingerprint) if run.fingerprint else None
    if stored is not None and stored.outline.get("steps") is not None:
        return Definition(stored.outline, "snapshot", current_fp)
    for workflow in registry.all_versions():
        if workflow.name == run.workflow and workflow.fingerprint == run.fingerprint:
            return Definition(outline(workflow), "registered", current_fp)
    if current is not None:
        return Definition(outline(current), "current", current_fp)
    return Definition(None, "none", None)


def _events(run: WorkflowRun) -> list[Event]:
    events = Event.objects.filter(stream_id=str(run.id), tenant_id=run.tenant_id).order_by(
        "-version"
    )[:TIMELINE_EVENTS]
    return list(reversed(events))


def _outbox_events(dispatches: list[Dispatch]) -> list[Event]:
    """The latest events of the run's dispatches (requested, attempts, delivered,
    an operator's cancel or redelivery), in log order."""
    if not dispatches:
        return []
    streams = [(d.tenant_id, str(d.id)) for d in dispatches]
    events = Event.objects.of_streams(streams).order_by("-position")[:TIMELINE_EVENTS]
    return list(reversed(events))


def _path(cursor: Any) -> str:
    return ".".join(str(p) for p in cursor) if isinstance(cursor, list) and cursor else ""


def _durations(
    events: list[Event], now: Any, ran: Mapping[str, float] | None = None
) -> dict[str, str]:
    """Per step path: how long its work took (summed over segments and loop
    items), or how long the run waited there. ``ran``: the seconds a step's
    work took outside the run's segments (a task step's attempts), which is
    its duration rather than the instant its segment took to hand it over."""
    took: dict[str, float] = defaultdict(float)
    waited: dict[str, float] = defaultdict(float)
    waiting_since: tuple[str, Any] | None = None
    for event in events:
        p = event.payload if isinstance(event.payload, dict) else {}
        for path, ms in (p.get("durations") or {}).items():
            if isinstance(ms, int | float):
                took[path] += ms
        if event.type in (ev.STEP_WAITING, ev.STEP_WAITING_FOR_EVENT, ev.RETRY_SCHEDULED):
            waiting_since = (_path(p.get("cursor")), event.created_at)
        elif event.type in (ev.STEP_RESUMED, ev.RUN_CANCELLED, ev.RUN_FAILED):
            if waiting_since is not None:
                path, since = waiting_since
                waited[path] += (event.created_at - since).total_seconds()
            waiting_since = None
    if waiting_since is not None:
        path, since = waiting_since
        waited[path] += max((now - since).total_seconds(), 0.0)
    for path, seconds in (ran or {}).items():
        took[path] = seconds * 1000
    texts: dict[str, str] = {}
    for path in set(took) | set(waited):
        parts = []
        if path in took:
            parts.append(("ran " if path in (ran or {}) else "") + duration(took[path] / 1000))
        if path in waited:
            parts.append(f"waited {duration(waited[path])}")
        texts[path] = " · ".join(parts)
    return texts


def _task_seconds(by_step: Mapping[str, list[Any]]) -> dict[str, float]:
    """Per task step: the seconds its tasks' last attempts ran (their own clock)."""
    ran: dict[str, float] = {}
    for path, rows in by_step.items():
        seconds = [r.duration for r in rows if isinstance(r, StepTask) and r.duration is not None]
        if seconds:
            ran[path] = float(sum(seconds))
    return ran


def _results(run: WorkflowRun, events: list[Event]) -> dict[str, Any]:
    """The step results the run has: its state at the last suspension, then
    those its closing event kept (a completed or failed run's last segment)."""
    results: dict[str, Any] = {}
    state = run.state if isinstance(run.state, dict) else {}
    if isinstance(state.get("steps"), dict):
        results.update(state["steps"])
    for event in events:
        if event.type in (ev.RUN_COMPLETED, ev.RUN_FAILED) and isinstance(event.payload, dict):
            kept = event.payload.get("steps")
            if isinstance(kept, dict):
                results.update(kept)
    return results


def _deliveries(run: WorkflowRun, node: dict[str, Any], rows: list[Any]) -> list[SafeString]:
    if not rows:
        return []
    counts = Counter(row.status for row in rows)
    url = reverse("admin:kumiflow_dispatch_changelist") + f"?run={run.id}"
    if len(rows) == 1:
        url = reverse("admin:kumiflow_dispatch_change", args=[rows[0].id])
    badges = format_html_join(
        " ",
        '<span class="kf-delivery kf-delivery-{}">{} {}</span>',
        ((status, n if len(rows) > 1 else "", status) for status, n in sorted(counts.items())),
    )
    last = rows[-1]
    detail = f"{last.attempts} attempt(s)"
    if last.last_error:
        detail += f"; last error: {last.last_error[:120]}"
    return [format_html('delivery: <a href="{}">{}</a> <small>{}</small>', url, badges, detail)]


for _kind in ("mail_send", "webhook_send"):
    STEP_NOTES.setdefault(_kind, _deliveries)
STEP_NOTES.setdefault("task", structure.task_note)
STEP_NOTES.setdefault("child", structure.child_note)


def _notes(
    run: WorkflowRun,
    steps: list[dict[str, Any]],
    events: list[Event],
    by_step: Mapping[str, list[Any]],
    results: dict[str, Any],
    restart_points: Mapping[str, str],
) -> dict[str, StepNote]:
    now = clock.now()
    durations = _durations(events, now, _task_seconds(by_step))
    cap = settings.ADMIN_PAYLOAD_CHARS
    notes: dict[str, StepNote] = {}
    ran = set(run.trail or ())

    def visit(nodes: list[dict[str, Any]]) -> None:
        for node in nodes:
            note = StepNote(duration=durations.get(node["path"], ""))
            name = node.get("name")
            # Results are kept by name: a step that did not run (the branch not
            # taken) shows none, not the result of its namesake that ran.
            if isinstance(name, str) and name in results and node["path"] in ran:
                note.result = value_details(results[name], cap)
            annotate = STEP_NOTES.get(node["kind"])
            if annotate is not None:
                note.extra.extend(annotate(run, node, by_step.get(node["path"], [])))
            if node["path"] in restart_points:
                note.extra.append(
                    format_html(
                        '<a class="kf-restart-here" href="{}">restart from here</a>',
                        restart_points[node["path"]],
                    )
                )
            notes[node["path"]] = note
            for kids in node["children"].values():
                visit(kids)

    visit(steps)
    return notes


def _flat(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for node in nodes:
        out.append(node)
        for kids in node["children"].values():
            out += _flat(kids)
    return out


def _failure(
    run: WorkflowRun, events: list[Event], steps: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    if run.status != RunStatus.FAILED:
        return None
    failed = next((e for e in reversed(events) if e.type == ev.RUN_FAILED), None)
    p: Mapping[str, Any] = failed.payload if failed is not None else {}
    path, words = step_words(run, run.cursor_text, steps)
    at_failure = p.get("steps")
    return {
        "reason": p.get("reason") or run.reason,
        "error": p.get("error") or run.last_error,
        "traceback": p.get("traceback") or "",
        "steps": value_details(at_failure, settings.ADMIN_PAYLOAD_CHARS, limit=160)
        if isinstance(at_failure, dict)
        else None,
        "step": words,
        "path": path,
        "event": failed,
        "hint": HINTS.get(str(p.get("reason") or run.reason), ""),
    }


def step_words(run: WorkflowRun, path: str, steps: list[dict[str, Any]] | None) -> tuple[str, str]:
    """A step path as the headline says it, and the step in words: a position in
    the compensations (``$compensate.0``) becomes the compensation's own step,
    and a compensation's step names the step it undoes."""
    if not path or not steps:
        return path, ""
    parts = path.split(".")
    if parts[0] == COMPENSATE:
        entries = (run.state or {}).get("compensations") or []
        try:
            entry = entries[len(entries) - 1 - int(parts[1])]
            base = ".".join(str(p) for p in entry["path"])
        except (IndexError, ValueError, KeyError, TypeError):
            return path, "a compensation"
        path = ".".join([base, "compensate", *parts[2:]])
    node = find(steps, path)
    words = node["label"] if node else ""
    if ".compensate" in path:
        base = path.split(".compensate", 1)[0]
        owner = find(steps, base)
        undoes = f"the compensation of step {base}" + (f" ({owner['label']})" if owner else "")
        words = f"{words}, {undoes}" if words else undoes
    return path, words


def _waiting(run: WorkflowRun) -> dict[str, Any] | None:
    wait = own_wait(run)
    if wait is None:
        return None
    match = wait.match if isinstance(wait.match, dict) else {}
    awaited = waiting_for(run, wait)
    return {
        # "waiting for task charge": the engine's own events said as what they are.
        "title": awaited["text"] if awaited else f"waiting for event {wait.event_type}",
        "kind": awaited["kind"] if awaited else "event",
        "event_type": wait.event_type,
        "match": sorted(match.items()),
        "timeout": run.wake_at,
        "timeout_at": when(run.wake_at),
        "matched": run.matched_position,
    }


def _unserved(run: WorkflowRun) -> dict[str, Any] | None:
    """A due run that no live worker process can resume: the definition it
    waits for, and when it fails if none comes (a rolling deploy)."""
    now = clock.now()
    if run.wake_at is None or run.wake_at > now:
        return None
    if not unserved.waiting(now).filter(pk=run.pk).exists():
        return None
    fails_at = run.wake_at + timedelta(seconds=settings.UNKNOWN_DEFINITION_GRACE)
    return {
        "definition": unserved.describe(run),
        "fingerprint": run.fingerprint,
        "fails_at": when(fails_at),
        "workers_url": reverse("admin:kumiflow_workerprocess_changelist"),
    }


def _held(run: WorkflowRun) -> dict[str, Any] | None:
    """Why a queued run is not running yet (flow control), and what holds it."""
    if run.status != RunStatus.QUEUED:
        return None
    return {
        "why": admission.hold_text(run, clock.now()),
        "held_by": run.held_by,
        "scope": run.flow_scope,
        "key": run.flow_key,
        "rate_key": run.rate_key,
        "keys_url": reverse("admin:kumiflow_flowkey_changelist")
        + "?"
        + urlencode({"q": run.flow_key}),
    }


def context(run: WorkflowRun, *, restart_points: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``restart_points``: the restart page of each step the run can restart
    from (the picture links them), when the viewer may restart it."""
    events = _events(run)
    rows = list(Dispatch.objects.filter(run_id=run.id).order_by("created_at")[:DISPATCHES])
    attempts = structure.task_attempts(run)
    kids = structure.children(run)
    by_step: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_step[row.step_path].append(row)
    for task in attempts.tasks:
        by_step[task.step_path].append(task)
    for kid in kids.rows:
        by_step[kid.parent_step].append(kid)
    definition = definition_of(run)
    steps = definition.outline["steps"] if definition.outline else None
    results = _results(run, events)
    picture = None
    if steps is not None:
        picture = render(
            definition.outline or {},
            trail=run.trail,
            cursor=run.cursor,
            status=run.status,
            notes=_notes(run, steps, events, by_step, results, restart_points or {}),
        )
    merged = sorted([*events, *_outbox_events(rows)], key=lambda e: e.position)
    labels = {n["path"]: n["label"] for n in _flat(steps or [])}
    timeline: list[Line] = lines(merged, own_stream=str(run.id), labels=labels)
    return {
        "attempts": attempts,
        "children": kids,
        "lineage": structure.lineage(run),
        "branches": structure.branches(run, steps, results),
        "run": run,
        "active": run.status not in FINISHED,
        "failure": _failure(run, events, steps),
        "waiting": _waiting(run),
        "held": _held(run),
        "unserved": _unserved(run) if run.status not in FINISHED else None,
        "picture": picture,
        "definition": definition,
        "definition_current": definition.current_fingerprint == run.fingerprint,
        "timeline": timeline,
        "timeline_capped": len(events) == TIMELINE_EVENTS,
        "events_url": stream_url(str(run.id), run.tenant_id),
        "dispatches_url": reverse("admin:kumiflow_dispatch_changelist") + f"?run={run.id}",
        "delivery_problems": _delivery_problems(run, rows),
    }


def _delivery_problems(run: WorkflowRun, rows: list[Dispatch]) -> list[Dispatch]:
    """A completed run's dead or failing deliveries: "completed" is not the whole story."""
    if run.status != RunStatus.COMPLETED:
        return []
    return [d for d in rows if d.status in (DispatchStatus.DEAD, DispatchStatus.FAILED)]
