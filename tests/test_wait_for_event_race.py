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


@pytest.fixture
def ticks(registry):
    """A run that takes two events of one type, one after the other."""
    define_workflow(
        "ticks",
        steps=[
            s.wait_for_event("go", match={"payload.key": 1}),
            s.wait_for_event("tick", match={"payload.key": 1}, name="first"),
            s.wait_for_event("tick", match={"payload.key": 1}, name="second"),
            s.return_(
                lambda ctx: [ctx.steps["first"]["stream_id"], ctx.steps["second"]["stream_id"]]
            ),
        ],
    )


def hold_marked(event_type: str) -> tuple[threading.Event, threading.Event]:
    """Hold open only the append of ``event_type`` whose payload says ``held``."""
    inserted, release = threading.Event(), threading.Event()

    def hold(sender, event, **kwargs):
        if event.type == event_type and event.payload.get("held"):
            inserted.set()
            assert release.wait(30), "the test never released the appender"

    event_appended.connect(hold, dispatch_uid="race-hold", weak=False)
    return inserted, release


def test_a_later_wait_finds_an_event_that_commits_below_the_one_an_earlier_wait_took(ticks):
    """The first tick wait takes a tick inserted after another one that is
    still in flight; the second wait then looks back above the taken one. The
    late tick, committed below that cut-off, is found: it was a gap of the
    first wait's take (it waited forever before)."""
    run = start_workflow("ticks")
    late = fresh("late")
    inserted, release = hold_marked("tick")
    ticker, errors = in_thread(lambda: append_event(late, "tick", {"key": 1, "held": True}))
    assert inserted.wait(30)
    append_event(fresh("go"), "go", {"key": 1})
    early = fresh("early")
    append_event(early, "tick", {"key": 1})  # committed first, taken by the first wait
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_EVENT
    release.set()
    ticker.join(30)
    assert not errors
    late_tick = Event.objects.get(stream_id=late)
    assert late_tick.position < Event.objects.get(stream_id=early).position, "the interleaving"
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, [early, late])


def test_an_event_taken_at_a_gap_of_the_start_is_not_taken_twice(registry):
    """A run starts while an event it awaits is in flight (a gap of its start);
    the first wait takes it once it commits. The second wait must wait for
    another event, not take the same one again."""
    define_workflow(
        "twice",
        steps=[
            s.wait_for_event("tick", match={"payload.key": 1}, name="first"),
            s.wait_for_event("tick", match={"payload.key": 1}, name="second"),
            s.return_(
                lambda ctx: [ctx.steps["first"]["stream_id"], ctx.steps["second"]["stream_id"]]
            ),
        ],
    )
    inserted, release = hold_marked("tick")
    late = fresh("late")
    ticker, errors = in_thread(lambda: append_event(late, "tick", {"key": 1, "held": True}))
    assert inserted.wait(30)
    run = start_workflow("twice")  # its start's gaps hold the tick in flight
    assert run.status == RunStatus.WAITING_EVENT
    release.set()
    ticker.join(30)
    assert not errors
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_EVENT, "the same tick was taken by both waits"
    other = fresh("other")
    append_event(other, "tick", {"key": 1})
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, [late, other])


def test_in_a_branch_a_later_wait_finds_an_event_that_commits_below_the_taken_one(registry):
    """The same interleaving inside a parallel branch, whose waits the run's
    RunWait rows index: their gaps wake the branch too."""
    define_workflow(
        "branch-ticks",
        steps=[
            s.parallel(
                "both",
                {
                    "ticks": [
                        s.wait_for_event("go", match={"payload.key": 1}),
                        s.wait_for_event("tick", match={"payload.key": 1}, name="first"),
                        s.wait_for_event("tick", match={"payload.key": 1}, name="second"),
                        s.compute(
                            "pair",
                            lambda ctx: [
                                ctx.steps["first"]["stream_id"],
                                ctx.steps["second"]["stream_id"],
                            ],
                        ),
                    ],
                    "idle": [s.wait("PT1H")],
                },
                join="any",
            ),
            s.return_(lambda ctx: ctx.steps["both"]["ticks"]),
        ],
    )
    run = start_workflow("branch-ticks")
    late = fresh("late")
    inserted, release = hold_marked("tick")
    ticker, errors = in_thread(lambda: append_event(late, "tick", {"key": 1, "held": True}))
    assert inserted.wait(30)
    append_event(fresh("go"), "go", {"key": 1})
    early = fresh("early")
    append_event(early, "tick", {"key": 1})
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    release.set()
    ticker.join(30)
    assert not errors
    assert Event.objects.get(stream_id=late).position < Event.objects.get(stream_id=early).position
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, [early, late])


def test_a_trigger_erased_while_the_wake_waits_for_the_runs_lock_is_not_used(registry):
    """The wake-up finds the run, then waits for its lock; the run's trigger
    stream is erased meanwhile. The trigger is read under the lock: the run
    fails with trigger_event_unavailable and the erased payload is in no row
    (a look-up that read the trigger before the lock resumed it with it)."""
    from kumiflow_django import erase_stream

    order = fresh("order")
    define_workflow(
        "erased-order",
        trigger=on_event("order.placed"),
        steps=[
            s.wait_for_event(
                "payment.received",
                match={"payload.order_id": lambda ctx: ctx.event.payload["order_id"]},
            ),
            s.return_(lambda ctx: {"secret": ctx.event.payload.get("secret")}),
        ],
    )
    append_event(order, "order.placed", {"order_id": order, "secret": "PII"})
    run = WorkflowRun.objects.get(workflow="erased-order")
    assert run.status == RunStatus.WAITING_EVENT
    locked, release = threading.Event(), threading.Event()

    def hold_the_run() -> None:
        with transaction.atomic():
            WorkflowRun.objects.select_for_update().get(pk=run.pk)
            locked.set()
            assert release.wait(30), "the test never released the run"

    holder, held_errors = in_thread(hold_the_run)
    assert locked.wait(30)
    appender, errors = in_thread(
        lambda: append_event(fresh("pay"), "payment.received", {"order_id": order})
    )
    assert wait_until_blocked_or_done(appender) == "blocked"
    assert erase_stream(order) == 1  # committed while the wake-up waits for the lock
    release.set()
    holder.join(30)
    appender.join(30)
    assert not held_errors and not errors, (held_errors, errors)
    run.refresh_from_db()
    assert (run.status, run.reason) == (RunStatus.FAILED, "trigger_event_unavailable")
    assert run.result != {"secret": "PII"}
