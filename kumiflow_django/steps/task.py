"""``task``: work outside the transaction, run after the segment commits.

A ``call`` runs inside the segment's transaction: right for database work,
wrong for a card payment, a carrier's API, a PDF. A task step records a
request in the segment (a ``step-task`` stream) and suspends the run; after
commit the function runs on kumiflow's task pool (``kumiflow_worker`` or
``kumiflow_tasks``), or on the Django Tasks backend a ``Task`` names. Its
JSON result, recorded by a transaction of its own that accepts only the
current attempt, wakes the run: the step's result is the function's.

At least once: an attempt that fails, times out, or whose worker dies is
attempted again by the retry policy, always with the same idempotency key
(``current_task().idempotency_key``, the task's id).
"""

from __future__ import annotations

import importlib
import inspect
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from kumiflow_django.definition.backoff import BackoffPolicy
from kumiflow_django.definition.context import Context, TaskRequest, WakeReason
from kumiflow_django.definition.durations import parse_duration
from kumiflow_django.definition.flow import Limit, Rate, resolve_key
from kumiflow_django.definition.matching import correlation_key
from kumiflow_django.definition.step import (
    Resolver,
    Step,
    StepKind,
    check_resolver,
    compensated,
    path_text,
    register_step_kind,
    resolve,
)
from kumiflow_django.steps.control import EventWait, Suspend
from kumiflow_django.store import errors, limits
from kumiflow_django.store import names as ev
from kumiflow_django.store.deprecation import moved_names
from kumiflow_django.store.errors import InvalidEvent
from kumiflow_django.store.values import clean_text, to_json

ON_ERROR = ("fail", "result")
#: The retry policy of a task step that names none.
DEFAULT_RETRY: dict[str, Any] = {
    "attempts": 3,
    "backoff": "exponential",
    "base": 2.0,
    "max_delay": 300.0,
    "jitter": 0.1,
}
DEFAULT_TIMEOUT = 300.0


def django_task_classes() -> tuple[type[Any], ...]:
    """The ``Task`` classes of Django's Tasks framework that can be imported here:
    ``django.tasks.Task`` (Django 6.0+) and the backport's ``django_tasks.base.Task``."""
    classes: list[type[Any]] = []
    for module, name in (("django.tasks", "Task"), ("django_tasks.base", "Task")):
        try:
            classes.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(classes)


def function_path(fn: Any) -> str:
    """The dotted path a worker imports ``fn`` by; ValueError when there is none
    (a lambda, a closure, a bound method, a callable object)."""
    if inspect.ismethod(fn):
        raise ValueError(
            f"a task's function must be importable by its dotted path, not a bound method ({fn!r})"
        )
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not (inspect.isfunction(fn) or inspect.isbuiltin(fn)) or not module or not qualname:
        raise ValueError(f"a task's function must be a plain importable function, not {fn!r}")
    if "<" in qualname:
        raise ValueError(
            f"a task's function must be importable by its dotted path: {qualname!r} is a "
            "lambda or a function defined inside another one"
        )
    path = f"{module}.{qualname}"
    try:
        found = import_function(path)  # a function decorated with ``@task``: its function
    except (ImportError, AttributeError, TypeError) as exc:
        raise ValueError(f"{path} does not import ({exc})") from exc
    if found is not fn:
        raise ValueError(f"{path} does not import as this function")
    if len(path) > limits.TASK_FUNCTION:
        raise ValueError(f"a task's function path is longer than {limits.TASK_FUNCTION} characters")
    return path


def import_function(path: str) -> Callable[..., Any]:
    """The function at ``module.qualname`` (the module is the longest importable
    prefix); a Django ``Task`` there gives its function."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            target = getattr(target, name)
        if isinstance(target, django_task_classes()):
            target = target.func
        if not callable(target):
            raise TypeError(f"{path} is not callable")
        return target  # type: ignore[no-any-return]
    raise ImportError(f"cannot import {path}")


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        seconds = parse_duration(value).total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError(f"{what} must be seconds, a timedelta or an ISO 8601 duration: {value!r}")
    if not 0 < seconds <= 7 * 24 * 3600:
        raise ValueError(f"{what} must be between 0 and 7 days: {value!r}")
    return seconds


def _policy(retry: Any) -> BackoffPolicy:
    if retry is None:
        return BackoffPolicy.from_mapping(DEFAULT_RETRY)
    if isinstance(retry, BackoffPolicy):
        return retry
    if isinstance(retry, int) and not isinstance(retry, bool):
        return BackoffPolicy.from_mapping(DEFAULT_RETRY | {"attempts": retry})
    if isinstance(retry, Mapping):
        return BackoffPolicy.from_mapping(DEFAULT_RETRY | dict(retry))
    raise ValueError(f"retry must be a number of attempts or a policy mapping, not {retry!r}")


class TaskKind(StepKind):
    kind = "task"
    resolver_args = ("args",)
    suspends = True

    def validate(self, step: Step) -> None:
        super().validate(step)
        if not step.name:
            raise ValueError("a task step needs a name for its result")
        target = step.args["fn"]
        if isinstance(target, django_task_classes()):
            if target.takes_context:
                raise ValueError(
                    "a task step runs its Task's function itself: takes_context=True is not "
                    "supported (call kumiflow_django.current_task() inside the function)"
                )
            function_path(target.func)
        else:
            function_path(target)
        _seconds(step.args["timeout"], "timeout")
        if step.args["heartbeat_timeout"] is not None:
            _seconds(step.args["heartbeat_timeout"], "heartbeat_timeout")
        _policy(step.args["retry"])
        for exc in step.args["non_retryable"]:
            if not (isinstance(exc, type) and issubclass(exc, BaseException)):
                raise ValueError(f"non_retryable must name exception classes, not {exc!r}")
        if step.args["on_error"] not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, not {step.args['on_error']!r}")
        queue = step.args["queue"]
        if queue is not None and (not isinstance(queue, str) or not 0 < len(queue) <= 100):
            raise ValueError(f"queue must be a name of 1 to 100 characters, not {queue!r}")
        check_resolver(step.args["args"], "args")
        limit, rate = step.args.get("concurrency"), step.args.get("rate")
        if limit is not None:
            if not isinstance(limit, Limit):
                raise ValueError(f"concurrency must be a Limit(key=..., max=...), not {limit!r}")
            limit.validate("concurrency")
        if rate is not None:
            if not isinstance(rate, Rate):
                raise ValueError(f"rate must be a Rate(key=..., limit=..., per=...), not {rate!r}")
            rate.validate("rate")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        if resume is not None:
            return _outcome(step, ctx)
        a = step.args
        target = a["fn"]
        backend, queue, priority = "", a["queue"] or "default", 0
        if isinstance(target, django_task_classes()):
            backend = target.backend
            queue = a["queue"] or target.queue_name
            priority = target.priority
            function = function_path(target.func)
        else:
            function = function_path(target)
        task_id = uuid.uuid4()
        problem = None
        try:
            args = to_json(resolve(a["args"], ctx), f"the arguments of task {step.name!r}")
            if args is not None and not isinstance(args, list | dict):
                raise InvalidEvent(f"the arguments of task {step.name!r} must be a list or a dict")
        except InvalidEvent as exc:
            args, problem = None, str(exc)
        flow = None
        if problem is None:
            try:
                flow = _flow(step, ctx)
            except Exception as exc:  # a key resolver: the task fails with the reason
                problem = clean_text(f"{type(exc).__name__} resolving a flow key: {exc}", 600)
        ctx.effects.append(
            TaskRequest(
                id=task_id,
                step=path_text(path),
                name=step.name or "",
                function=function,
                args=args,
                backend=backend,
                queue=queue,
                priority=priority,
                timeout=_seconds(a["timeout"], "timeout"),
                heartbeat_timeout=(
                    None
                    if a["heartbeat_timeout"] is None
                    else _seconds(a["heartbeat_timeout"], "heartbeat_timeout")
                ),
                retry=_policy(a["retry"]).as_dict(),
                non_retryable=tuple(
                    f"{exc.__module__}.{exc.__qualname__}" for exc in a["non_retryable"]
                ),
                problem=problem,
                flow=flow,
            )
        )
        match = {"stream_id": str(task_id)}
        wait = EventWait(
            event_type=ev.TASK_SETTLED,
            match=match,
            correlation_key=correlation_key(match),
            timeout_at=None,
            after=ctx.since_position,
        )
        raise Suspend(wait, path)

    def describe(self, step: Step) -> str:
        target = step.args["fn"]
        func = getattr(target, "func", target)
        return f"task {getattr(func, '__qualname__', 'function')}"


def _flow(step: Step, ctx: Context) -> dict[str, Any] | None:
    """The attempts' limits, resolved against the context (stored on the task)."""
    limit, rate = step.args.get("concurrency"), step.args.get("rate")
    if limit is None and rate is None:
        return None
    default_scope = f"{ctx.run.workflow}/{step.name}"
    flow: dict[str, Any] = {}
    if limit is not None:
        flow["scope"] = limit.scope or default_scope
        flow["key"] = resolve_key(limit.key, ctx, "the concurrency key")
        flow["max"] = limit.max
    if rate is not None:
        flow["rate"] = {
            "scope": rate.scope or default_scope,
            "key": resolve_key(rate.key, ctx, "the rate key"),
            "limit": rate.limit,
            "per": rate.per,
        }
    return flow


def _outcome(step: Step, ctx: Context) -> Any:
    """The step's result once its task settled: the function's value, or the failure."""
    event = ctx.wake.event if ctx.wake is not None else None
    if ctx.wake is None or ctx.wake.reason != WakeReason.EVENT or event is None:
        raise errors.TaskFailed(f"task {step.name!r} woke without its outcome")
    p = event.payload
    wrap = step.args["on_error"] == "result"
    if event.type == ev.TASK_COMPLETED:
        return {"ok": True, "result": p.get("result")} if wrap else p.get("result")
    if wrap:
        return {
            "ok": False,
            "error": p.get("error", ""),
            "error_type": p.get("error_type", ""),
            "traceback": p.get("traceback", ""),
            "attempts": p.get("attempt", 0),
        }
    tail = (p.get("traceback") or "").strip().splitlines()[-6:]
    raise errors.TaskFailed(
        f"task {step.name!r} failed after {p.get('attempt', 0)} attempt(s): "
        f"{p.get('error_type') or 'Error'}: {p.get('error', '')}"
        + ("\n" + "\n".join(tail) if tail else "")
    )


def task(
    name: str,
    fn: Any,
    *,
    args: Resolver = None,
    timeout: float | timedelta | str = DEFAULT_TIMEOUT,
    heartbeat_timeout: float | timedelta | str | None = None,
    retry: Mapping[str, Any] | BackoffPolicy | int | None = None,
    non_retryable: tuple[type[BaseException], ...] = (),
    queue: str | None = None,
    on_error: str = "fail",
    compensate: Sequence[Step] | None = None,
    concurrency: Limit | None = None,
    rate: Rate | None = None,
) -> Step:
    """Run ``fn`` outside the transaction; its JSON return value is the step's result.

    ``fn`` is an importable function (kumiflow's task pool runs it) or a
    Django Tasks ``Task`` (enqueued to its backend and queue). ``args``
    resolves to a list (positional) or a dict (keyword arguments). Each
    attempt may take ``timeout``; with ``heartbeat_timeout`` it must call
    ``current_task().heartbeat()`` at least that often. ``retry`` is the
    backoff policy (default: 3 attempts, 2 s exponential); exceptions in
    ``non_retryable`` fail the task at once. ``on_error="result"`` gives the
    step ``{"ok": ..., ...}`` instead of failing the run.
    ``concurrency=Limit(key=..., max=N)`` bounds the attempts in flight per
    key, ``rate=Rate(...)`` the attempts started per window, across every
    worker and backend (keys are functions of the context, or strings; the
    scope defaults to ``workflow/step name``).
    """
    step = Step(
        "task",
        name,
        {
            "fn": fn,
            "args": args,
            "timeout": timeout,
            "heartbeat_timeout": heartbeat_timeout,
            "retry": dict(retry) if isinstance(retry, Mapping) else retry,
            "non_retryable": tuple(non_retryable),
            "queue": queue,
            "on_error": on_error,
            "concurrency": concurrency,
            "rate": rate,
        },
    )
    return compensated(step, compensate)


register_step_kind(TaskKind())


__getattr__ = moved_names(__name__, {"TaskFailed": "kumiflow_django"})
