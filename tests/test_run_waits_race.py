"""Races on a wait stored as a ``RunWait`` row, forced with handshakes:
two events for one wait (one wins), and a run that waits for the same event
type again right after it took one, while the next event is appended (its
row deleted and inserted in the taking transaction: the next event is not
lost, and the old row does not wake it twice)."""

from __future__ import annotations

import threading
import uuid

import pytest

from kumiflow_django import append_event, define_workflow, event_appended, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import Event, RunStatus, RunWait
from kumiflow_django.store import names as ev
from kumiflow_django.workers.resume import ResumeLoop
from tests.races import in_thread, wait_until_blocked_or_done

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]


def _key(ctx):
    return ctx.event.payload["key"]


@pytest.fixture
def twice(registry):
    define_workflow(
        "twice",
        steps=[
            s.wait_for_event("ping", match={"payload.key": _key}, name="first"),
            s.wait_for_event("ping", match={"payload.key": _key}, name="second"),
            s.return_(
                lambda ctx: [
                    ctx.steps["first"]["payload"]["n"],
                    ctx.steps["second"]["payload"]["n"],
                ]
            ),
        ],
    )


@pytest.fixture
def once(registry):
    define_workflow(
        "once",
        steps=[
            s.wait_for_event("ping", match={"payload.key": _key}, name="only"),
            s.return_(lambda ctx: ctx.steps["only"]["payload"]["n"]),
        ],
    )


@pytest.fixture
def hold_first_ping():
    """Keep the transaction that appends the ping ``n == 1`` open after its
    insert and the engine's in-transaction wake-up, until released."""
    inserted, release = threading.Event(), threading.Event()

    def hold(sender, event, **kwargs):
        if event.type == "ping" and event.payload.get("n") == 1:
            inserted.set()
            assert release.wait(30), "the test never released the appender"

    event_appended.connect(hold, dispatch_uid="run-waits-race", weak=False)
    yield inserted, release
    release.set()
    event_appended.disconnect(dispatch_uid="run-waits-race")


def _stream() -> str:
    return f"ping-{uuid.uuid4().hex[:12]}"


def test_the_next_event_appended_while_the_run_takes_one_and_waits_again_is_taken(
    twice, hold_first_ping
):
    inserted, release = hold_first_ping
    run = start_workflow("twice", payload={"key": 1})
    assert RunWait.objects.filter(run_id=run.id).count() == 1
    first, first_errors = in_thread(lambda: append_event(_stream(), "ping", {"key": 1, "n": 1}))
    assert inserted.wait(30)  # it took its event and waits again: uncommitted
    second, second_errors = in_thread(lambda: append_event(_stream(), "ping", {"key": 1, "n": 2}))
    # Its look-up read the old row and waits for the run's lock.
    assert wait_until_blocked_or_done(second) == "blocked"
    release.set()
    first.join(30)
    second.join(30)

    assert not first_errors and not second_errors
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, [1, 2])
    assert not RunWait.objects.exists()


def test_two_events_for_one_wait_wake_it_once(once, hold_first_ping):
    inserted, release = hold_first_ping
    run = start_workflow("once", payload={"key": 2})
    first, first_errors = in_thread(lambda: append_event(_stream(), "ping", {"key": 2, "n": 1}))
    assert inserted.wait(30)
    second, second_errors = in_thread(lambda: append_event(_stream(), "ping", {"key": 2, "n": 2}))
    assert wait_until_blocked_or_done(second) == "blocked"
    release.set()
    first.join(30)
    second.join(30)

    assert not first_errors and not second_errors
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, 1)
    resumed = Event.objects.filter(stream_id=str(run.id), type=ev.STEP_RESUMED)
    assert resumed.count() == 1
    assert not RunWait.objects.exists()


@pytest.fixture
def with_timeout(registry):
    define_workflow(
        "timed",
        steps=[
            s.wait_for_event("ping", match={"payload.key": _key}, timeout="PT1H", name="only"),
            s.return_(lambda ctx: ctx.steps["only"]),
        ],
    )


def test_a_timeout_due_while_its_event_is_being_taken_does_not_resume_the_run_again(
    with_timeout, hold_first_ping, clock
):
    inserted, release = hold_first_ping
    run = start_workflow("timed", payload={"key": 3})
    clock.advance(hours=2)  # the wait's timeout is due
    appender, append_errors = in_thread(lambda: append_event(_stream(), "ping", {"key": 3, "n": 1}))
    assert inserted.wait(30)  # the event took the wait: uncommitted
    loop, loop_errors = in_thread(lambda: ResumeLoop().run_once())
    # The loop skips the locked run, or waits for it.
    wait_until_blocked_or_done(loop)
    release.set()
    appender.join(30)
    loop.join(30)
    assert ResumeLoop().run_once() == 0

    assert not append_errors and not loop_errors
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert isinstance(run.result, dict)
    assert run.result["payload"] == {"key": 3, "n": 1}
    assert Event.objects.filter(stream_id=str(run.id), type=ev.STEP_RESUMED).count() == 1
    assert not RunWait.objects.exists()
