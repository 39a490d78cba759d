"""Workflows: ``define_workflow`` builds one, validates it, and registers it.

A definition is plain data, validated when it is built (at import time of
a ``workflows.py``): an error names the workflow and the step path, and a
value that a column could not store is refused here, not at run time. Its
fingerprint is computed once, here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kumiflow_django.definition.attributes import check_declared
from kumiflow_django.definition.fingerprint import UnstableValue, canonical_value, fingerprint
from kumiflow_django.definition.flow import Limit, Rate, check_priority
from kumiflow_django.definition.matching import check_path
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.step import (
    COMPENSATE,
    Step,
    check_resolver,
    get_kind,
    path_text,
    step_at,
    walk,
)
from kumiflow_django.definition.triggers import TRIGGERS, CronTrigger, ManualTrigger, Trigger
from kumiflow_django.store import limits
from kumiflow_django.store.errors import WorkflowDefinitionError
from kumiflow_django.store.names import SETTLED, TASK_SETTLED

START_MODES = ("inline", "deferred")
#: What a run does when a deploy changed its definition (docs/deploying.md):
#: carry on when the change is compatible for it, stay on its own version, or fail.
ON_CHANGE = ("compatible", "pin", "fail")
#: What a run does when a step's retries ran out: ends failed, or is paused
#: for an operator to resume (after a fix) or fail.
ON_EXHAUSTED = ("fail", "pause")


@dataclass(eq=False)
class Workflow:
    name: str
    trigger: Trigger
    steps: tuple[Step, ...]
    idempotency_key: str | Callable[[Any], str] | None = None
    version: str | None = None
    start_mode: str = "inline"
    #: Where the console finds a run's business key when it has no idempotency
    #: key: a path into the trigger event (``payload.order_id``, ``stream_id``).
    #: Not part of the fingerprint: it changes what the console shows, not what runs.
    business_key: str | None = None
    #: Flow control (``kumiflow_django.flow``): not in the fingerprint either,
    #: so that an operator or a deploy can change a limit under running runs.
    concurrency: Limit | None = None
    rate: Rate | None = None
    priority: int = 0
    #: What a run started on another definition of this workflow does when
    #: this one is registered and its own is not (:data:`ON_CHANGE`). Not in
    #: the fingerprint: choosing a policy changes no run's steps.
    on_change: str = "compatible"
    #: Search attributes resolved at the start (name -> value or function of
    #: the context): not in the fingerprint; they change what the console and
    #: ``with_attribute`` find, not what runs.
    attributes: dict[str, Any] = field(default_factory=dict)
    #: ``"fail"`` or ``"pause"`` (:data:`ON_EXHAUSTED`): not in the fingerprint,
    #: a policy an operator may change under running runs.
    on_exhausted: str = "fail"
    fingerprint: str = field(init=False)
    #: awaited event type -> the sets of match paths its waits use
    awaited: dict[str, set[tuple[str, ...]]] = field(init=False)
    #: awaited event types that branches of a parallel step await (``RunWait``)
    awaited_in_branches: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.fingerprint = fingerprint(self.canonical())
        self.awaited = {}
        self.awaited_in_branches = set()
        for path, step in walk(self.steps):
            awaited = None
            if step.kind == "wait_for_event":
                awaited = step.args["event_type"]
                paths = tuple(sorted(step.args["match"]))
                self.awaited.setdefault(awaited, set()).add(paths)
            elif step.kind in ("mail_send", "webhook_send") and step.args.get("await_delivery"):
                awaited = SETTLED
                self.awaited.setdefault(SETTLED, set()).add(("stream_id",))
            elif step.kind == "task":
                awaited = TASK_SETTLED
                self.awaited.setdefault(TASK_SETTLED, set()).add(("stream_id",))
            if awaited is not None and _in_branches(self.steps, path):
                self.awaited_in_branches.add(awaited)

    def __repr__(self) -> str:
        version = f" v{self.version}" if self.version is not None else ""
        return f"<Workflow {self.name}{version} {self.fingerprint[:12]}>"

    def canonical(self) -> dict[str, Any]:
        """The definition as data that reads the same in every process.

        A value without such a form (an ``object()``, an instance whose repr
        holds a memory address) raises WorkflowDefinitionError naming the
        step and the argument: its fingerprint would differ in the process
        that resumes the run.
        """
        try:
            trigger = self.trigger.canonical()
        except UnstableValue as exc:
            raise WorkflowDefinitionError(f"workflow {self.name!r}, trigger: {exc}") from exc
        try:
            steps = [_canonical_step(s, f"step {i}") for i, s in enumerate(self.steps)]
        except UnstableValue as exc:
            raise WorkflowDefinitionError(f"workflow {self.name!r}, {exc}") from exc
        return {"name": self.name, "version": self.version, "trigger": trigger, "steps": steps}

    def step_at(self, cursor: list[Any]) -> Step:
        return step_at(self.steps, cursor)


def _canonical_value(value: Any, where: str) -> Any:
    if isinstance(value, Step):
        return _canonical_step(value, where)
    return canonical_value(value, where, render=_canonical_value)


def _canonical_step(step: Step, where: str) -> dict[str, Any]:
    """``where`` is the step's path as errors name it (``step 0.do.1``)."""
    at = f"{where} ({step.kind})"
    return {
        "kind": step.kind,
        "name": _canonical_value(step.name, f"{at}, name"),
        "args": {
            k: _canonical_value(v, f"{at}, argument {k!r}")
            for k, v in sorted(step.args.items())
            if k not in FLOW_ARGS
        },
        "children": {
            label: [_canonical_step(c, f"{where}.{label}.{i}") for i, c in enumerate(children)]
            for label, children in step.children.items()
        },
    }


#: Step arguments of flow control: not in the fingerprint (a limit may change
#: under running runs, and a definition without one keeps its fingerprint).
FLOW_ARGS = frozenset({"concurrency", "rate"})

#: Longest static step path (``0.do.2.then.1``): the outbox stores it.
MAX_PATH_LENGTH = limits.STEP_PATH
#: Longest step name (a ``wait_for_event``'s default name is its event type).
MAX_NAME_LENGTH = limits.EVENT_TYPE


def _in_branches(steps: tuple[Step, ...], path: tuple[Any, ...]) -> bool:
    """Whether the step at ``path`` lies in a branch (of ``parallel`` or of a
    parallel ``for_each``), where several waits of one run coexist."""
    level: tuple[Step, ...] = steps
    for depth in range(0, len(path) - 1, 2):
        step = level[path[depth]]
        if step.kind == "parallel" or (step.kind == "for_each" and step.args.get("parallel")):
            return True
        level = step.children[path[depth + 1]]
    return False


def _validate_steps(name: str, steps: tuple[Step, ...]) -> None:
    named: dict[str, tuple[Any, ...]] = {}
    for path, step in walk(steps):
        where = path_text(path)
        if not isinstance(step, Step):
            raise WorkflowDefinitionError(
                f"workflow {name!r}, step {where}: {step!r} is not a step (use the builders "
                "of kumiflow_django.steps)"
            )
        if len(where) > MAX_PATH_LENGTH:
            raise WorkflowDefinitionError(
                f"workflow {name!r}: steps are nested too deeply (path {where[:60]}… is longer "
                f"than {MAX_PATH_LENGTH} characters)"
            )
        try:
            kind = get_kind(step.kind)
            if len(path) > 1 and not kind.allowed_nested:
                raise ValueError(f"{step.kind} is only allowed at the top level of a workflow")
            kind.validate(step)
            if "approval" in step.args and _in_branches(steps, path):
                # decide_approval and the inbox read a run's own wait, not a
                # branch's: the approval could never be decided
                raise ValueError(
                    "an approval cannot wait in a branch of a parallel step or a parallel "
                    "for_each; put it before or after the parallel step"
                )
            _check_name(step.name)
            if COMPENSATE in step.children:
                if not kind.compensable:
                    raise ValueError(f"a {step.kind} step cannot have a compensation")
                if not step.children[COMPENSATE]:
                    raise ValueError("compensate needs at least one step")
        except (LookupError, ValueError, TypeError) as exc:
            raise WorkflowDefinitionError(
                f"workflow {name!r}, step {where} ({step.kind}): {exc}"
            ) from exc
        if step.name is not None and get_kind(step.kind).stores_result:
            other = named.get(step.name)
            if other is not None and not _exclusive(other, path):
                raise WorkflowDefinitionError(
                    f"workflow {name!r}: two steps store their result as {step.name!r} "
                    f"(steps {'.'.join(map(str, other))} and {where}); give one another name="
                )
            named.setdefault(step.name, path)


def _check_name(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH:
        raise ValueError(
            f"a step name must be a string of 1 to {MAX_NAME_LENGTH} characters: {value!r:.60}"
        )
    if not value.isprintable():
        raise ValueError(f"a step name must not contain control characters: {value!r}")


def _exclusive(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether two step paths lie in the two arms of one ``branch`` (only one runs)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i % 2 == 1 and {x, y} == {"then", "else"}
    return False


def define_workflow(
    name: str,
    *,
    steps: Sequence[Step],
    trigger: Trigger | None = None,
    idempotency_key: str | Callable[[Any], str] | None = None,
    version: str | int | None = None,
    start_mode: str = "inline",
    business_key: str | None = None,
    concurrency: Limit | None = None,
    rate: Rate | None = None,
    priority: int = 0,
    on_change: str = "compatible",
    attributes: Mapping[str, Any] | None = None,
    on_exhausted: str = "fail",
    register: bool = True,
) -> Workflow:
    """Define (and register) a workflow.

    ``trigger`` is ``on_event(...)``, ``on_cron(...)`` or None (manual start
    only). ``idempotency_key`` (a string, or a function of the trigger event)
    makes a second start with the same key return the first run.
    ``start_mode="deferred"`` records the run and lets a worker run it.
    ``business_key`` names the field of the trigger event the console shows
    for a run that has no idempotency key (``"payload.order_id"``).
    ``concurrency=Limit(key=..., max=N)``, ``rate=Rate(key=..., limit=N,
    per="PT1M")`` and ``priority`` (-100 to 100, higher first) are flow
    control: see docs/flow-control.md. ``on_change`` says what a run started
    on another definition of the workflow does once this one is deployed and
    its own is not registered: ``"compatible"`` (the default) carries it on
    when only steps it has not reached changed, ``"pin"`` never carries it
    on, ``"fail"`` fails it (docs/deploying.md, "Compatible changes").
    ``attributes={"customer": lambda ctx:
    ctx.trigger.payload["customer_id"]}`` are search attributes, resolved at
    the start (see docs/search-attributes.md).
    ``on_exhausted="pause"``: a run whose step's retries ran out is paused at
    that step instead of failed (docs/operations.md).
    """
    if not isinstance(name, str) or not name.strip() or len(name) > limits.WORKFLOW_NAME:
        raise WorkflowDefinitionError(
            f"a workflow needs a name of 1 to {limits.WORKFLOW_NAME} characters: {name!r:.60}"
        )
    trigger = trigger if trigger is not None else ManualTrigger()
    if not isinstance(trigger, TRIGGERS):
        raise WorkflowDefinitionError(f"workflow {name!r}: {trigger!r} is not a trigger")
    try:
        trigger.validate()
        if isinstance(trigger, CronTrigger):
            trigger.validate_name(name)
    except ValueError as exc:
        raise WorkflowDefinitionError(f"workflow {name!r}, trigger: {exc}") from exc
    if start_mode not in START_MODES:
        raise WorkflowDefinitionError(
            f"workflow {name!r}: start_mode must be one of {START_MODES}, not {start_mode!r}"
        )
    if on_change not in ON_CHANGE:
        raise WorkflowDefinitionError(
            f"workflow {name!r}: on_change must be one of {ON_CHANGE}, not {on_change!r}"
        )
    if on_exhausted not in ON_EXHAUSTED:
        raise WorkflowDefinitionError(
            f"workflow {name!r}: on_exhausted must be one of {ON_EXHAUSTED}, not {on_exhausted!r}"
        )
    if version is not None and (
        isinstance(version, bool) or len(str(version)) > limits.WORKFLOW_VERSION
    ):
        raise WorkflowDefinitionError(f"workflow {name!r}: invalid version {version!r}")
    if idempotency_key is not None and not (
        (isinstance(idempotency_key, str) and idempotency_key) or callable(idempotency_key)
    ):
        raise WorkflowDefinitionError(
            f"workflow {name!r}: idempotency_key must be a string or a function of the event"
        )
    if callable(idempotency_key):
        try:
            check_resolver(idempotency_key, "idempotency_key")
        except ValueError as exc:
            raise WorkflowDefinitionError(f"workflow {name!r}: {exc}") from exc
    if business_key is not None:
        try:
            check_path(business_key)
        except ValueError as exc:
            raise WorkflowDefinitionError(f"workflow {name!r}, business_key: {exc}") from exc
    _check_flow(name, concurrency, rate, priority)
    try:
        declared = check_declared(attributes or {}, "attributes")
    except ValueError as exc:
        raise WorkflowDefinitionError(f"workflow {name!r}: {exc}") from exc
    if isinstance(steps, Step) or not isinstance(steps, Sequence):
        raise WorkflowDefinitionError(f"workflow {name!r}: steps must be a list of steps")
    step_tuple = tuple(steps)
    _validate_steps(name, step_tuple)
    workflow = Workflow(
        name=name,
        trigger=trigger,
        steps=step_tuple,
        idempotency_key=idempotency_key,
        version=None if version is None else str(version),
        start_mode=start_mode,
        business_key=business_key,
        concurrency=concurrency,
        rate=rate,
        priority=priority,
        on_change=on_change,
        attributes=declared,
        on_exhausted=on_exhausted,
    )
    cycle = child_cycle(
        workflow, lambda other: registry.get(other) if registry.is_registered(other) else None
    )
    if cycle:
        raise WorkflowDefinitionError(
            f"workflow {name!r} starts itself through its children, always: "
            f"{' -> '.join(cycle)} (start the child under a condition, in a branch step "
            "or a for_each, if this is meant)"
        )
    if register:
        registry.register(workflow)
    return workflow


def _check_flow(name: str, concurrency: Any, rate: Any, priority: Any) -> None:
    try:
        if concurrency is not None:
            if not isinstance(concurrency, Limit):
                raise ValueError(
                    f"concurrency must be a Limit(key=..., max=...), not {concurrency!r}"
                )
            concurrency.validate("concurrency")
        if rate is not None:
            if not isinstance(rate, Rate):
                raise ValueError(f"rate must be a Rate(key=..., limit=..., per=...), not {rate!r}")
            rate.validate("rate")
        check_priority(priority)
    except ValueError as exc:
        raise WorkflowDefinitionError(f"workflow {name!r}: {exc}") from exc


def unconditional_children(steps: tuple[Step, ...]) -> list[str]:
    """The workflows a list of steps always starts as children: not in a
    ``branch`` arm or a ``for_each`` (they may not run), not in a compensation."""
    found: list[str] = []
    for step in steps:
        if step.kind == "child":
            found.append(step.args["workflow"])
        elif step.kind in ("parallel", "retry"):
            for label, children in step.children.items():
                if label != COMPENSATE:
                    found += unconditional_children(children)
    return found


def child_cycle(workflow: Workflow, find: Callable[[str], Workflow | None]) -> list[str]:
    """A chain of workflows that always start each other, back to ``workflow``
    (empty: none), through the workflows ``find`` knows."""
    path = [workflow.name]
    seen: set[str] = set()

    def visit(current: Workflow) -> list[str] | None:
        for name in unconditional_children(current.steps):
            if name == workflow.name:
                return [*path, name]
            if name in seen:
                continue
            seen.add(name)
            other = find(name)
            if other is None:
                continue
            path.append(name)
            found = visit(other)
            if found:
                return found
            path.pop()
        return None

    return visit(workflow) or []
