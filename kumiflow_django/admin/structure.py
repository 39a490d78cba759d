"""The structure of a run on its page: its task attempts, its branches, its child runs.

Each panel reads a bounded number of rows whatever the size of the run (a
parallel ``for_each`` over thousands of items, a task retried many times):
the task rows and their attempt events in two queries, the child runs in
one, the branches from the run's own state (no query). What is left out is
counted ("and N more") and one click away in a filtered list.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from kumiflow_django.admin.display import duration
from kumiflow_django.admin.picture import find
from kumiflow_django.definition.durations import parse_instant
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.projections.tasks import StepTask
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import Event

#: Task rows of a run the page reads (a for_each of tasks has one per item).
TASKS = 200
#: Attempt events of those tasks the page reads, the latest first.
ATTEMPT_EVENTS = 600
#: Attempts listed on the page.
ATTEMPTS_SHOWN = 100
#: Child runs listed on the page (the rest: the run list filtered by parent).
CHILDREN = 50
#: Branches (or items in flight) drawn per parallel step.
BRANCHES_SHOWN = 24

_ATTEMPT_TYPES = (
    ev.TASK_ATTEMPT_STARTED,
    ev.TASK_ATTEMPT_FAILED,
    ev.TASK_COMPLETED,
    ev.TASK_FAILED,
    ev.TASK_CANCELLED,
)


# -- task attempts -----------------------------------------------------------------


@dataclass
class Attempt:
    """One attempt of one task, from the task's stream (and its row, for the
    attempt running now: its worker's lease and heartbeat are not events)."""

    task: StepTask
    number: int
    status: str  # running, failed (retried), failed, completed, cancelled
    worker: str = ""
    started_at: datetime | None = None
    took: str = ""
    heartbeat_at: datetime | None = None
    error: str = ""
    error_type: str = ""
    traceback: str = ""


def _attempts_of(task: StepTask, events: list[Event]) -> list[Attempt]:
    attempts: list[Attempt] = []
    current: Attempt | None = None
    for event in events:
        p = event.payload if isinstance(event.payload, dict) else {}
        if event.type == ev.TASK_ATTEMPT_STARTED:
            current = Attempt(
                task, int(p.get("attempt") or 0), "running", str(p.get("worker") or "")
            )
            current.started_at = event.created_at
            attempts.append(current)
            continue
        if current is None or current.status != "running":
            # An end without a start we read (cut off, or a failure at request):
            # say what it was anyway.
            if event.type in (ev.TASK_FAILED, ev.TASK_CANCELLED):
                current = Attempt(task, int(p.get("attempt") or 0), "")
                attempts.append(current)
            else:
                continue
        seconds = p.get("duration")
        if isinstance(seconds, int | float):
            current.took = duration(float(seconds))
        if event.type == ev.TASK_COMPLETED:
            current.status = "completed"
        elif event.type == ev.TASK_CANCELLED:
            current.status = "cancelled"
            current.error = str(p.get("reason") or "")
        else:
            current.status = "retried" if event.type == ev.TASK_ATTEMPT_FAILED else "failed"
            if p.get("error_type") == ev.WORKER_LOST:  # its lease ran out with no result
                current.status = (
                    "worker lost, retried"
                    if event.type == ev.TASK_ATTEMPT_FAILED
                    else "worker lost"
                )
            current.error = str(p.get("error") or "")
            current.error_type = str(p.get("error_type") or "")
            current.traceback = str(p.get("traceback") or "")
    if current is not None and current.status == "running" and task.attempt == current.number:
        current.heartbeat_at = task.heartbeat_at
        current.worker = task.worker or current.worker
    return attempts


@dataclass
class Attempts:
    rows: list[Attempt]
    tasks: list[StepTask]
    more: int  # attempts not listed
    capped: bool  # the run has more tasks than were read


def task_attempts(run: WorkflowRun) -> Attempts:
    """The run's task attempts, newest task last, in two queries."""
    tasks = list(StepTask.objects.filter(run_id=run.id).order_by("created_at")[: TASKS + 1])
    capped = len(tasks) > TASKS
    tasks = tasks[:TASKS]
    if not tasks:
        return Attempts([], [], 0, False)
    streams = [(t.tenant_id, str(t.id)) for t in tasks]
    events = Event.objects.of_streams(streams).filter(type__in=_ATTEMPT_TYPES)
    events = events.order_by("-position")[:ATTEMPT_EVENTS]
    by_stream: dict[str, list[Event]] = defaultdict(list)
    for event in reversed(list(events)):
        by_stream[event.stream_id].append(event)
    rows = [a for t in tasks for a in _attempts_of(t, by_stream.get(str(t.id), []))]
    shown = rows[-ATTEMPTS_SHOWN:]
    return Attempts(shown, tasks, len(rows) - len(shown), capped)


_TASK_STATES = {
    "pending": "pending",
    "running": "running",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}


def task_note(run: WorkflowRun, node: dict[str, Any], rows: list[Any]) -> list[SafeString]:
    """The state of a task step's task(s), beside the step in the picture."""
    tasks = [r for r in rows if isinstance(r, StepTask)]
    if not tasks:
        return []
    counts = Counter(t.status for t in tasks)
    badges = format_html_join(
        " ",
        '<span class="kf-delivery kf-task-{}">{}{}</span>',
        (
            (_TASK_STATES.get(status, "other"), f"{n} " if len(tasks) > 1 else "", status)
            for status, n in sorted(counts.items())
        ),
    )
    last = tasks[-1]
    detail = f"attempt {last.attempt} of {last.max_attempt}"
    if last.worker:
        detail += f" on {last.worker}"
    if last.last_error and last.status != "completed":
        detail += f"; last error: {last.last_error[:120]}"
    return [
        format_html(
            'task: <a href="#kf-task-{}-{}">{}</a> <small>{}</small>',
            last.id,
            last.attempt,
            badges,
            detail,
        )
    ]


# -- child runs ----------------------------------------------------------------------


@dataclass
class Children:
    rows: list[WorkflowRun]
    more: bool
    url: str  # the run list filtered by this parent


def children(run: WorkflowRun) -> Children:
    """The run's child runs, oldest first, in one query."""
    rows = list(
        WorkflowRun.objects.filter(parent_id=run.id)
        .only(
            "id", "workflow", "status", "parent_step", "started_at", "finished_at", "compensation"
        )
        .order_by("started_at", "id")[: CHILDREN + 1]
    )
    url = reverse("admin:kumiflow_workflowrun_changelist") + f"?parent={run.id}"
    return Children(rows[:CHILDREN], len(rows) > CHILDREN, url)


def run_link(run_id: uuid.UUID | None) -> SafeString | str:
    if run_id is None:
        return ""
    url = reverse("admin:kumiflow_workflowrun_change", args=[run_id])
    return format_html('<a href="{}">{}</a>', url, str(run_id)[:8])


def lineage(run: WorkflowRun) -> dict[str, Any] | None:
    """A child run's parent and root (its tree), for the head of its page."""
    if run.parent_id is None:
        return None
    return {
        "parent": run_link(run.parent_id),
        "parent_step": run.parent_step,
        "root": run_link(run.root_id) if run.root_id and run.root_id != run.parent_id else "",
        "depth": run.depth,
    }


def child_note(run: WorkflowRun, node: dict[str, Any], rows: list[Any]) -> list[SafeString]:
    """The child run(s) a child step started, beside the step in the picture."""
    kids = [r for r in rows if isinstance(r, WorkflowRun)]
    if not kids:
        return []
    if len(kids) == 1:
        kid = kids[0]
        return [format_html("child run {} ({})", run_link(kid.id), kid.get_status_display())]
    counts = Counter(k.status for k in kids)
    text = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return [format_html("child runs: {}", text)]


# -- branches -------------------------------------------------------------------------


@dataclass
class Branch:
    label: str
    state: str  # running, waiting, done, failed, cancelled, queued
    at: str = ""  # the step path the branch is at
    step: str = ""  # that step's label
    waits: str = ""  # what it waits for


@dataclass
class Branches:
    path: str
    label: str
    instance: str  # "" or the branch instance (a parallel step inside a branch)
    branches: list[Branch] = field(default_factory=list)
    more: int = 0
    summary: str = ""


def _wait_text(wait: Any) -> str:
    if not isinstance(wait, dict):
        return ""
    kind = wait.get("kind")
    if kind in ("timer", "retry"):
        at = wait.get("wake_at")
        moment = parse_instant(at).strftime("%Y-%m-%d %H:%M:%S %Z") if at else "?"
        return f"{'a retry' if kind == 'retry' else 'a timer'} until {moment}"
    if kind == "child":
        return f"child run {str(wait.get('child_id'))[:8]}"
    if kind == "branches":
        return "its own branches"
    if kind == "event":
        if wait.get("event_type") == ev.TASK_SETTLED:
            return "its task"
        if wait.get("event_type") == ev.SETTLED:
            return "a delivery"
        return f"event {wait.get('event_type')}"
    return ""


def _position(
    steps: list[dict[str, Any]], prefix: str, cursor: Any, wait: Any
) -> tuple[str, str, str]:
    rel = ".".join(str(p) for p in cursor) if isinstance(cursor, list) and cursor else ""
    at = f"{prefix}.{rel}" if rel else prefix
    node = find(steps, at)
    return at, node["label"] if node else "", _wait_text(wait)


#: A run in one of these states has no branch that goes on.
_ENDED = (RunStatus.FAILED, RunStatus.CANCELLED)


def _failed_in(run: WorkflowRun, prefix: str) -> bool:
    here = run.cursor_text
    return run.status == RunStatus.FAILED and (here == prefix or here.startswith(prefix + "."))


def _parallel(
    run: WorkflowRun,
    steps: list[dict[str, Any]],
    node: dict[str, Any],
    entry: dict[str, Any] | None,
    result: Any,
) -> list[Branch]:
    names = [n for n in node["children"] if n != "compensate"]
    states = (entry or {}).get("branches") or {}
    out = []
    for name in names:
        prefix = f"{node['path']}.{name}"
        data = states.get(name) or {}
        status = data.get("status")
        branch = Branch(name, "done")
        if _failed_in(run, prefix):
            branch.state = "failed"
            branch.at = run.cursor_text
            found = find(steps, run.cursor_text)
            branch.step = found["label"] if found else ""
        elif entry is None:  # the step is over: its result names the branches done
            done = not isinstance(result, dict) or name in result
            branch.state = "done" if done else "cancelled"
        elif status == "waiting":
            # A run that ended (a branch failed, an operator cancelled) cancelled it.
            branch.state = "cancelled" if run.status in _ENDED else "waiting"
            branch.at, branch.step, branch.waits = _position(
                steps, prefix, data.get("cursor"), data.get("wait")
            )
        elif status == "ready":
            branch.state = "cancelled" if run.status in _ENDED else "running"
        elif status in ("done", "cancelled"):
            branch.state = status
        out.append(branch)
    return out


def _for_each(
    run: WorkflowRun, steps: list[dict[str, Any]], node: dict[str, Any], entry: dict[str, Any]
) -> tuple[list[Branch], int, str]:
    items = entry.get("items") or []
    inflight = entry.get("inflight") or {}
    started = int(entry.get("next") or 0)
    prefix = f"{node['path']}.do"
    shown = []
    for index in sorted(inflight, key=lambda i: int(i))[:BRANCHES_SHOWN]:
        data = inflight[index]
        branch = Branch(f"item {index}", "cancelled" if run.status in _ENDED else "waiting")
        branch.at, branch.step, branch.waits = _position(
            steps, prefix, data.get("cursor"), data.get("wait")
        )
        shown.append(branch)
    done = started - len(inflight)
    queued = max(len(items) - started, 0)
    summary = f"{len(items)} items: {len(inflight)} in flight, {done} done, {queued} not started"
    if _failed_in(run, prefix):
        summary += "; an item failed"
    return shown, max(len(inflight) - len(shown), 0), summary


def branches(
    run: WorkflowRun, steps: list[dict[str, Any]] | None, results: dict[str, Any]
) -> list[Branches]:
    """The parallel steps the run reached, each with its branches side by side."""
    if not steps:
        return []
    state = run.state if isinstance(run.state, dict) else {}
    kept = state.get("parallel")
    entries: dict[str, Any] = kept if isinstance(kept, dict) else {}
    trail = set(run.trail or ())
    out: list[Branches] = []

    def instances(path: str) -> list[tuple[str, dict[str, Any]]]:
        found = [("", entries[path])] if isinstance(entries.get(path), dict) else []
        found += [
            (key[: -len(path)].rstrip("/"), value)
            for key, value in sorted(entries.items())
            if key.endswith("/" + path) and isinstance(value, dict)
        ]
        return found[:BRANCHES_SHOWN]

    def visit(nodes: list[dict[str, Any]]) -> None:
        for node in nodes:
            path, kind = node["path"], node["kind"]
            if kind in ("parallel", "for_each"):
                # The state is the one of the last suspension: a step the run
                # went past since has an entry that is no longer true.
                here = run.cursor_text
                over = path in trail and not here.startswith(path + ".")
                found = [] if over else instances(path)
                for scope, entry in found:
                    panel = Branches(path, node["label"], scope)
                    if "items" in entry:
                        panel.branches, panel.more, panel.summary = _for_each(
                            run, steps, node, entry
                        )
                    else:
                        panel.branches = _parallel(run, steps, node, entry, None)
                    out.append(panel)
                reached = path in trail or _failed_in(run, path)
                if not found and kind == "parallel" and reached:
                    result = results.get(node["name"]) if node.get("name") else None
                    out.append(
                        Branches(path, node["label"], "", _parallel(run, steps, node, None, result))
                    )
                elif not found and kind == "for_each" and path in trail:
                    result = results.get(node["name"]) if node.get("name") else None
                    if isinstance(result, list):
                        out.append(
                            Branches(path, node["label"], "", summary=f"{len(result)} items done")
                        )
            for kids in node["children"].values():
                visit(kids)

    visit(steps)
    return out
