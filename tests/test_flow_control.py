"""Flow control on one worker: concurrency limits per key, rates, priorities,
debounce and throttle, fair share between tenants, operator overrides, and
the definitions that are refused. (Four worker processes on the server
databases: tests/test_flow_control_workers.py.)"""

from __future__ import annotations

from datetime import timedelta

import pytest

from kumiflow_django import (
    Limit,
    Rate,
    append_event,
    cancel_run,
    define_workflow,
    on_event,
    set_flow_limit,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.flow.models import FlowKey, RateBucket
from kumiflow_django.models import RunStatus, StepTask, TaskStatus, WorkflowRun
from kumiflow_django.store import clock as the_clock
from kumiflow_django.store import names as ev
from kumiflow_django.store.errors import InvalidEvent, KumiflowError, WorkflowDefinitionError
from kumiflow_django.store.models import Event
from kumiflow_django.tasks import attempts
from kumiflow_django.testing import run_until_idle
from kumiflow_django.workers.resume import ResumeLoop

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def every_active_limited_item_has_its_key_row(registry):
    """After each test, its workflows still defined: the invariant admission
    counts by (flow.admission.violations)."""
    from kumiflow_django.flow.admission import violations

    yield
    assert violations() == []


def reload(run):
    return WorkflowRun.objects.get(pk=run.pk)


def statuses(runs):
    return [reload(r).status for r in runs]


def active(workflow):
    return WorkflowRun.objects.filter(
        workflow=workflow, status__in=["pending", "running", "waiting", "waiting_event"]
    ).count()


@pytest.fixture
def one_per_customer(registry):
    return define_workflow(
        "sync-customer",
        concurrency=Limit(key=lambda event: event.payload["customer"], max=1),
        steps=[s.wait("PT1H"), s.return_(lambda ctx: ctx.event.payload["n"])],
    )


# -- concurrency ---------------------------------------------------------------


def test_one_run_per_key_at_a_time_the_others_queue_in_order(one_per_customer, clock):
    runs = [start_workflow("sync-customer", payload={"customer": "c1", "n": n}) for n in range(3)]
    other = start_workflow("sync-customer", payload={"customer": "c2", "n": 9})
    assert statuses(runs) == ["waiting", "queued", "queued"]
    assert reload(other).status == "waiting"  # another key is not held
    queued = reload(runs[1])
    assert (queued.flow_scope, queued.flow_key, queued.held_by) == (
        "sync-customer",
        "c1",
        "concurrency",
    )
    assert queued.wake_at is None  # parked: the end of the active run wakes it

    clock.advance(hours=1)
    run_until_idle()
    assert statuses(runs) == ["completed", "waiting", "queued"]  # admitted in order
    clock.advance(hours=1)
    run_until_idle()
    assert statuses(runs) == ["completed", "completed", "waiting"]
    clock.advance(hours=1)
    run_until_idle()
    assert [reload(r).result for r in runs] == [0, 1, 2]
    types = Event.objects.filter(stream_id=str(runs[1].pk)).values_list("type", flat=True)
    assert ev.RUN_ADMITTED in types


def test_cancelling_the_active_run_admits_the_next_and_a_queued_one_can_be_cancelled(
    one_per_customer, clock
):
    first, second, third = (
        start_workflow("sync-customer", payload={"customer": "c1", "n": n}) for n in range(3)
    )
    cancel_run(second.pk, reason="not needed")
    assert reload(second).status == "cancelled"
    cancel_run(first.pk)
    run_until_idle()
    assert statuses([first, second, third]) == ["cancelled", "cancelled", "waiting"]


def test_a_key_resolver_that_raises_fails_that_start_only(registry):
    define_workflow(
        "keyed",
        concurrency=Limit(key=lambda event: event.payload["customer"], max=1),
        steps=[s.return_(1)],
    )
    broken = start_workflow("keyed", payload={})
    assert (broken.status, broken.reason) == ("failed", ev.FLOW_KEY_FAILED)
    assert "KeyError" in broken.last_error
    fine = start_workflow("keyed", payload={"customer": "c"})
    assert fine.status == "completed"


def test_a_key_that_is_not_a_short_string_fails_the_start_with_its_reason(registry):
    define_workflow(
        "long-key",
        concurrency=Limit(key=lambda event: event.payload["k"], max=1),
        steps=[s.return_(1)],
    )
    assert start_workflow("long-key", payload={"k": 7}).reason == ev.FLOW_KEY_FAILED
    assert start_workflow("long-key", payload={"k": "x" * 201}).reason == ev.FLOW_KEY_FAILED


def test_an_event_that_starts_a_limited_workflow_is_saved_even_when_the_run_queues(registry):
    define_workflow(
        "on-order",
        trigger=on_event("order.placed"),
        concurrency=Limit(key="all", max=1),
        steps=[s.wait("PT1H")],
    )
    append_event("order-1", "order.placed", {})
    append_event("order-2", "order.placed", {})
    assert sorted(WorkflowRun.objects.values_list("status", flat=True)) == ["queued", "waiting"]


def test_an_operator_raises_a_limit_without_a_deploy(one_per_customer, clock):
    runs = [start_workflow("sync-customer", payload={"customer": "c1", "n": n}) for n in range(4)]
    assert statuses(runs).count("queued") == 3
    set_flow_limit("sync-customer", max_active=3, by="ops", reason="backlog")
    # Checked again once every process has read the new limit (a worker that
    # still had the old one cached would only park them again).
    assert reload(runs[1]).wake_at == clock.now() + timedelta(seconds=6)
    clock.advance(seconds=6)
    run_until_idle()
    assert statuses(runs) == ["waiting", "waiting", "waiting", "queued"]
    set_flow_limit("sync-customer")  # back to the declared limit: nothing is stopped
    assert statuses(runs).count("waiting") == 3
    with pytest.raises(KumiflowError):
        set_flow_limit("sync-customer", max_active=0)


# -- rates ---------------------------------------------------------------------


def test_a_rate_of_ten_a_minute_admits_exactly_ten_per_window(registry, clock):
    clock.set(clock.now().replace(second=0, microsecond=0))
    define_workflow(
        "call-carrier",
        rate=Rate(key="carrier", limit=10, per="PT1M"),
        steps=[s.return_(1)],
    )
    runs = [start_workflow("call-carrier") for _ in range(25)]
    assert statuses(runs).count("completed") == 10
    queued = [reload(r) for r in runs if reload(r).status == "queued"]
    assert {r.held_by for r in queued} == {"rate"}
    assert {r.wake_at for r in queued} == {clock.now() + timedelta(minutes=1)}
    run_until_idle()  # nothing is due before the next window
    assert statuses(runs).count("completed") == 10
    clock.advance(minutes=1)
    run_until_idle()
    assert statuses(runs).count("completed") == 20
    clock.advance(minutes=1)
    run_until_idle()
    assert statuses(runs).count("completed") == 25
    bucket = RateBucket.objects.get(scope="call-carrier", key="carrier")
    assert bucket.count == 5


# -- priorities ----------------------------------------------------------------


def test_higher_priority_runs_are_claimed_first_from_a_backlog(registry, clock):
    define_workflow("report", start_mode="deferred", steps=[s.return_(1)])
    low = [start_workflow("report") for _ in range(30)]
    clock.advance(seconds=1)
    high = [start_workflow("report", priority=50) for _ in range(5)]
    ResumeLoop(batch_size=10).run_once()
    assert statuses(high) == ["completed"] * 5  # though they became due later
    assert statuses(low).count("completed") == 5


def test_an_events_priority_passes_to_the_runs_it_starts(registry):
    define_workflow("welcome", trigger=on_event("user.joined"), start_mode="deferred", steps=[])
    append_event("user-1", "user.joined", {}, priority=20)
    assert WorkflowRun.objects.get().priority == 20
    with pytest.raises(InvalidEvent, match="priority"):
        append_event("user-2", "user.joined", {}, priority=101)
    with pytest.raises(InvalidEvent, match="priority"):
        start_workflow("welcome", priority="high")  # type: ignore[arg-type]


# -- debounce and throttle ------------------------------------------------------


@pytest.fixture
def debounced(registry):
    return define_workflow(
        "sync-account",
        trigger=on_event(
            "account.edited",
            key=lambda event: event.payload["account"],
            debounce="PT5M",
            max_wait="PT30M",
        ),
        steps=[s.return_(lambda ctx: ctx.event.payload["edit"])],
    )


def test_debounce_starts_one_run_with_the_last_event_once_the_key_is_quiet(debounced, clock):
    for edit in range(3):
        append_event("account-a", "account.edited", {"account": "a", "edit": edit})
        clock.advance(minutes=1)
    append_event("account-b", "account.edited", {"account": "b", "edit": 9})
    run_a, run_b = WorkflowRun.objects.order_by("started_at")
    assert (run_a.status, run_a.held_by) == ("queued", "debounce")
    clock.advance(minutes=3)  # four minutes after a's last edit: still quiet too briefly
    run_until_idle()
    assert reload(run_a).status == "queued"
    clock.advance(minutes=1)
    run_until_idle()
    assert (reload(run_a).status, reload(run_a).result) == ("completed", 2)
    assert WorkflowRun.objects.filter(workflow="sync-account").count() == 2
    clock.advance(minutes=1)
    run_until_idle()
    assert (reload(run_b).status, reload(run_b).result) == ("completed", 9)


def test_a_burst_that_never_ends_still_starts_after_max_wait(debounced, clock):
    for edit in range(12):  # an edit every 4 minutes for 44 minutes
        append_event("account-a", "account.edited", {"account": "a", "edit": edit})
        clock.advance(minutes=4)
        run_until_idle()
    runs = list(WorkflowRun.objects.order_by("started_at"))
    first = runs[0]
    assert first.status == "completed"
    assert first.result == 7  # the last edit before 30 minutes had passed
    assert first.finished_at is not None
    assert first.finished_at - first.started_at <= timedelta(minutes=32)


def test_throttle_starts_one_run_per_key_and_period_and_records_the_skipped(registry, clock):
    define_workflow(
        "notify",
        trigger=on_event("price.changed", key=lambda e: e.payload["sku"], throttle="PT1M"),
        steps=[s.return_(lambda ctx: ctx.event.payload["n"])],
    )
    skipped = [append_event("sku-1", "price.changed", {"sku": "1", "n": n}) for n in range(5)]
    append_event("sku-2", "price.changed", {"sku": "2", "n": 0})
    assert WorkflowRun.objects.count() == 2
    bucket = RateBucket.objects.get(scope="throttle:7:default:notify", key="1")
    assert bucket.skipped == 4
    assert bucket.skipped_positions == [e.position for e in skipped[1:]]
    clock.advance(minutes=1)
    append_event("sku-1", "price.changed", {"sku": "1", "n": 5})
    assert sorted(WorkflowRun.objects.values_list("result", flat=True)) == [0, 0, 5]  # type: ignore[type-var]


# -- fair share between tenants --------------------------------------------------


def test_a_tenant_with_a_backlog_does_not_delay_another_by_more_than_a_batch(registry, clock):
    define_workflow("import-row", start_mode="deferred", steps=[s.return_(1)])
    big = [start_workflow("import-row", tenant="big") for _ in range(300)]
    clock.advance(seconds=1)
    small = [start_workflow("import-row", tenant="small") for _ in range(10)]
    loop = ResumeLoop(batch_size=20)
    loop.run_once()
    loop.run_once()
    assert statuses(small) == ["completed"] * 10
    assert statuses(big).count("completed") == 30


def test_tenant_weights_share_a_batch(registry, clock, settings):
    settings.KUMIFLOW_TENANT_WEIGHTS = {"gold": 3}
    define_workflow("job", start_mode="deferred", steps=[s.return_(1)])
    gold = [start_workflow("job", tenant="gold") for _ in range(50)]
    plain = [start_workflow("job", tenant="plain") for _ in range(50)]
    ResumeLoop(batch_size=20).run_once()
    assert (statuses(gold).count("completed"), statuses(plain).count("completed")) == (15, 5)


# -- task steps ----------------------------------------------------------------


def call_api(n):
    return n


def test_a_task_concurrency_limit_parks_attempts_until_a_slot_frees(registry, clock):
    define_workflow(
        "enrich",
        steps=[
            s.task(
                "api",
                call_api,
                args=lambda ctx: [ctx.event.payload["n"]],
                concurrency=Limit(key="geo-api", max=2, scope="geo"),
            )
        ],
    )
    for n in range(5):
        start_workflow("enrich", payload={"n": n})
    claimed = attempts.claim_due(the_clock.now(), worker="w", limit=10)
    assert len(claimed) == 2
    parked = StepTask.objects.filter(status=TaskStatus.PENDING)
    assert parked.count() == 3
    assert set(parked.values_list("held_by", flat=True)) == {"concurrency"}
    assert FlowKey.objects.get(scope="geo", key="geo-api").held == 3
    attempts.record(claimed[0], attempts.run(claimed[0]))
    assert (
        StepTask.objects.filter(status=TaskStatus.PENDING, next_attempt_at__isnull=False).count()
        == 1
    )
    more = attempts.claim_due(the_clock.now(), worker="w", limit=10)
    assert len(more) == 1
    assert StepTask.objects.filter(status=TaskStatus.RUNNING).count() == 2
    for attempt in [claimed[1], *more]:
        attempts.record(attempt, attempts.run(attempt))
    run_until_idle()
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {RunStatus.COMPLETED}


def test_a_task_rate_waits_for_the_next_window(registry, clock):
    clock.set(clock.now().replace(second=0, microsecond=0))
    define_workflow(
        "geocode",
        steps=[s.task("api", call_api, args=[1], rate=Rate(key="geo", limit=2, per="PT1M"))],
    )
    for _ in range(5):
        start_workflow("geocode")
    assert len(attempts.claim_due(the_clock.now(), worker="w", limit=10)) == 2
    held = StepTask.objects.filter(held_by="rate")
    assert held.count() == 3
    assert set(held.values_list("next_attempt_at", flat=True)) == {
        clock.now() + timedelta(minutes=1)
    }


# -- definitions that are refused ---------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        ({"concurrency": Limit(key="k", max=0)}, "max must be 1 or more"),
        ({"concurrency": Limit(key="k", max=-1)}, "max must be 1 or more"),
        ({"concurrency": Limit(key="k", max=1.5)}, "max must be an integer"),
        ({"concurrency": Limit(key=7, max=1)}, "must be a string"),
        ({"concurrency": Limit(key="x" * 201, max=1)}, "1 to 200 characters"),
        ({"concurrency": Limit(key=lambda a, b: a, max=1)}, "function of one argument"),
        ({"concurrency": 3}, "must be a Limit"),
        ({"rate": Rate(key="k", limit=10, per="PT0S")}, "positive duration"),
        ({"rate": Rate(key="k", limit=10, per="soon")}, "invalid ISO 8601 duration"),
        ({"rate": Rate(key="k", limit=0, per="PT1M")}, "limit must be 1 or more"),
        ({"priority": 101}, "from -100 to 100"),
        ({"priority": -101}, "from -100 to 100"),
        ({"priority": "high"}, "must be an integer"),
    ],
)
def test_bad_flow_control_is_refused_when_the_workflow_is_defined(registry, options, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        define_workflow("bad", steps=[s.return_(1)], **options)


@pytest.mark.parametrize(
    "trigger, message",
    [
        (on_event("e", debounce="PT1M", throttle="PT1M"), "not both"),
        (on_event("e", debounce="PT0S"), "positive"),
        (on_event("e", throttle="later"), "invalid ISO 8601 duration"),
        (on_event("e", max_wait="PT1H"), "give debounce"),
        (on_event("e", debounce="PT10M", max_wait="PT5M"), "not be shorter"),
        (on_event("e", key="k"), "debounce or a throttle"),
    ],
)
def test_bad_debounce_and_throttle_are_refused(registry, trigger, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        define_workflow("bad", trigger=trigger, steps=[s.return_(1)])


def test_a_bad_task_limit_is_refused(registry):
    with pytest.raises(WorkflowDefinitionError, match="max must be 1 or more"):
        define_workflow(
            "bad", steps=[s.task("t", call_api, args=[1], concurrency=Limit(key="k", max=0))]
        )


def test_flow_control_does_not_change_a_definitions_fingerprint(registry):
    plain = define_workflow("fp", steps=[s.task("t", call_api, args=[1])], register=False)
    limited = define_workflow(
        "fp",
        concurrency=Limit(key="k", max=2),
        priority=5,
        steps=[s.task("t", call_api, args=[1], concurrency=Limit(key="k", max=1))],
        register=False,
    )
    assert plain.fingerprint == limited.fingerprint


def test_idle_keys_are_purged_and_a_purged_key_admits_again(one_per_customer, clock):
    from kumiflow_django.flow.limits import purge_idle_keys

    done = start_workflow("sync-customer", payload={"customer": "c1", "n": 1})
    busy = start_workflow("sync-customer", payload={"customer": "c2", "n": 2})
    clock.advance(hours=1)
    run_until_idle()
    start_workflow("sync-customer", payload={"customer": "c2", "n": 3})  # c2 busy again
    assert reload(done).status == reload(busy).status == "completed"
    assert purge_idle_keys(clock.now() + timedelta(seconds=1)) == 1
    assert list(FlowKey.objects.values_list("key", flat=True)) == ["c2"]
    again = start_workflow("sync-customer", payload={"customer": "c1", "n": 4})
    assert reload(again).status == "waiting"


# -- the console ------------------------------------------------------------------


def test_the_admin_shows_queued_runs_their_keys_and_why(one_per_customer, admin_client):
    from django.urls import reverse

    start_workflow("sync-customer", payload={"customer": "<b>c1</b>", "n": 1})
    queued = start_workflow("sync-customer", payload={"customer": "<b>c1</b>", "n": 2})
    page = admin_client.get(reverse("admin:kumiflow_workflowrun_change", args=[queued.pk]))
    html = page.content.decode()
    assert "Queued: not running yet" in html
    assert "waits for a slot: sync-customer key" in html
    assert "<b>c1</b>" not in html and "&lt;b&gt;c1&lt;/b&gt;" in html
    listing = admin_client.get(
        reverse("admin:kumiflow_workflowrun_changelist"),
        {"status": "queued", "flow_scope": "sync-customer"},
    )
    assert listing.status_code == 200 and str(queued.pk)[:8] in listing.content.decode()
    keys = admin_client.get(reverse("admin:kumiflow_flowkey_changelist")).content.decode()
    assert "sync-customer" in keys and "&lt;b&gt;c1&lt;/b&gt;" in keys
    buckets = admin_client.get(reverse("admin:kumiflow_ratebucket_changelist"))
    assert buckets.status_code == 200


def test_an_override_saved_in_the_admin_goes_through_set_flow_limit(
    one_per_customer, admin_client, clock
):
    from django.urls import reverse

    runs = [start_workflow("sync-customer", payload={"customer": "c", "n": n}) for n in range(3)]
    response = admin_client.post(
        reverse("admin:kumiflow_flowlimit_add"),
        {"scope": "sync-customer", "max_active": "2", "rate_limit": ""},
    )
    assert response.status_code == 302
    clock.advance(seconds=6)
    run_until_idle()
    assert statuses(runs) == ["waiting", "waiting", "queued"]
    from kumiflow_django.flow.models import FlowLimit

    assert FlowLimit.objects.get().changed_by == "admin"


@pytest.mark.parametrize("weights", [{"gold": 0}, {"gold": 101}, {"gold": "3"}, ["gold"], {"": 2}])
def test_bad_tenant_weights_are_a_system_check_error(settings, weights):
    from kumiflow_django.checks import check_settings

    settings.KUMIFLOW_TENANT_WEIGHTS = weights
    assert "kumiflow.E050" in [e.id for e in check_settings()]


def test_a_rebuilt_table_checks_parked_runs_again(one_per_customer, clock):
    from kumiflow_django.projections.rebuild import rebuild_all

    runs = [start_workflow("sync-customer", payload={"customer": "c1", "n": n}) for n in range(3)]
    rebuild_all()
    assert statuses(runs) == ["waiting", "queued", "queued"]
    run_until_idle()  # checked again: parked again, counted
    clock.advance(hours=1)
    run_until_idle()
    assert statuses(runs) == ["completed", "waiting", "queued"]


# -- what a hostile review found ------------------------------------------------------


def test_a_run_started_by_a_limited_runs_own_segment_queues_behind_it(registry, clock):
    """The first run's row is not written yet when its step's event starts the
    second: it counts as active all the same, and its end wakes the second."""
    define_workflow(
        "a",
        concurrency=Limit(key="k", max=1, scope="shared"),
        steps=[s.append_event("x", "b.go"), s.wait("PT1H")],
    )
    define_workflow(
        "b",
        trigger=on_event("b.go"),
        concurrency=Limit(key="k", max=1, scope="shared"),
        steps=[s.return_("b ran")],
    )
    first = start_workflow("a")
    second = WorkflowRun.objects.get(workflow="b")
    assert (reload(first).status, second.status) == ("waiting", "queued")
    clock.advance(hours=1)
    run_until_idle()
    assert (reload(first).status, reload(second).status) == ("completed", "completed")


def test_a_run_that_ends_in_the_segment_that_parked_another_wakes_it(registry, clock):
    define_workflow(
        "a",
        concurrency=Limit(key="k", max=1, scope="shared"),
        steps=[s.append_event("x", "b.go"), s.return_(1)],
    )
    define_workflow(
        "b",
        trigger=on_event("b.go"),
        concurrency=Limit(key="k", max=1, scope="shared"),
        steps=[s.return_("b ran")],
    )
    start_workflow("a")
    run_until_idle()
    assert WorkflowRun.objects.get(workflow="b").status == "completed"


def test_a_refused_first_segment_leaves_the_run_waiting_for_admission(one_per_customer, clock):
    from unittest import mock

    from django.db import DatabaseError

    from kumiflow_django.engine import runner
    from kumiflow_django.store import db

    first = start_workflow("sync-customer", payload={"customer": "c", "n": 1})
    real = runner._run

    def refuse(opening):
        if opening.new:
            raise DatabaseError("value too long")  # a refusal, not a step error
        return real(opening)

    with (
        mock.patch.object(runner, "_run", refuse),
        mock.patch.object(db, "is_transient", lambda exc: False),
    ):
        refused = start_workflow("sync-customer", payload={"customer": "c", "n": 2})
    assert reload(refused).status == "queued"  # not pending: it was never admitted
    clock.advance(minutes=10)
    run_until_idle()
    assert statuses([first, refused]) == ["waiting", "queued"]


def test_runs_and_task_attempts_of_one_scope_are_counted_apart(registry, clock):
    define_workflow(
        "carrier-run",
        concurrency=Limit(key="k", max=1, scope="carrier"),
        steps=[
            s.task("call", call_api, args=[1], concurrency=Limit(key="k", max=1, scope="carrier"))
        ],
    )
    first = start_workflow("carrier-run")
    assert reload(first).status == "waiting_event"
    run_until_idle()
    assert reload(first).status == "completed"
    assert set(FlowKey.objects.values_list("kind", flat=True)) == {"run", "task"}


def test_a_queued_run_starts_on_the_current_definition_after_a_deploy(registry, clock):
    define_workflow(
        "sync", concurrency=Limit(key="k", max=1), steps=[s.wait("PT1H"), s.return_("old")]
    )
    first = start_workflow("sync")
    queued = start_workflow("sync")
    registry.unregister("sync")  # a deploy: the same name, other steps
    define_workflow("sync", concurrency=Limit(key="k", max=1), steps=[s.return_("new")])
    clock.advance(hours=1)
    run_until_idle()
    assert reload(first).status == "failed"  # it had run: its definition changed under it
    assert (reload(queued).status, reload(queued).result) == ("completed", "new")


def test_a_scope_with_a_control_character_is_refused(registry):
    with pytest.raises(WorkflowDefinitionError, match="control characters"):
        define_workflow(
            "bad", concurrency=Limit(key="k", max=1, scope="a\x00b"), steps=[s.return_(1)]
        )
    with pytest.raises(KumiflowError, match="control characters"):
        set_flow_limit("a\nb", max_active=2)


BREAK = {"on": True}


def test_a_retried_run_holds_its_slot_so_the_next_start_queues(registry, clock):
    """The failed first segment's admission was rolled back with it; the retry
    makes the run active again, and the key's row says so to the next start."""
    from kumiflow_django import retry_run

    define_workflow(
        "fragile",
        concurrency=Limit(key="k", max=1),
        steps=[s.compute("x", lambda ctx: 1 / 0 if BREAK["on"] else 1), s.wait("PT1H")],
    )
    failed = start_workflow("fragile")
    assert failed.status == "failed"
    FlowKey.objects.all().delete()  # as after kumiflow_retention purged the idle key
    BREAK["on"] = False
    try:
        retry_run(failed.pk, by="ops", reason="fixed")
        run_until_idle()
        assert reload(failed).status == "waiting"
        assert start_workflow("fragile").status == "queued"
    finally:
        BREAK["on"] = True


def test_a_queued_run_admitted_later_counts_before_its_row_says_so(registry, clock):
    """A queued run's row says queued until its first segment is written: a run
    its step starts in that segment must still count it as active."""
    limit = Limit(key="k", max=1, scope="shared")
    define_workflow("holder", concurrency=limit, steps=[s.wait("PT1H")])
    define_workflow("a", concurrency=limit, steps=[s.append_event("x", "b.go"), s.wait("PT1H")])
    define_workflow("b", trigger=on_event("b.go"), concurrency=limit, steps=[s.wait("PT1H")])
    holder = start_workflow("holder")
    a = start_workflow("a")
    assert reload(a).status == "queued"
    clock.advance(hours=1)
    run_until_idle()  # the holder ends; a is admitted and starts b in its segment
    assert (reload(holder).status, reload(a).status) == ("completed", "waiting")
    assert WorkflowRun.objects.get(workflow="b").status == "queued"


def _exits(event):
    raise SystemExit(3)


def test_a_key_resolver_that_raises_system_exit_fails_that_start_only(registry):
    define_workflow("exits", concurrency=Limit(key=_exits, max=1), steps=[s.return_(1)])
    define_workflow(
        "exits-debounced",
        trigger=on_event("thing.done", key=_exits, debounce="PT1M"),
        steps=[s.return_(1)],
    )
    run = start_workflow("exits")
    assert (run.status, run.reason) == ("failed", ev.FLOW_KEY_FAILED)
    append_event("thing-1", "thing.done", {})  # the append itself goes through
    failed = WorkflowRun.objects.get(workflow="exits-debounced")
    assert (failed.status, failed.reason) == ("failed", ev.FLOW_KEY_FAILED)


def test_the_sweep_wakes_a_parked_task_attempt_whose_key_has_a_free_slot(registry, clock):
    """A release passes over a parked attempt another transaction holds (SKIP
    LOCKED); the sweep finds it: its key has free slots and nothing runs."""
    from kumiflow_django.flow import admission

    define_workflow(
        "enrich-one",
        steps=[s.task("api", call_api, args=lambda ctx: [1], concurrency=Limit(key="k", max=1))],
    )
    start_workflow("enrich-one")
    start_workflow("enrich-one")
    [running] = attempts.claim_due(the_clock.now(), worker="w", limit=10)
    stranded = StepTask.objects.get(status=TaskStatus.PENDING)
    assert (stranded.held_by, stranded.next_attempt_at) == ("concurrency", None)
    assert admission.wake_stranded() == 0  # parked behind a running attempt: stays
    # As a lost wake would leave it: the running attempt ended, nobody woke the next.
    StepTask.objects.filter(pk=running.task_id).update(status=TaskStatus.COMPLETED)
    assert admission.wake_stranded() == 1
    stranded.refresh_from_db()
    assert stranded.next_attempt_at is not None
    assert len(attempts.claim_due(the_clock.now(), worker="w", limit=10)) == 1
    assert admission.wake_stranded() == 0
