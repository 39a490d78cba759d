"""Bulk restart from a step: each matching run's own step, skipped with the
refusal of ``refuse_restart`` where it does not apply, audited, resumable,
and never a restart of a run the operation itself started."""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse

from kumiflow_django import InvalidEvent, bulk_runs, continue_bulk, define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.engine import bulk
from kumiflow_django.engine import restart as restarts
from kumiflow_django.models import BulkOperation, Event, RunStatus, WorkflowRun
from kumiflow_django.testing import run_until_idle

pytestmark = pytest.mark.django_db

RESTARTED = "kumiflow.workflow.run-restarted"


def _step_b(broken: dict[str, bool], ctx: Any) -> int:
    if broken["yes"] and ctx.event.payload["n"] % 2 == 0:
        raise RuntimeError("the partner API is down")
    return 1


@pytest.fixture
def failed(registry, clock):
    """Four runs of ``flaky`` failed at step 2 (their step 1, a wait, committed),
    two completed, and one still waiting."""
    broken = {"yes": True}
    define_workflow(
        "flaky",
        steps=[
            s.compute("a", lambda ctx: 20),
            s.wait("PT1H"),
            s.compute("b", lambda ctx: _step_b(broken, ctx)),
            s.return_(lambda ctx: ctx.steps["a"] + ctx.steps["b"]),
        ],
    )
    runs = [start_workflow("flaky", payload={"n": n}) for n in range(6)]
    clock.advance(hours=2)
    run_until_idle()
    waiting = start_workflow("flaky", payload={"n": 6})
    broken["yes"] = False
    clock.advance(seconds=1)
    return runs, waiting


def _restarts_of(run_id: uuid.UUID) -> int:
    return Event.objects.filter(stream_id=str(run_id), type=RESTARTED).count()


def test_bulk_restart_from_a_step_restarts_each_failed_run_once(failed, clock):
    runs, waiting = failed
    bad = [r for r in runs if WorkflowRun.objects.get(pk=r.pk).status == RunStatus.FAILED]
    assert len(bad) == 3
    operation = bulk_runs(
        "restart",
        filters={"workflow": "flaky", "status": "failed"},
        from_step="1",
        reason="partner fixed",
        by="ops",
        batch_size=2,
    )
    assert (operation.status, operation.total, operation.done, operation.skipped) == (
        "done",
        3,
        3,
        0,
    )
    assert operation.from_step == "1"
    for old in bad:
        marker = Event.objects.get(stream_id=str(old.id), type=RESTARTED)
        assert (marker.created_by, marker.payload["reason"], marker.payload["from_step"]) == (
            "ops",
            "partner fixed",
            "1",
        )
    clock.advance(hours=2)
    run_until_idle()
    new = WorkflowRun.objects.exclude(pk__in=[r.pk for r in [*runs, waiting]])
    assert [r.status for r in new] == [RunStatus.COMPLETED] * 3
    assert [r.result for r in new] == [21, 21, 21]


def test_runs_where_the_step_did_not_run_or_that_refuse_are_skipped_with_why(failed):
    operation = bulk_runs("restart", filters={"workflow": "flaky"}, from_step="2")
    # Failed at step 2: its segment was rolled back; completed: fine; waiting: refused.
    assert (operation.total, operation.done, operation.skipped, operation.errors) == (7, 3, 4, 0)
    reasons = operation.skipped_reasons
    assert sum(reasons.values()) == 4
    assert any("rolled back" in why and n == 3 for why, n in reasons.items()), reasons
    assert any("only failed, cancelled or completed" in why for why in reasons), reasons
    # The same refusal the single restart gives.
    waiting = WorkflowRun.objects.get(status=RunStatus.WAITING, workflow="flaky")
    assert restarts.refuse_restart(waiting, "2") in reasons


def test_the_runs_a_bulk_restart_starts_are_not_restarted_by_it(registry, clock, monkeypatch):
    """A restarted ``quick`` run completes at once, so it matches the filter;
    given ids that sort after every old run's, the cursor would reach them."""
    define_workflow("quick", steps=[s.compute("a", lambda ctx: 1), s.return_("done")])
    completed = [start_workflow("quick") for _ in range(3)]
    high = (uuid.UUID(f"ffffffff-ffff-4fff-bfff-{n:012x}") for n in itertools.count(1))

    class _Ids:
        UUID = uuid.UUID

        @staticmethod
        def uuid4() -> uuid.UUID:
            new = next(high)
            assert new.int & 0xFFFF <= 3, "a run the operation started was restarted"
            return new

    monkeypatch.setattr(restarts, "uuid", _Ids)
    clock.advance(seconds=1)
    operation = bulk_runs(
        "restart", filters={"workflow": "quick"}, from_step="0", batch_size=1, run=False
    )
    clock.advance(seconds=1)
    done = continue_bulk(operation.id)
    assert (done.total, done.done, done.skipped) == (3, 3, 0)
    assert WorkflowRun.objects.filter(workflow="quick", status=RunStatus.COMPLETED).count() == 6
    assert Event.objects.filter(type=RESTARTED).count() == 3
    assert [_restarts_of(r.pk) for r in completed] == [1, 1, 1]


@pytest.fixture
def quick(registry, clock):
    """Two completed ``quick`` runs, restartable from step 0."""
    define_workflow("quick", steps=[s.compute("a", lambda ctx: 1), s.return_("done")])
    return [start_workflow("quick") for _ in range(2)]


def _record_restart() -> BulkOperation:
    return bulk_runs("restart", filters={"workflow": "quick"}, from_step="0", run=False)


def test_a_run_started_after_the_restart_was_recorded_is_left_whatever_the_clock_says(quick, clock):
    """The worker's clock is an hour behind the web host's that recorded it."""
    operation = _record_restart()
    assert operation.log_position == Event.objects.last_position()
    clock.set(operation.created_at - timedelta(hours=1))
    late = start_workflow("quick")
    assert late.started_at < operation.created_at
    done = continue_bulk(operation.id)
    assert (done.total, done.done, done.skipped) == (2, 2, 0)
    assert [_restarts_of(r.pk) for r in quick] == [1, 1]
    assert _restarts_of(late.pk) == 0


def test_a_run_started_before_the_restart_was_recorded_is_taken_whatever_the_clock_says(
    quick, clock
):
    """The host that recorded it has a clock an hour behind the one the runs started by."""
    clock.set(quick[-1].started_at - timedelta(hours=1))
    operation = _record_restart()
    assert all(r.started_at > operation.created_at for r in quick)
    done = continue_bulk(operation.id)
    assert (done.total, done.done, done.skipped) == (2, 2, 0)
    assert [_restarts_of(r.pk) for r in quick] == [1, 1]


def test_a_restart_recorded_before_the_log_position_existed_compares_the_clocks(quick, clock):
    """An operation recorded before migration 0018 has no position: the runs
    started by the clock after it was recorded (its own restarts among them)
    are left, as that version did."""
    operation = _record_restart()
    BulkOperation.objects.filter(pk=operation.pk).update(log_position=None)
    clock.advance(seconds=1)
    late = start_workflow("quick")
    done = continue_bulk(operation.id)
    assert (done.log_position, done.total, done.done, done.skipped) == (None, 2, 2, 0)
    assert [_restarts_of(r.pk) for r in quick] == [1, 1]
    assert _restarts_of(late.pk) == 0
    assert Event.objects.filter(type=RESTARTED).count() == 2


class _Crash(Exception):
    pass


def test_an_interrupted_bulk_restart_continues_without_restarting_a_run_twice(failed, monkeypatch):
    refuse, operate = bulk.ACTIONS["restart"]
    calls = {"n": 0}

    def crashing(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise _Crash("the process died")
        return operate(*args, **kwargs)

    monkeypatch.setitem(bulk.ACTIONS, "restart", (refuse, crashing))
    filters = {"workflow": "flaky", "status": ["failed", "completed"]}
    with pytest.raises(_Crash):
        bulk_runs("restart", filters=filters, from_step="0", reason="again", batch_size=4)
    operation = BulkOperation.objects.get()
    assert (operation.status, operation.done) == ("running", 2)
    assert Event.objects.filter(type=RESTARTED).count() == 2
    done = continue_bulk(operation.id)
    assert (done.status, done.done, done.skipped, done.errors) == ("done", 6, 0, 0)
    old = WorkflowRun.objects.filter(pk__in=[r.pk for r in failed[0]])
    assert [_restarts_of(r.pk) for r in old] == [1] * 6


@pytest.mark.parametrize(
    ("action", "options", "error"),
    [
        ("restart", {}, "needs from_step"),
        ("restart", {"from_step": "two"}, "is not a step path"),
        ("restart", {"from_step": "1", "definition": "newest"}, "definition must be"),
        ("cancel", {"from_step": "1"}, "takes no from_step"),
    ],
)
def test_bulk_restart_options_are_checked(failed, action, options, error):
    with pytest.raises(InvalidEvent, match=error):
        bulk_runs(action, filters={}, **options)
    assert not BulkOperation.objects.exists()


def test_the_admin_restarts_selected_runs_from_a_step(admin_client, failed):
    bad = list(WorkflowRun.objects.filter(status=RunStatus.FAILED).order_by("pk"))
    url = reverse("admin:kumiflow_workflowrun_changelist")
    chosen = {"action": "restart_runs", "_selected_action": [str(bad[0].pk), str(bad[1].pk)]}
    page = admin_client.post(url, chosen).content.decode()
    assert "<strong>2</strong> runs match the selection" in page
    assert 'name="from_step"' in page
    response = admin_client.post(
        url,
        {**chosen, "confirm": "yes", "from_step": "1", "definition": "run", "reason": "fixed"},
        follow=True,
    )
    text = " ".join(str(m) for m in response.context["messages"])
    assert "2 of 2 matching runs restarted, 0 skipped" in text
    assert [_restarts_of(r.pk) for r in bad] == [1, 1, 0]
    operation = BulkOperation.objects.get()
    assert (operation.by, operation.reason, operation.from_step) == ("admin", "fixed", "1")


def test_the_admin_restarts_all_matching_runs_and_says_what_it_skipped(admin_client, failed):
    url = reverse("admin:kumiflow_workflowrun_changelist") + "?workflow=flaky"
    any_run = WorkflowRun.objects.first()
    assert any_run is not None
    chosen = {"action": "restart_runs", "select_across": "1", "_selected_action": [any_run.pk]}
    page = admin_client.post(url, chosen).content.decode()
    assert "<strong>7</strong> runs match this filter" in page
    bad_path = admin_client.post(url, {**chosen, "confirm": "yes", "from_step": "x"})
    assert "is not a step path" in bad_path.content.decode()
    assert not BulkOperation.objects.exists()
    response = admin_client.post(
        url, {**chosen, "confirm": "yes", "from_step": "2", "definition": "run"}, follow=True
    )
    text = " ".join(str(m) for m in response.context["messages"])
    assert "3 of 7 matching runs restarted, 4 skipped" in text
    assert "3 skipped: the run cannot restart at step 2" in text
