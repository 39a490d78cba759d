"""Workflow definitions: ``define_workflow`` and the triggers.

A definition is plain data, validated when it is built (at import time of
a ``workflows.py``): an error names the workflow and the step path. Its
fingerprint is computed once, here.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kumiflow_django.exceptions import WorkflowDefinitionError
from kumiflow_django.fingerprint import UnstableValue, callable_digest, canonical_value, fingerprint
from kumiflow_django.steps.base import Step, check_resolver, get_kind, step_at, walk

START_MODES = ("inline", "deferred")
MISFIRE_POLICIES = ("latest", "all", "skip")
OVERLAP_POLICIES = ("allow", "skip")


@dataclass(frozen=True)
class EventTrigger:
    """Start a run when an event of ``event_type`` is appended (and ``filter(event)``)."""

    event_type: str
    filter: Callable[[Any], bool] | None = None

    def validate(self) -> None:
        if not isinstance(self.event_type, str) or not self.event_type.strip():
            raise ValueError(f"on_event needs an event type, not {self.event_type!r}")
        if self.filter is not None:
            if not callable(self.filter):
                raise ValueError("on_event filter must be a function of the event")
            check_resolver(self.filter, "on_event filter")

    def canonical(self) -> dict[str, Any]:
        filter_ = callable_digest(self.filter) if self.filter else None
        return {"kind": "event", "event_type": self.event_type, "filter": filter_}


@dataclass(frozen=True)
class CronTrigger:
    """Start a run at each occurrence of a cron expression in a time zone."""

    expression: str
    timezone: str = "UTC"
    misfire: str = "latest"
    max_catch_up: int = 10
    overlap: str = "allow"

    #: croniter gives up looking for the next occurrence this many years ahead:
    #: what bounds, in time, the check below and every computation of a schedule.
    SEARCH_YEARS: ClassVar[int] = 50
    #: The largest value every database's ``PositiveIntegerField`` holds.
    MAX_CATCH_UP: ClassVar[int] = 2**31 - 1

    def validate(self) -> None:
        """Refuse what the cron loop could not store or would never fire: an
        expression or zone too long for its column, and an expression with no
        occurrence after now (30 February, a year in the past)."""
        from datetime import datetime

        from croniter import croniter

        from kumiflow_django import clock

        widths = _cron_columns()
        if not isinstance(self.expression, str) or not self.expression.strip():
            raise ValueError(f"on_cron needs a cron expression, not {self.expression!r}")
        if len(self.expression) > widths["expression"]:
            raise ValueError(
                f"the cron expression is longer than {widths['expression']} characters: "
                f"{self.expression[:40]!r}…"
            )
        if not croniter.is_valid(self.expression, second_at_beginning=False):
            raise ValueError(f"invalid cron expression {self.expression!r}")
        if isinstance(self.timezone, str) and len(self.timezone) > widths["timezone"]:
            raise ValueError(
                f"the time zone is longer than {widths['timezone']} characters: "
                f"{self.timezone[:40]!r}…"
            )
        try:
            zone = zoneinfo.ZoneInfo(self.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError) as exc:
            raise ValueError(f"unknown time zone {self.timezone!r}") from exc
        if self.misfire not in MISFIRE_POLICIES:
            raise ValueError(f"misfire must be one of {MISFIRE_POLICIES}, not {self.misfire!r}")
        if self.overlap not in OVERLAP_POLICIES:
            raise ValueError(f"overlap must be one of {OVERLAP_POLICIES}, not {self.overlap!r}")
        if (
            not isinstance(self.max_catch_up, int)
            or isinstance(self.max_catch_up, bool)
            or not 1 <= self.max_catch_up <= self.MAX_CATCH_UP
        ):
            raise ValueError(
                f"max_catch_up must be an integer from 1 to {self.MAX_CATCH_UP}, "
                f"not {self.max_catch_up!r}"
            )
        start = clock.now().astimezone(zone)
        try:
            it = croniter(self.expression, start, max_years_between_matches=self.SEARCH_YEARS)
            it.get_next(datetime)
        except (ValueError, OverflowError) as exc:  # croniter's errors are ValueErrors
            raise ValueError(
                f"cron expression {self.expression!r} has no occurrence in {self.timezone} "
                f"in the {self.SEARCH_YEARS} years after {start:%Y-%m-%d %H:%M}"
            ) from exc

    def validate_name(self, name: str) -> None:
        """The schedule's stream id (``cron:<name>``) must fit the event log's column."""
        width = _cron_columns()["stream_id"] - len("cron:")
        if len(name) > width:
            raise ValueError(f"the name of a cron workflow has at most {width} characters")

    def canonical(self) -> dict[str, Any]:
        return {"kind": "cron", "expression": self.expression, "timezone": self.timezone}


def _cron_columns() -> dict[str, int]:
    """The widths of the columns a schedule is stored in, read from the models
    (loaded by then: workflows are defined once the app registry is ready)."""
    from kumiflow_django.models.cron import CronSchedule
    from kumiflow_django.models.event import Event

    def width(model: Any, name: str) -> int:
        return int(model._meta.get_field(name).max_length)

    return {
        "expression": width(CronSchedule, "expression"),
        "timezone": width(CronSchedule, "timezone"),
        "stream_id": width(Event, "stream_id"),
    }


@dataclass(frozen=True)
class ManualTrigger:
    """Started only by ``start_workflow()``."""

    def validate(self) -> None:
        pass

    def canonical(self) -> dict[str, Any]:
        return {"kind": "manual"}


Trigger = EventTrigger | CronTrigger | ManualTrigger


def on_event(event_type: str, filter: Callable[[Any], bool] | None = None) -> EventTrigger:  # noqa: A002
    return EventTrigger(event_type, filter)


def on_cron(
    expression: str,
    timezone: str = "UTC",
    *,
    misfire: str = "latest",
    max_catch_up: int = 10,
    overlap: str = "allow",
) -> CronTrigger:
    """A cron trigger: croniter syntax (five fields, an optional sixth for
    seconds, ``@daily`` aliases) evaluated in an IANA time zone."""
    return CronTrigger(expression, timezone, misfire, max_catch_up, overlap)


def manual() -> ManualTrigger:
    return ManualTrigger()


@dataclass(eq=False)
class Workflow:
    name: str
    trigger: Trigger
    steps: tuple[Step, ...]
    idempotency_key: str | Callable[[Any], str] | None = None
    version: str | None = None
    start_mode: str = "inline"
    fingerprint: str = field(init=False)
    #: awaited event type -> the sets of match paths its waits use
    awaited: dict[str, set[tuple[str, ...]]] = field(init=False)

    def __post_init__(self) -> None:
        self.fingerprint = fingerprint(self.canonical())
        self.awaited = {}
        for _, step in walk(self.steps):
            if step.kind == "wait_for_event":
                paths = tuple(sorted(step.args["match"]))
                self.awaited.setdefault(step.args["event_type"], set()).add(paths)
            elif step.kind in ("mail_send", "webhook_send") and step.args.get("await_delivery"):
                from kumiflow_django.outbox import SETTLED

                self.awaited.setdefault(SETTLED, set()).add(("stream_id",))

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
            k: _canonical_value(v, f"{at}, argument {k!r}") for k, v in sorted(step.args.items())
        },
        "children": {
            label: [_canonical_step(c, f"{where}.{label}.{i}") for i, c in enumerate(children)]
            for label, children in step.children.items()
        },
    }


#: Longest static step path (``0.do.2.then.1``): the outbox stores it.
MAX_PATH_LENGTH = 200
#: Longest step name (a ``wait_for_event``'s default name is its event type).
MAX_NAME_LENGTH = 200


def _validate_steps(name: str, steps: tuple[Step, ...]) -> None:
    named: dict[str, tuple[Any, ...]] = {}
    for path, step in walk(steps):
        where = ".".join(map(str, path))
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
            _check_name(step.name)
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
    register: bool = True,
) -> Workflow:
    """Define (and register) a workflow.

    ``trigger`` is ``on_event(...)``, ``on_cron(...)`` or None (manual start
    only). ``idempotency_key`` (a string, or a function of the trigger event)
    makes a second start with the same key return the first run.
    ``start_mode="deferred"`` records the run and lets a worker run it.
    """
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise WorkflowDefinitionError(f"a workflow needs a name of 1 to 200 characters: {name!r}")
    trigger = trigger if trigger is not None else ManualTrigger()
    if not isinstance(trigger, EventTrigger | CronTrigger | ManualTrigger):
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
    if version is not None and (isinstance(version, bool) or len(str(version)) > 50):
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
    )
    if register:
        from kumiflow_django.registry import registry

        registry.register(workflow)
    return workflow
