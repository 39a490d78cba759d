"""A compatible change under two processes resuming the same run at once:
one switch, one segment, no clash on the run's stream."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.engine.resuming import resume_run
from kumiflow_django.models import Event, RunStatus
from kumiflow_django.store import names as ev

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server_db]


def test_two_resumes_of_a_carried_on_run_switch_it_once(registry, clock):
    define_workflow("charge", steps=[s.wait("PT1M"), s.return_("old")])
    run = start_workflow("charge")
    registry.unregister("charge")
    define_workflow(
        "charge", steps=[s.wait("PT1M"), s.compute("x", lambda ctx: 1), s.return_("new")]
    )
    clock.advance(minutes=1)
    barrier = threading.Barrier(2)
    outcomes: list[object] = []
    lock = threading.Lock()

    def resumer() -> None:
        try:
            barrier.wait()
            # Both wait for the row lock: the second finds the run resumed.
            found = resume_run(run.id, skip_locked=False)
            result: object = found.status if found is not None else None
        except Exception as exc:  # a stream clash would surface here
            result = exc
        finally:
            connections.close_all()
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=resumer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes, key=str) == sorted([RunStatus.COMPLETED, None], key=str), outcomes
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, "new")
    stream = Event.objects.filter(stream_id=str(run.id))
    assert stream.filter(type=ev.DEFINITION_SWITCHED).count() == 1
    assert stream.filter(type=ev.STEP_RESUMED).count() == 1
    assert not stream.filter(type__in=[ev.RUN_FAILED, ev.SEGMENT_REFUSED]).exists()
