"""The append/suspend race: a run that begins waiting while its event is being
appended in another transaction is still woken, whichever commits first, and
whatever positions the two transactions took.

Every interleaving is forced with handshakes (a transaction held open until
the test releases it), never with sleeps: on a slow machine a test either
exercises its race or fails, it cannot pass without it.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import transaction

from kumiflow_django import append_event, define_workflow, event_appended, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from tests.races import in_thread, wait_until_blocked_or_done

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]


def fresh(name: str) -> str:
    """A stream id no earlier test used. The flush after a transactional test
    deletes the events, and until InnoDB purges them, an insert of the same
    (stream_id, version) takes shared next-key locks on the unique index (its
    duplicate check, also under READ COMMITTED): the appender held open here
    would then block other transactions' inserts into the neighbouring gap."""
    return f"{name}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def waiter(registry):
    define_workflow(
        "waiter",
        steps=[
            s.wait_for_event("ping", match={"payload.key": lambda ctx: ctx.event.payload["key"]}),
            s.return_("woken"),
        ],
    )


def hold_after_insert(event_type: str) -> tuple[threading.Event, threading.Event]:
    """Keep the transaction that appends ``event_type`` open after its insert
    (and after the engine's in-transaction search) until ``release`` is set."""
    inserted, release = threading.Event(), threading.Event()

    def hold(sender, event, **kwargs):
        if event.type == event_type:
            inserted.set()
            assert release.wait(30), "the test never released the appender"

    event_appended.connect(hold, dispatch_uid="race-hold", weak=False)
    return inserted, release


@pytest.fixture(autouse=True)
def _disconnect():
    yield
    event_appended.disconnect(dispatch_uid="race-hold")


def test_the_run_suspends_and_commits_while_the_append_is_still_open(waiter):
    """The appender's in-transaction search runs before the run waits, and it
    commits after the run's own after-commit look-back: its after-commit check
    wakes the run."""
    inserted, release = hold_after_insert("ping")
    stream = fresh("p")
    appender, errors = in_thread(lambda: append_event(stream, "ping", {"key": 1}))
    assert inserted.wait(30)

    run = start_workflow("waiter", payload={"key": 1})  # commits while the append is open
    assert run.status == RunStatus.WAITING_EVENT
    release.set()
    appender.join(30)

    assert not errors
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, "woken")


def test_the_append_commits_while_the_suspension_is_still_open(waiter):
    """The run looked back before the event existed and commits after the
    append's checks: its own after-commit look-back wakes it."""
    suspended, release = threading.Event(), threading.Event()
    run_ids = []

    def suspend_and_hold():
        with transaction.atomic():
            run_ids.append(start_workflow("waiter", payload={"key": 2}).id)
            suspended.set()
            assert release.wait(30)

    starter, errors = in_thread(suspend_and_hold)
    assert suspended.wait(30)
    stream = fresh("p")
    appender, append_errors = in_thread(lambda: append_event(stream, "ping", {"key": 2}))
    # The append commits, or (MariaDB) its locking search waits for the
    # suspension's uncommitted row: either way it ran before the run commits.
    wait_until_blocked_or_done(appender)
    release.set()
    starter.join(30)
    appender.join(30)

    assert not errors and not append_errors
    run = WorkflowRun.objects.get(pk=run_ids[0])
    assert (run.status, run.result) == (RunStatus.COMPLETED, "woken")


@pytest.fixture
def checkout(registry):
    define_workflow(
        "checkout",
        trigger=on_event("order.placed"),
        steps=[
            s.wait_for_event(
                "payment.received",
                match={"payload.order": lambda ctx: ctx.event.payload["order"]},
                timeout="P1D",
                name="payment",
            ),
            s.return_(lambda ctx: ctx.steps["payment"]["payload"]),
        ],
    )


@pytest.mark.parametrize("order", ["run-commits-first", "payment-commits-first"])
def test_an_event_that_commits_late_with_a_smaller_position_is_found(checkout, order):
    """The payment takes its position before the order does, but commits after
    the run started (and, in one order, after it began to wait). Positions are
    taken at insert, not at commit: a run that looked back only above its
    start's position waited until its timeout."""
    inserted, release = hold_after_insert("payment.received")
    payment_stream, order_stream = fresh("payment-1"), fresh("order-7")
    payer, errors = in_thread(
        lambda: append_event(payment_stream, "payment.received", {"order": 7, "cents": 990})
    )
    assert inserted.wait(30)

    if order == "run-commits-first":
        append_event(order_stream, "order.placed", {"order": 7})  # the run starts and waits
        run = WorkflowRun.objects.get(workflow="checkout")
        assert run.status == RunStatus.WAITING_EVENT
        release.set()
    else:
        placed = threading.Event()

        def place_and_hold():
            with transaction.atomic():
                append_event(order_stream, "order.placed", {"order": 7})
                placed.set()
                assert release_order.wait(30)

        release_order = threading.Event()
        placer, place_errors = in_thread(place_and_hold)
        assert placed.wait(30)
        release.set()  # the payment commits while the run's start is still open
        payer.join(30)
        release_order.set()
        placer.join(30)
        assert not place_errors
    payer.join(30)

    assert not errors
    payment = Event.objects.get(type="payment.received")
    run = WorkflowRun.objects.get(workflow="checkout")
    assert payment.position < run.since_position, "the interleaving under test"
    assert (run.status, run.result) == (RunStatus.COMPLETED, {"order": 7, "cents": 990})
