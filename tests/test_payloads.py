"""The payload types of ``store/payloads.py`` are what the engine writes.

The scenarios of tests/test_run_columns.py, a parallel step whose branches
wait, and a mail dispatch write most kinds of engine event; every stored
engine event must have its type's required keys and no key its type does
not name (a producer that drifts from its ``TypedDict`` fails here, also
where mypy cannot see it: a payload built as a plain dict).
"""

from __future__ import annotations

from typing import Any

import pytest

from kumiflow_django import (
    append_event,
    current_task,
    define_workflow,
    on_cron,
    on_event,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl
from kumiflow_django.store.models import Event
from kumiflow_django.testing import run_until_idle
from tests.test_run_columns import scenarios

pytestmark = pytest.mark.django_db


def flaky_task(n: int) -> int:
    """Fails its first attempt (a task function: importable for the pool)."""
    if current_task().attempt == 1:
        raise ConnectionError("the service is down")
    return n


def _fits(payload: dict[str, Any], typed: Any, where: str) -> list[str]:
    """What does not fit, nested TypedDicts included."""
    hints = typed.__annotations__
    problems = []
    missing = set(typed.__required_keys__) - set(payload)
    extra = set(payload) - set(hints)
    if missing:
        problems.append(f"{where}: missing {sorted(missing)}")
    if extra:
        problems.append(f"{where}: not in {typed.__name__}: {sorted(extra)}")
    return problems


NESTED = {
    (ev.RUN_STARTED, "trigger"): pl.TriggerRef,
    (ev.RUN_STARTED, "parent"): pl.ParentRef,
    (ev.RUN_STARTED, "flow"): pl.FlowRef,
    (ev.STEP_RESUMED, "event"): pl.EventRef,
    (ev.STEP_RESUMED, "recovered"): pl.Recovered,
    (ev.EVENT_MATCHED, "event"): pl.EventRef,
    (ev.RUN_RETRIED, "restore"): pl.Restore,
    (ev.RUN_DEBOUNCED, "trigger"): pl.TriggerRef,
}


def test_every_engine_event_stored_fits_its_payload_type(registry, clock):
    scenarios(clock, registry)
    define_workflow(
        "checkout",
        trigger=on_event("cart.placed"),
        steps=[
            s.parallel(
                "done",
                {
                    "stock": [s.wait("PT1H")],
                    "payment": [
                        s.wait_for_event(
                            "payment.authorised",
                            match={"payload.order": lambda ctx: ctx.event.payload["order"]},
                            name="paid",
                        )
                    ],
                },
            ),
            s.mail_send(to="ada@example.com", subject="Hello", body="paid"),
        ],
    )
    append_event("cart-9", "cart.placed", {"order": 9})
    append_event("payment-9", "payment.authorised", {"order": 9})
    clock.advance(hours=1)
    run_until_idle()
    # a retried step, a task attempt that fails, a refused webhook, a schedule
    tries = {"n": 0}

    def twice(ctx: Any) -> int:
        tries["n"] += 1
        if tries["n"] == 1:
            raise RuntimeError("once")
        return tries["n"]

    define_workflow(
        "mixed",
        steps=[
            s.retry([s.call("twice", twice)], attempts=2, base=1),
            s.task("synced", flaky_task, args=[7], retry=2),
            s.webhook_send("http://127.0.0.1:1/hook", body={"a": 1}),
        ],
    )
    start_workflow("mixed")
    for _ in range(3):
        clock.advance(minutes=1)
        run_until_idle()
    define_workflow("nightly", trigger=on_cron("* * * * *"), steps=[s.return_(1)])
    for _ in range(2):
        clock.advance(minutes=1)
        run_until_idle()

    problems: list[str] = []
    seen = set()
    for event in Event.objects.filter(type__startswith="kumiflow.").order_by("position"):
        typed = pl.PAYLOADS[event.type]
        seen.add(event.type)
        where = f"{event.type} v{event.version}"
        problems += _fits(event.payload, typed, where)
        for (type_, key), part in NESTED.items():
            if event.type == type_ and isinstance(event.payload.get(key), dict):
                problems += _fits(event.payload[key], part, f"{where} {key}")
        for wait in (
            event.payload.get("waits") or () if event.type == ev.STEP_WAITING_BRANCHES else ()
        ):
            problems += _fits(wait, pl.BranchWait, f"{where} waits")
    assert problems == []
    # the scenarios write most kinds (not: refusals, debounce, operators'
    # actions on dispatches, tasks and schedules)
    assert {
        ev.STEP_WAITING_BRANCHES,
        ev.DISPATCH_REQUESTED,
        ev.DISPATCHED,
        ev.TASK_COMPLETED,
        ev.RUN_RETRIED,
        ev.COMPENSATION_STARTED,
        ev.CHILD_SETTLED,
        ev.RUN_ADMITTED,
        ev.DEFINITION_SWITCHED,
        ev.RETRY_SCHEDULED,
        ev.TASK_ATTEMPT_FAILED,
        ev.DISPATCH_FAILED,
        ev.CRON_REGISTERED,
        ev.CRON_FIRED,
    } <= seen, sorted(set(pl.PAYLOADS) - seen)


def test_every_engine_event_type_has_a_payload_type():
    engine = ev.RUN_EVENTS | ev.DISPATCH_EVENTS | ev.TASK_EVENTS | ev.CRON_EVENTS | ev.PAUSE_EVENTS
    assert set(pl.PAYLOADS) == engine
