"""Restarting a finished run from one of its steps: a new run, linked to the old.

A restart is a **new run**, not a new segment of the old one, because:

- the old run's end is a fact the log keeps: it failed (or was cancelled, or
  completed) at a time, for a reason; its row, its metrics and whoever waited
  for it (a parent, ``ChildFailed``) read that end, and it stays true;
- its idempotency key stays with it: a start with that key still returns the
  old run. The new run has a key of its own, derived from the old one
  (``<key>#restart-<n>``, ``n`` counting the restarts of that run), so it is
  never swallowed by the old run's key and a second restart is a third run;
- its side effects keep their identities: the outbox requests, the tasks and
  the child runs of the old run stay its own (their rows point at it); those
  the new run asks for again are new rows, with new idempotency keys (a
  dispatch's and a task's key is its id), which the pre-flight says;
- the timeline of each run reads from its start to its end: the old run gets
  one ``run-restarted`` event naming the new run, the new run's
  ``run-started`` carries ``restart`` (the old run, the step, the copied
  state, who and why).

The new run starts through the one start (:class:`~.run_start.RunStart`), on
the old run's trigger and input, at the chosen step (run anew, not resumed),
with the state the old run had before that step: the results of the steps
before it are carried, nothing before it runs again.

Where a run can restart: at a step its committed segments ran (a failed
segment was rolled back as a whole, so the steps it ran did not happen; its
first step can be chosen), at the step a cancelled run waited at, or at its
first step ("start again"), whose state
is a new run's. A step inside a ``for_each``, ``parallel``, ``retry`` or a
compensation is not a restart point (its position needs the enclosing step's
own state): restart at the enclosing step. A run that compensated (its
completed steps were undone) restarts only from its first step.
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kumiflow_django.conf import settings
from kumiflow_django.definition.context import STATE_KEYS, Trigger, TriggerEvent, new_state
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.step import COMPENSATE, Step, path_text, walk
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.engine.opening import keyed_run
from kumiflow_django.engine.run_start import RestartFrom
from kumiflow_django.engine.segment import Segment
from kumiflow_django.engine.starting import MAX_KEY_LENGTH, start_run
from kumiflow_django.projections import lock_order
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.store import db, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store.audit import audited, check_operator
from kumiflow_django.store.errors import (
    InvalidEvent,
    InvalidRunState,
    OperationConflict,
    Refusal,
    RunNotFound,
    UnknownWorkflow,
    raise_refusal,
)
from kumiflow_django.store.models import Event
from kumiflow_django.store.values import dump

logger = telemetry.get_logger("kumiflow_django.engine.restart")

#: The statuses a run is restarted from.
RESTARTABLE = (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.COMPLETED)
#: Which definition the new run runs on.
Definition = Literal["run", "current"]
DEFINITIONS = ("run", "current")
#: Containers a restart point may be inside: their position is the cursor alone.
_ENTERABLE = ("branch",)
#: The events that close a committed segment (their trail's steps happened).
_COMMITTED = frozenset(
    {
        ev.STEP_WAITING,
        ev.STEP_WAITING_FOR_EVENT,
        ev.RETRY_SCHEDULED,
        ev.STEP_WAITING_FOR_CHILD,
        ev.STEP_WAITING_BRANCHES,
        ev.RUN_COMPLETED,
        ev.COMPENSATION_STARTED,
    }
)
#: Step kinds whose effect happens again, and what the pre-flight calls it.
_EFFECTS = {
    "mail_send": "mail",
    "webhook_send": "webhook",
    "task": "task",
    "child": "child run",
    "append_event": "appended event",
    "call": "handler call",
    "model.create": "model write",
    "model.update": "model write",
    "model.upsert": "model write",
    "model.delete": "model write",
}


#: The engine's step kinds with no effect outside the run (or only the run's own
#: control flow); a kind registered by a project is assumed to have effects.
_PURE = frozenset(
    {
        "compute",
        "read.find_one",
        "read.find_many",
        "wait",
        "wait_for_event",
        "return",
        "branch",
        "for_each",
        "parallel",
        "retry",
    }
)


@dataclass(frozen=True)
class PlanStep:
    """A step of the definition the restarted run may run."""

    path: str
    kind: str
    name: str | None
    label: str


@dataclass(frozen=True)
class Repeat:
    """A side effect that happens again, and under which idempotency key."""

    path: str
    what: str
    name: str | None
    key: Literal["new", "old", "none"]
    note: str


@dataclass(frozen=True)
class RestartPlan:
    """What a restart of ``run`` from ``from_step`` will do (the pre-flight)."""

    run: str
    workflow: str
    from_step: str
    definition: str
    choices: list[PlanStep]
    again: list[PlanStep] = field(default_factory=list)
    repeats: list[Repeat] = field(default_factory=list)
    carried: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    definition_changed: bool = False
    idempotency_key: str | None = None
    refusal: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _label(path: str, step: Step) -> str:
    name = f"'{step.name}'" if step.name else step.kind
    return f"{path} {name} ({step.kind})" if step.name else f"{path} ({step.kind})"


def step_label(workflow: Workflow | None, path: str) -> str:
    """A step in words: ``'charge' (task)``; the path when it is not in ``workflow``."""
    if workflow is None:
        return path
    try:
        step = workflow.step_at(parse_path(path))
    except ValueError:
        return path
    return f"'{step.name}' ({step.kind})" if step.name else f"{step.kind} at {path}"


def parse_path(text: str) -> list[Any]:
    """``"2.then.0"`` as a cursor (``[2, "then", 0]``); ValueError if malformed."""
    if not isinstance(text, str) or not text:
        raise ValueError("a step path is text like '2' or '2.then.0'")
    parts: list[Any] = []
    for i, part in enumerate(text.split(".")):
        if i % 2 == 0:
            if not part.isdigit():
                raise ValueError(f"{text!r} is not a step path")
            parts.append(int(part))
        else:
            parts.append(part)
    if len(parts) % 2 != 1:
        raise ValueError(f"{text!r} is not a step path")
    return parts


def _before(q: list[Any], p: list[Any]) -> bool:
    """Whether the step at ``q`` ends before the step at ``p`` begins (tree
    order; an enclosing step ends after its children)."""
    for a, b in zip(q, p, strict=False):
        if a == b:
            continue
        return isinstance(a, int) and isinstance(b, int) and a < b
    return False  # one encloses the other (or the same step)


def _from_on(q: list[Any], p: list[Any]) -> bool:
    """Whether the step at ``q`` may run in a run restarted at ``p``."""
    return not _before(q, p) and not (len(q) < len(p) and p[: len(q)] == q)


def _enterable(workflow: Workflow, cursor: list[Any]) -> str | None:
    """Why a restart cannot begin at ``cursor`` (None: it can)."""
    for end in range(1, len(cursor), 2):
        outer = workflow.step_at(cursor[:end])
        label = cursor[end]
        if label == COMPENSATE:
            return "it is part of a compensation"
        if outer.kind not in _ENTERABLE:
            return (
                f"it is inside the {outer.kind} step at {path_text(cursor[:end])}: "
                f"restart from that step"
            )
    return None


def _events(run: WorkflowRun) -> list[Event]:
    return list(
        Event.objects.filter(stream_id=str(run.id), tenant_id=run.tenant_id).order_by("version")
    )


@dataclass
class _History:
    """What the old run's log says: the steps its committed segments ran, the
    last committed state, the latest results by step name."""

    committed: list[str]
    state: dict[str, Any]
    results: dict[str, Any]
    #: The step a failed segment began at, or a cancelled run waited at.
    failed_at: str | None
    restarts: int
    #: Each committed ``set_attributes`` change, in order: (step path, changes).
    attributes: list[tuple[str, dict[str, Any]]]
    #: The results a restart carried into this run (their steps ran in the run
    #: it restarted, not in this one's segments).
    inherited: list[str] = field(default_factory=list)


def _history(run: WorkflowRun, events: Iterable[Event]) -> _History:
    committed: dict[str, None] = {}
    state: dict[str, Any] = new_state()
    results: dict[str, Any] = {}
    failed_at: str | None = None
    restarts = 0
    inherited: list[str] = []
    segment_began: list[Any] | None = None
    attributes: list[tuple[str, dict[str, Any]]] = []
    for event in events:
        p = event.payload if isinstance(event.payload, dict) else {}
        if event.type == ev.RUN_STARTED:
            restart = p.get("restart") or {}
            if restart:
                state = copy.deepcopy(restart["state"])
                results = dict(state.get("steps") or {})
                inherited = list(results)
                segment_began = restart.get("cursor")
                attributes = [(a["step"], a["attributes"]) for a in restart.get("attributes") or []]
        elif event.type == ev.RUN_ATTRIBUTES_SET:
            if isinstance(p.get("step"), str) and isinstance(p.get("attributes"), dict):
                attributes.append((p["step"], p["attributes"]))
        elif event.type == ev.RUN_RESTARTED:
            restarts += 1
        elif event.type in _COMMITTED:
            committed.update(dict.fromkeys(p.get("trail") or ()))
            if isinstance(p.get("state"), dict):
                state = p["state"]
                results.update(state.get("steps") or {})
            if event.type == ev.RUN_COMPLETED:
                for name, value in (p.get("steps") or {}).items():
                    if not _not_kept(value) or name not in results:
                        results[name] = value
            segment_began = p.get("cursor")
        elif event.type == ev.RUN_RETRIED:
            restore = p.get("restore") or {}
            state = restore.get("state") or state
            segment_began = restore.get("cursor")
        elif event.type in (ev.RUN_FAILED, ev.RUN_CANCELLED):
            # Where the failed segment began, or where a cancelled run waited:
            # the state there is committed, the step can run anew.
            began = segment_began if segment_began else [0]
            failed_at = path_text(began) if began and began[0] != "$compensate" else None
    return _History(list(committed), state, results, failed_at, restarts, attributes, inherited)


def _not_kept(value: Any) -> bool:
    """A result a closing event left out (too large): see ``capped_steps``."""
    return isinstance(value, str) and value.startswith("… (") and value.endswith("not kept)")


def _definition(run: WorkflowRun, definition: str) -> Workflow | Refusal:
    if definition not in DEFINITIONS:
        return Refusal(f"definition must be 'run' or 'current', not {definition!r}", InvalidEvent)
    if definition == "current":
        if not registry.is_registered(run.workflow):
            return Refusal(f"no workflow {run.workflow!r} is registered", UnknownWorkflow)
        return registry.get(run.workflow)
    found = registry.find(run.workflow, run.workflow_version or None)
    if found is None or found.fingerprint != run.fingerprint:
        return Refusal(
            f"the run's definition of {run.workflow!r} (fingerprint {run.fingerprint[:12]}…) "
            "is no longer registered: restart on the current definition, or register the old "
            "one again with its version=",
            UnknownWorkflow,
        )
    return found


def _choices(run: WorkflowRun, workflow: Workflow, history: _History) -> list[PlanStep]:
    """The steps ``run`` can restart from, in the definition's order."""
    allowed = {"0"}
    if not run.compensation:  # nothing was undone: what committed segments ran is kept
        allowed.update(history.committed)
        if history.failed_at:
            allowed.add(history.failed_at)
    found: list[PlanStep] = []
    for path, step in walk(workflow.steps):
        text = path_text(path)
        if text in allowed and _enterable(workflow, list(path)) is None:
            found.append(PlanStep(text, step.kind, step.name, _label(text, step)))
    return found


def _key(run: WorkflowRun, n: int) -> str | None:
    """``<key>#restart-<n>``, the first such key no run of the workflow has.

    A key too long for the column with the suffix is shortened, and a digest of
    the whole key is kept in it: two keys sharing their first characters must
    not shorten to one key (the second restart would get the first's run). A
    key taken already (a start of its own used it) is skipped, not taken over.
    """
    if run.idempotency_key is None:
        return None
    key = run.idempotency_key
    n = max(n, 1)
    while True:
        suffix = f"#restart-{n}"
        if len(key) + len(suffix) <= MAX_KEY_LENGTH:
            candidate = key + suffix
        else:
            digest = "~" + hashlib.sha256(key.encode()).hexdigest()[:16]
            candidate = key[: MAX_KEY_LENGTH - len(suffix) - len(digest)] + digest + suffix
        if keyed_run(run.tenant_id, run.workflow, candidate) is None:
            return candidate
        n += 1


def _carried_state(
    workflow: Workflow, history: _History, cursor: list[Any]
) -> tuple[dict[str, Any], list[str], list[str]]:
    """The state a run restarted at ``cursor`` begins with, the names of the
    results it carries, and notes (results that cannot be carried)."""
    if cursor == [0]:
        return new_state(), [], []
    names: dict[str, None] = {}
    later: set[str] = set()
    if history.inherited:  # carried into a restarted run: before its steps, by name
        wanted = set(history.inherited)
        for at, named in walk(workflow.steps):
            if named.name in wanted and COMPENSATE not in at and _before(list(at), cursor):
                names[named.name] = None
    for text in history.committed:
        try:
            q = parse_path(text)
            step = workflow.step_at(q)
        except ValueError:
            continue
        if step.name is None:
            continue
        if _before(q, cursor):
            names[step.name] = None
        else:
            later.add(step.name)
    notes: list[str] = []
    steps: dict[str, Any] = {}
    for name in names:
        if name not in history.results:
            continue
        value = history.results[name]
        if _not_kept(value):
            raise ValueError(
                f"the result of step {name!r} was too large for the log to keep: "
                "restart from an earlier step"
            )
        steps[name] = value
        if name in later:
            notes.append(
                f"the result {name!r} is the old run's last one: a later step of the same "
                "name may have replaced it"
            )
    old = history.state
    state: dict[str, Any] = new_state()
    state["steps"] = steps
    for part in STATE_KEYS[1:]:
        if part in ("steps", "settled", "compensations"):
            continue
        entries = old.get(part)
        if isinstance(entries, dict):
            kept = {k: v for k, v in entries.items() if _key_before(k, cursor)}
            if kept or part in STATE_KEYS[:4]:
                state[part] = kept
    compensations = [
        c
        for c in old.get("compensations") or []
        if isinstance(c, dict) and _before(list(c.get("path") or []), cursor)
    ]
    seen = {path_text(c["path"]) for c in compensations if not c.get("branch")}
    for text in history.committed:  # completed after the last committed state
        try:
            q = parse_path(text)
            step = workflow.step_at(q)
        except ValueError:
            continue
        if (
            COMPENSATE in step.children
            and text not in seen
            and _before(q, cursor)
            and _enterable(workflow, q) is None
        ):
            compensations.append({"path": q, "scope": {}, "branch": ""})
    if compensations:
        state["compensations"] = compensations
    return state, list(steps), notes


def _key_before(key: str, cursor: list[Any]) -> bool:
    try:
        return _before(parse_path(key), cursor)
    except ValueError:
        return False  # a branch instance's key (inside a parallel): not carried


def _repeats(workflow: Workflow, again: list[PlanStep]) -> list[Repeat]:
    found: list[Repeat] = []
    key: Literal["new", "old", "none"]
    for planned in again:
        step = workflow.step_at(parse_path(planned.path))
        what = _EFFECTS.get(step.kind)
        if what is None:
            if step.kind not in _PURE:  # a project's own step kind: its effects are its own
                found.append(
                    Repeat(
                        planned.path,
                        f"{step.kind} step",
                        step.name,
                        "none",
                        "a step kind of your project: whatever it does happens again",
                    )
                )
            continue
        if step.kind in ("mail_send", "webhook_send"):
            key, note = "new", "a new outbox request: its Idempotency-Key is its new id"
        elif step.kind == "task":
            key, note = "new", "a new task: current_task().idempotency_key is its new id"
        elif step.kind == "child":
            if step.args.get("idempotency_key") is not None:
                key = "old"
                note = (
                    "its key is resolved from the run's values again: the child run of that key "
                    "is not started again (its outcome is taken if it ended)"
                )
            else:
                key, note = "new", "a new child run"
        else:
            key, note = "none", "in the new run's transaction, again"
        found.append(Repeat(planned.path, what, step.name, key, note))
    return found


#: The longest step path a restart reads (the HTTP API's ``maxLength``); a
#: longer one is refused without being echoed back.
MAX_PATH_LENGTH = 200


def _plan(run: WorkflowRun, from_step: str, definition: str, history: _History) -> RestartPlan:
    if len(from_step) > MAX_PATH_LENGTH or len(str(definition)) > MAX_PATH_LENGTH:
        return RestartPlan(
            str(run.id),
            run.workflow,
            from_step[:MAX_PATH_LENGTH],
            str(definition)[:MAX_PATH_LENGTH],
            [],
            refusal=f"a step path or a definition is at most {MAX_PATH_LENGTH} characters",
        )
    workflow = _definition(run, definition)
    empty = RestartPlan(str(run.id), run.workflow, str(from_step), str(definition), [])
    if isinstance(workflow, Refusal):
        return _refused(empty, workflow)
    current = registry.get(run.workflow) if registry.is_registered(run.workflow) else None
    changed = current is not None and current.fingerprint != run.fingerprint
    choices = _choices(run, workflow, history)
    plan = RestartPlan(
        str(run.id),
        run.workflow,
        str(from_step),
        str(definition),
        choices,
        definition_changed=changed,
        idempotency_key=_key(run, history.restarts + 1),
    )
    if changed:
        plan.notes.append("the definition changed since the run started")
    if run.status not in RESTARTABLE:
        return _refused(
            plan, f"the run is {run.status}: only failed, cancelled or completed runs are restarted"
        )
    if run.trigger_position is not None and _trigger_event(run) is None:
        return _refused(plan, _trigger_gone(run))
    try:
        cursor = parse_path(from_step)
        workflow.step_at(cursor)
    except ValueError:
        return _refused(plan, f"the definition has no step {from_step!r}")
    if from_step not in {c.path for c in choices}:
        why = _enterable(workflow, cursor)
        if why is None and run.compensation:
            why = "the run compensated (its completed steps were undone): start it again instead"
        elif why is None and run.status == RunStatus.FAILED and history.failed_at:
            why = (
                f"it did not happen: the failed segment was rolled back as a whole; restart "
                f"from {history.failed_at}, where that segment began, or earlier"
            )
        return _refused(
            plan, f"the run cannot restart at step {from_step}: {why or 'it did not run'}"
        )
    try:
        state, carried, notes = _carried_state(workflow, history, cursor)
    except ValueError as exc:
        return _refused(plan, str(exc))
    plan.carried.extend(carried)
    plan.notes.extend(notes)
    for path, step in walk(workflow.steps):
        if COMPENSATE in path:
            continue
        if _from_on(list(path), cursor):
            text = path_text(path)
            plan.again.append(PlanStep(text, step.kind, step.name, _label(text, step)))
    plan.repeats.extend(_repeats(workflow, plan.again))
    if any(s.kind == "wait_for_event" for s in plan.again):
        plan.notes.append("a wait for an event waits again, for an event after the restart")
    if run.parent_id is not None:
        plan.notes.append(
            f"the old run was a child of run {run.parent_id}: the new run is not (its end is "
            "not reported to that parent)"
        )
    return plan


def _refused(plan: RestartPlan, why: str) -> RestartPlan:
    return RestartPlan(**{**asdict(plan), "refusal": why, "again": [], "repeats": []})


def _get(run_id: uuid.UUID | str, tenant: str | None, lock: bool) -> WorkflowRun:
    try:
        pk = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    except ValueError:
        raise RunNotFound(f"{run_id!r} is not a run id") from None
    if lock:
        run = lock_order.lock_run(pk, tenant=tenant)
    else:
        qs = WorkflowRun.objects.filter(pk=pk)
        run = (qs.filter(tenant_id=tenant) if tenant is not None else qs).first()
    if run is None:
        raise RunNotFound(f"no run {run_id}" + (f" in tenant {tenant!r}" if tenant else ""))
    return run


def restart_plan(
    run_id: uuid.UUID | str,
    from_step: str = "0",
    *,
    definition: Definition = "run",
    tenant: str | None = None,
) -> RestartPlan:
    """The pre-flight of :func:`restart_run`: the steps it can restart from,
    what runs again, each side effect that happens again and under which key,
    the results carried; ``refusal`` says why it does not apply (None: it does)."""
    run = _get(run_id, tenant, lock=False)
    return _plan(run, str(from_step), definition, _history(run, _events(run)))


def applicable_plan(run: WorkflowRun, from_step: str = "0") -> RestartPlan | None:
    """The plan of a restart of ``run`` from ``from_step`` on its own definition,
    else on the current one, whichever applies first (the log read once); None
    when neither does. The console decides with it what to offer."""
    if run.status not in RESTARTABLE:
        return None
    history = _history(run, _events(run))
    for definition in DEFINITIONS:
        plan = _plan(run, str(from_step), definition, history)
        if plan.refusal is None:
            return plan
    return None


def refuse_restart(
    run: WorkflowRun, from_step: str = "0", *, definition: Definition = "run"
) -> str | None:
    """Why :func:`restart_run` does not apply to ``run`` from ``from_step``
    (None: it does); the admin and the HTTP API ask it too."""
    if run.status not in RESTARTABLE:
        return f"the run is {run.status}: only failed, cancelled or completed runs are restarted"
    return _plan(run, str(from_step), definition, _history(run, _events(run))).refusal


def _trigger_event(run: WorkflowRun) -> Event | None:
    if run.trigger_position is None:
        return None
    return Event.objects.filter(position=run.trigger_position, tenant_id=run.tenant_id).first()


def _trigger_gone(run: WorkflowRun) -> str:
    return (
        f"its trigger event at position {run.trigger_position} is no longer in the log "
        "(erased): it cannot be restarted"
    )


def _trigger(run: WorkflowRun) -> Trigger:
    if run.trigger_position is None:
        return TriggerEvent(type=run.trigger_type, payload=run.input or {}, tenant_id=run.tenant_id)
    event = _trigger_event(run)
    if event is None:  # erased since the plan was read (the plan refuses it too)
        raise InvalidRunState(f"run {run.id}: {_trigger_gone(run)}")
    return event


@db.retrying
def restart_run(
    run_id: uuid.UUID | str,
    *,
    from_step: str = "0",
    reason: str = "",
    by: str = "",
    tenant: str | None = None,
    definition: Definition = "run",
) -> WorkflowRun:
    """Start a new run from step ``from_step`` (a path: ``"2"``, ``"2.then.0"``)
    of a failed, cancelled or completed run, with the results its steps before
    it had, on the run's definition or the ``"current"`` one. ``"0"`` starts it
    again with the same input. Returns the new run; the old one gets a
    ``run-restarted`` event naming it (see the module docstring for why a
    restart is a new run, and :func:`restart_plan` for what it repeats)."""
    by, reason = check_operator(by, reason)
    with db.atomic():
        old = _get(run_id, tenant, lock=True)
        history = _history(old, _events(old))
        plan = _plan(old, str(from_step), definition, history)
        if plan.refusal is not None:
            raise_refusal(
                _as_refusal(old, definition, plan.refusal), InvalidRunState, f"run {old.id}"
            )
        workflow = _definition(old, definition)
        assert isinstance(workflow, Workflow)
        cursor = parse_path(str(from_step))
        state, _, _ = _carried_state(workflow, history, cursor)
        dump(
            state,
            "the restarted run's state",
            max_bytes=settings.MAX_STATE_BYTES,
            setting="KUMIFLOW_MAX_STATE_BYTES",
        )
        trigger = _trigger(old)
        new_id = uuid.uuid4()
        marker: dict[str, Any] = {
            "run": str(new_id),
            "from_step": str(from_step),
            "definition": definition,
        }
        if plan.idempotency_key is not None:
            marker["idempotency_key"] = plan.idempotency_key
        segment = Segment(old.id, old.tenant_id, old)
        segment.add(ev.RUN_RESTARTED, audited(marker, by, reason), created_by=by)
        segment.write()
        since = Event.objects.last_position()
        new = start_run(
            workflow,
            trigger=trigger,
            tenant=old.tenant_id,
            key=plan.idempotency_key,
            since=since,
            input_=old.input if old.trigger_position is None else None,
            priority=old.priority,
            restart=RestartFrom(
                run=old.id,
                step=str(from_step),
                cursor=cursor,
                state=state,
                definition=definition,
                by=by,
                reason=reason,
                attributes=tuple(
                    (step, changes)
                    for step, changes in history.attributes
                    if _before(parse_path(step), cursor)
                ),
            ),
            run_id=new_id,
        )
        if new.id != new_id:
            # A start of its own took the key between the plan and the start:
            # its run is not this restart (nothing is kept: the marker rolls back).
            raise OperationConflict(
                f"run {old.id}: the restart's key {plan.idempotency_key!r} was taken by run "
                f"{new.id} meanwhile: try again"
            )
    logger.info(
        "run %s restarted from step %s as run %s by %s (%s)",
        old.id,
        from_step,
        new.id,
        by or "code",
        reason or "no reason given",
        extra=telemetry.run_log_fields(old),
    )
    return new


def _as_refusal(run: WorkflowRun, definition: str, text: str) -> str:
    """The plan's refusal with the error it raises (an unknown definition, a bad argument)."""
    found = _definition(run, definition)
    return found if isinstance(found, Refusal) else text
