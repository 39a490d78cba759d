"""Two people decide one approval at once: one decision wins, the other is refused.

The first decision's transaction is held open after its append (the run's
row locked); the second waits for that lock, as the database reports, then
finds the run no longer waiting at the approval. Ordered by handshakes and
the server's lock views, never by sleeping.
"""

from __future__ import annotations

import threading

import pytest

from kumiflow_django import (
    InvalidRunState,
    decide_approval,
    define_workflow,
    event_appended,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.models import Event, RunStatus
from kumiflow_django.store import names as ev
from tests.races import in_thread, wait_until_blocked_or_done

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _disconnect():
    yield
    event_appended.disconnect(dispatch_uid="approval-hold")


def test_a_second_decision_waits_for_the_first_and_is_refused(registry):
    define_workflow(
        "race-approval",
        steps=[s.approval("manager"), s.return_(lambda ctx: ctx.steps["manager"]["payload"])],
    )
    run = start_workflow("race-approval")
    inserted, release = threading.Event(), threading.Event()

    def hold(sender, event, **kwargs):
        if event.type == ev.APPROVAL_DECIDED and event.created_by == "alice":
            inserted.set()
            assert release.wait(30), "the test never released the first decision"

    event_appended.connect(hold, dispatch_uid="approval-hold", weak=False)
    first, first_errors = in_thread(lambda: decide_approval(run.id, "approve", by="alice"))
    assert inserted.wait(30)
    outcome: list[object] = []
    second, second_errors = in_thread(
        lambda: outcome.append(decide_approval(run.id, "decline", by="bob"))
    )
    try:
        assert wait_until_blocked_or_done(second) == "blocked"
    finally:
        release.set()
    first.join(30)
    second.join(30)

    assert not first_errors
    assert not outcome
    assert len(second_errors) == 1 and isinstance(second_errors[0], InvalidRunState)
    decisions = Event.objects.filter(stream_id=str(run.id), type=ev.APPROVAL_DECIDED)
    assert [e.created_by for e in decisions] == ["alice"]
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert (run.result or {})["choice"] == "approve"
