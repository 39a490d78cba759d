"""The shop's task functions: work its workflows run outside the transaction.

``render_invoice`` is what a shop would write. The probes below it are what
the tests of task steps run (tests/tasks/): each records its call as an
event of the stream ``task-calls-<key>``, with the attempt's number and
idempotency key, so that a test in another process can count the attempts.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import django
from django.conf import settings

from kumiflow_django import append_event, current_task

if TYPE_CHECKING or django.VERSION >= (6, 0):
    from django.tasks import task
else:  # Django 5.2: the django-tasks backport stands in
    from django_tasks import task


def render_invoice(order_id: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Render an order's invoice (a stand-in for a slow PDF renderer)."""
    total = sum(int(line["qty"]) * int(line["price_cents"]) for line in lines)
    return {"order_id": order_id, "total_cents": total, "pages": 1 + len(lines) // 30}


# -- probes of the tests -------------------------------------------------------

#: In-process handshakes: a probe waits for ``release[name]`` and sets ``started[name]``.
started: dict[str, threading.Event] = {}
release: dict[str, threading.Event] = {}


def _event(table: dict[str, threading.Event], name: str) -> threading.Event:
    return table.setdefault(name, threading.Event())


def _record(key: str, **more: Any) -> None:
    ctx = current_task()
    append_event(
        stream_id=f"task-calls-{key}",
        type="task.called",
        payload={
            "attempt": ctx.attempt,
            "idempotency_key": ctx.idempotency_key,
            "run_id": str(ctx.run_id),
            "step": ctx.step,
            "pid": os.getpid(),
            **more,
        },
    )


def double(n: int) -> int:
    return n * 2


def held_then(key: str, value: Any) -> Any:
    """Record the call, signal that it runs, wait until released, return ``value``."""
    _record(key)
    _event(started, key).set()
    _event(release, key).wait(60)
    return value


def slow_first(key: str, value: Any) -> Any:
    """Attempt 1 blocks until released (it outlives its timeout); later ones return at once."""
    _record(key)
    if current_task().attempt == 1:
        _event(started, key).set()
        _event(release, key).wait(60)
        return "late"
    return value


def heartbeating(key: str, seconds: float, every: float) -> str:
    """Work for ``seconds``, sending a heartbeat every ``every`` seconds."""
    _record(key)
    ends = time.monotonic() + seconds
    beats = 0
    while time.monotonic() < ends:
        time.sleep(every)
        beats += 1
        if not current_task().heartbeat({"beats": beats}):
            return "given up"
    return f"done after {beats} heartbeats"


def until_cancelled(key: str) -> str:
    """Run until the attempt is cancelled (or released); say what it saw."""
    _record(key)
    _event(started, key).set()
    ends = time.monotonic() + 60
    while time.monotonic() < ends and not _event(release, key).is_set():
        if current_task().cancelled:
            _record(key, saw="cancelled")
            return "stopped"
        time.sleep(0.02)
    return "finished"


def marker_then_sleep(key: str, marker: str, seconds: float) -> str:
    """Attempt 1 writes ``marker`` (a file the test waits for), then sleeps (to be
    killed); later attempts return at once."""
    _record(key)
    if current_task().attempt == 1:
        Path(marker).write_text(str(os.getpid()))
        time.sleep(seconds)
    return f"attempt {current_task().attempt}"


def fails(key: str, times: int) -> str:
    """Fail the first ``times`` attempts (counted in the log), then succeed."""
    _record(key)
    if current_task().attempt <= times:
        raise RuntimeError(f"attempt {current_task().attempt} failed on purpose")
    return "succeeded"


def fails_until_fixed(flag: str) -> str:
    """Fail while the file ``flag`` does not exist (an outage an operator fixes)."""
    if not Path(flag).exists():
        raise ConnectionError("the service is down")
    return "fixed"


def bad_value() -> None:
    raise ValueError("this input can never work")


def unstorable() -> object:
    return {"not": object()}


def too_large(size: int) -> str:
    return "x" * size


# Django Tasks: the same function on the immediate backend, django-tasks-db and
# RQ (those two where their packages are installed: see the settings' TASKS).


@task(backend="default")
def double_immediate(n: int) -> int:
    return n * 2


@task(takes_context=True)
def with_django_context(context: Any, n: int) -> int:
    """A Django task that takes Django's task context: a task step refuses it."""
    return n


if "db" in settings.TASKS:

    @task(backend="db")
    def double_db(n: int) -> int:
        return n * 2


if "rq" in settings.TASKS:

    @task(backend="rq")
    def double_rq(n: int) -> int:
        return n * 2


def limited_call(log: str, key: str) -> str:
    """A call to an API that allows few calls at once: logs when it ran."""
    start = time.time()
    time.sleep(0.05)
    with open(log, "a") as f:
        f.write(f"{key} {current_task().task_id} {start!r} {time.time()!r}\n")
    return key
