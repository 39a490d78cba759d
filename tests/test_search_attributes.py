"""Search attributes: resolved at the start, changed by a step, indexed, found."""

from __future__ import annotations

import pytest

from kumiflow_django import (
    WorkflowDefinitionError,
    append_event,
    define_workflow,
    find_runs,
    on_event,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.models import RunAttribute, RunStatus, WorkflowRun
from kumiflow_django.projections.rebuild import rebuild_all
from kumiflow_django.store import limits
from kumiflow_django.store import names as ev
from tests.helpers import run_events, types

pytestmark = pytest.mark.django_db


@pytest.fixture
def orders(registry):
    return define_workflow(
        "attr-order",
        trigger=on_event("order.placed"),
        attributes={
            "customer": lambda ctx: ctx.trigger.payload["customer_id"],
            "amount": lambda ctx: ctx.event.payload["cents"],
            "express": lambda ctx: ctx.event.payload.get("express"),
        },
        steps=[
            s.wait_for_event("order.paid", match={"stream_id": lambda ctx: ctx.event.stream_id}),
            s.set_attributes(paid=True, express=None),
            s.return_(1),
        ],
    )


def place(n, customer, cents=500, express=None):
    payload = {"customer_id": customer, "cents": cents}
    if express is not None:
        payload["express"] = express
    append_event(f"order-{n}", "order.placed", payload)
    return WorkflowRun.objects.latest("started_at")


def index(run):
    return dict(RunAttribute.objects.filter(run_id=run.id).values_list("name", "value"))


def test_the_start_resolves_the_attributes_into_the_run_started_event_and_the_index(orders):
    run = place(1, "C-17", express=True)

    assert run.attributes == {"customer": "C-17", "amount": 500, "express": True}
    started = run_events(run)[0]
    assert started.payload["attributes"] == {"customer": "C-17", "amount": 500, "express": True}
    assert index(run) == {"customer": "C-17", "amount": "500", "express": "true"}


def test_a_none_value_at_the_start_leaves_the_attribute_out(orders):
    run = place(1, "C-17")
    assert "express" not in run.attributes
    assert "express" not in index(run)


def test_a_step_sets_and_removes_attributes_through_an_event_on_the_run_stream(orders):
    run = place(1, "C-17", express=True)
    append_event("order-1", "order.paid", {})
    run.refresh_from_db()

    assert run.status == RunStatus.COMPLETED
    assert "attributes-set" in types(run)
    assert run.attributes == {"customer": "C-17", "amount": 500, "paid": True}
    assert index(run) == {"customer": "C-17", "amount": "500", "paid": "true"}


def test_runs_are_found_by_attribute_from_code(orders):
    first = place(1, "C-17")
    place(2, "C-18")
    third = place(3, "C-17", cents=900)

    assert list(find_runs(customer="C-17")) == [third, first]
    assert list(find_runs(customer="C-17", amount=900)) == [third]
    assert list(WorkflowRun.objects.with_attribute(customer="C-18").values_list("id", flat=True))
    assert not find_runs(customer="C-99").exists()
    with pytest.raises(ValueError, match="identifier-like"):
        find_runs(**{"not a name": "x"})


def test_a_rebuild_reproduces_the_attributes_and_their_index(orders):
    one = place(1, "C-17", express=True)
    place(2, "C-18")
    append_event("order-1", "order.paid", {})
    one.refresh_from_db()
    before = (one.attributes, index(one), RunAttribute.objects.count())

    RunAttribute.objects.all().delete()
    rebuild_all()

    one.refresh_from_db()
    assert (one.attributes, index(one), RunAttribute.objects.count()) == before
    assert list(find_runs(customer="C-17")) == [one]


def test_a_resolver_that_raises_fails_the_run_saying_why(registry):
    define_workflow(
        "attr-broken",
        trigger=on_event("thing.happened"),
        attributes={"customer": lambda ctx: ctx.event.payload["missing"]},
        steps=[s.return_(1)],
    )
    append_event("t-1", "thing.happened", {})
    run = WorkflowRun.objects.get(workflow="attr-broken")
    assert run.status == RunStatus.FAILED
    assert run.reason == ev.ATTRIBUTE_FAILED
    assert "KeyError" in run.last_error and "search attribute" in run.last_error


def test_a_value_the_index_cannot_store_fails_the_run(registry):
    define_workflow(
        "attr-long",
        attributes={"note": lambda ctx: "x" * (limits.ATTRIBUTE_VALUE + 1)},
        steps=[s.return_(1)],
    )
    run = start_workflow("attr-long")
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.reason == ev.ATTRIBUTE_FAILED
    assert f"at most {limits.ATTRIBUTE_VALUE} characters" in run.last_error
    assert not RunAttribute.objects.filter(run_id=run.id).exists()


def test_a_step_that_sets_a_bad_value_fails_its_step(registry):
    define_workflow(
        "attr-bad-step",
        steps=[s.set_attributes(total=lambda ctx: 1.5)],
    )
    run = start_workflow("attr-bad-step")
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "must be a string, an integer, a boolean or None" in run.last_error
    assert run.attributes == {}


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"1st": "x"}, "identifier-like"),
        ({"a" * (limits.ATTRIBUTE_NAME + 1): "x"}, f"at most {limits.ATTRIBUTE_NAME}"),
        ({"customer": 1.5}, "must be a string, an integer"),
        ({"customer": "x" * (limits.ATTRIBUTE_VALUE + 1)}, "at most"),
        ({"customer": lambda: 1}, "function of one argument"),
        ("customer", "mapping"),
        ({f"a{i}": 1 for i in range(limits.ATTRIBUTES_PER_RUN + 1)}, "at most"),
    ],
)
def test_names_and_values_are_checked_when_the_workflow_is_defined(registry, attributes, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        define_workflow("attr-invalid", attributes=attributes, steps=[s.return_(1)])


def test_set_attributes_is_checked_when_the_workflow_is_defined(registry):
    with pytest.raises(WorkflowDefinitionError, match=r"step 0 \(set_attributes\).*identifier"):
        define_workflow("attr-invalid", steps=[s.set_attributes(**{"a-b": 1})])
    with pytest.raises(WorkflowDefinitionError, match="at least one"):
        define_workflow("attr-invalid", steps=[s.set_attributes()])


def test_attributes_are_not_part_of_the_fingerprint(registry):
    plain = define_workflow("attr-fp", steps=[s.return_(1)], register=False)
    tagged = define_workflow(
        "attr-fp", steps=[s.return_(1)], attributes={"tier": "gold"}, register=False
    )
    assert plain.fingerprint == tagged.fingerprint


def test_a_segment_that_fails_after_set_attributes_writes_none_of_them(registry):
    """The change commits with its segment or not at all: the index rows too."""
    define_workflow(
        "attr-rollback",
        attributes={"customer": "C-1"},
        steps=[
            s.set_attributes(stage="charged"),
            s.compute("boom", lambda ctx: 1 / 0),
        ],
    )
    run = start_workflow("attr-rollback")
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.attributes == {"customer": "C-1"}
    assert index(run) == {"customer": "C-1"}
    assert "attributes-set" not in types(run)


def test_a_restarted_run_keeps_the_attributes_its_kept_steps_set(registry, clock):
    from kumiflow_django import restart_run
    from kumiflow_django.testing import run_until_idle

    broken = {"yes": True}

    def ship(ctx):
        if broken["yes"]:
            raise RuntimeError("carrier down")
        return "shipped"

    define_workflow(
        "attr-restart",
        attributes={"customer": lambda ctx: ctx.trigger.payload["customer"]},
        steps=[
            s.set_attributes(tier="gold", customer="C-2"),
            s.wait("PT1H"),
            s.set_attributes(stage="shipping"),
            s.compute("ship", ship),
        ],
    )
    old = start_workflow("attr-restart", payload={"customer": "C-1"})
    clock.advance(hours=2)
    run_until_idle(dispatch=False)
    old.refresh_from_db()
    assert old.status == RunStatus.FAILED
    assert old.attributes == {"customer": "C-2", "tier": "gold"}  # the failed segment's are not

    broken["yes"] = False
    new = restart_run(old.id, from_step="1", reason="carrier back")
    assert new.attributes == {"customer": "C-2", "tier": "gold"}
    assert index(new) == {"customer": "C-2", "tier": "gold"}
    assert set(find_runs(tier="gold")) == {old, new}
    started = run_events(new)[0]
    assert started.payload["attributes"] == {"customer": "C-2", "tier": "gold"}
    assert started.payload["restart"]["attributes"] == [
        {"step": "0", "attributes": {"tier": "gold", "customer": "C-2"}}
    ]
    fresh = restart_run(old.id, from_step="0")  # step 0 runs again: nothing carried
    assert run_events(fresh)[0].payload["attributes"] == {"customer": "C-1"}
    assert "attributes" not in run_events(fresh)[0].payload["restart"]
    clock.advance(hours=2)
    run_until_idle(dispatch=False)
    new.refresh_from_db()
    assert new.status == RunStatus.COMPLETED
    again = restart_run(new.id, from_step="3")  # a restart of a restart carries them on
    assert again.attributes == {"customer": "C-2", "tier": "gold", "stage": "shipping"}


@pytest.mark.parametrize("value", [None, 1.5, ["C-1"], {"id": 1}])
def test_find_runs_refuses_a_value_no_attribute_can_have(orders, value):
    place(1, "None")
    with pytest.raises(ValueError, match="a string, an integer"):
        find_runs(customer=value)


def test_attributes_at_their_limits_are_indexed_and_found(registry):
    name = "n" * limits.ATTRIBUTE_NAME
    define_workflow(
        "attr-limits",
        attributes={name: lambda ctx: "v" * limits.ATTRIBUTE_VALUE, "big": 2**53 - 1},
        steps=[s.set_attributes(small=-(2**53 - 1), flag=False)],
    )
    run = start_workflow("attr-limits")
    assert index(run)[name] == "v" * limits.ATTRIBUTE_VALUE
    assert list(find_runs(**{name: "v" * limits.ATTRIBUTE_VALUE})) == [run]
    assert list(find_runs(big=2**53 - 1, small=-(2**53 - 1), flag=False)) == [run]
    assert list(find_runs(flag="false")) == [run]  # text compares: False is "false"


def test_a_filter_compares_values_exactly_on_every_database(registry):
    # MariaDB's collations compare text ignoring case, accents and trailing
    # spaces: the index finds the candidates, the comparison is exact.
    define_workflow(
        "attr-exact",
        attributes={"customer": lambda ctx: ctx.trigger.payload["c"]},
        steps=[s.wait("PT1H")],
    )
    runs = {
        c: start_workflow("attr-exact", payload={"c": c}) for c in ["ABC", "abc", "ÂBC", "ABC "]
    }
    for c, run in runs.items():
        assert list(find_runs(customer=c)) == [run], c
    assert list(WorkflowRun.objects.with_attribute(customer="Abc")) == []


def test_an_attribute_name_is_lower_case(registry):
    # Names that differ only in case would be one name to MariaDB's index.
    with pytest.raises(WorkflowDefinitionError, match="lower-case"):
        define_workflow("attr-case", attributes={"Customer": "a"}, steps=[s.return_(1)])


def test_the_attribute_filtered_list_counts_top_level_runs_from_the_index(
    registry, clock, admin_client
):
    """Child runs carry the attribute too, but the list hides them: their index
    rows say so (``top``), and the count reads the index, not the run rows."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from kumiflow_django.testing import run_until_idle

    define_workflow(
        "attr-leaf", attributes={"customer": "C-9"}, steps=[s.wait("P1D"), s.return_(1)]
    )
    define_workflow(
        "attr-top",
        attributes={"customer": "C-9"},
        steps=[s.child("leaf", "attr-leaf"), s.return_(2)],
    )
    for _ in range(2):
        start_workflow("attr-top")
    run_until_idle()
    assert WorkflowRun.objects.filter(parent_id__isnull=False).count() == 2
    assert sorted(RunAttribute.objects.values_list("top", flat=True)) == [False, False, True, True]
    url = reverse("admin:kumiflow_workflowrun_changelist") + "?attr=customer:C-9"
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(url)
    assert page.status_code == 200
    assert page.context["cl"].result_count == 2
    assert {r.workflow for r in page.context["cl"].result_list} == {"attr-top"}
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts and not any("kumiflow_workflowrun" in sql for sql in counts), counts
    shown = admin_client.get(url + "&children=yes").context["cl"]
    assert shown.result_count == 4
