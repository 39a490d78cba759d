"""A stream is its tenant's: the same stream id in two tenants is two streams.

Before, stream ids were one namespace across tenants: tenant a's append to
``ORD-6388e4`` made tenant b's own event on that id fail (``TenantMismatch``)
and b's run waiting for it never woke; appending to another tenant's run id
was refused as "the engine's own" where a random id was accepted, which told
one tenant which ids existed in another.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from kumiflow_django import (
    InvalidEvent,
    VersionConflict,
    append_event,
    append_events,
    define_projection,
    define_workflow,
    erase_stream,
    load_stream,
    on_event,
    start_workflow,
    stream_version,
)
from kumiflow_django import steps as s
from kumiflow_django.models import Event, WorkflowRun
from kumiflow_django.projections.rebuild import rebuild_all
from kumiflow_django.projections.retention import Retention
from kumiflow_django.projections.user import remove_projection
from kumiflow_django.store.log import NewEvent
from kumiflow_django.testing import run_until_idle
from tests.helpers import types

pytestmark = pytest.mark.django_db

ORDER = "ORD-6388e4"


def versions(stream_id: str, tenant: str) -> list[tuple[str, int]]:
    return [(e.type, e.version) for e in load_stream(stream_id, tenant=tenant)]


def test_the_same_stream_id_in_two_tenants_is_two_streams_with_their_own_versions():
    append_event(ORDER, "order.placed", tenant="a")
    append_event(ORDER, "order.paid", tenant="a")

    # b's stream of that id is new: its first event is version 1.
    append_events(ORDER, [NewEvent("order.placed")], tenant="b", expected_version=0)

    assert versions(ORDER, "a") == [("order.placed", 1), ("order.paid", 2)]
    assert versions(ORDER, "b") == [("order.placed", 1)]
    assert (stream_version(ORDER, tenant="a"), stream_version(ORDER, tenant="b")) == (2, 1)
    # The version guard holds within a tenant, and only there.
    with pytest.raises(VersionConflict):
        append_event(ORDER, "order.placed", tenant="b", expected_version=0)
    append_event(ORDER, "order.shipped", tenant="a", expected_version=2)
    assert stream_version(ORDER, tenant="b") == 1


def payment_waiter():
    """A run of tenant b, started elsewhere, that waits for the payment of its order."""
    return define_workflow(
        "payment",
        trigger=on_event("checkout.done"),
        steps=[
            s.wait_for_event(
                "payment.received",
                match={"stream_id": lambda ctx: ctx.event.payload["order"]},
                name="paid",
            ),
            s.return_(lambda ctx: ctx.steps["paid"]["payload"]),
        ],
    )


def test_a_waiting_run_wakes_on_its_own_tenants_event_and_not_on_anothers(registry):
    payment_waiter()
    append_event("cart-1", "checkout.done", {"order": ORDER}, tenant="b")
    run = WorkflowRun.objects.get(tenant_id="b")
    assert run.status == "waiting_event"

    append_event(ORDER, "payment.received", {"by": "a"}, tenant="a")
    run_until_idle()
    run.refresh_from_db()
    assert run.status == "waiting_event", "another tenant's event does not wake it"

    append_event(ORDER, "payment.received", {"by": "b"}, tenant="b")
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.result) == ("completed", {"by": "b"})


def test_another_tenants_run_id_is_answered_as_any_id_and_the_run_is_untouched(registry, clock):
    define_workflow("napper", steps=[s.wait("PT1M"), s.return_("ok")])
    run = start_workflow("napper", tenant="a")

    # What b learns from the run's id is what it learns from an unused id.
    theirs = append_event(str(run.id), "note.added", {"n": 1}, tenant="b")
    random = append_event("never-used-1", "note.added", {"n": 1}, tenant="b")
    assert (theirs.version, theirs.stream_type) == (random.version, random.stream_type) == (1, "")
    # a's own run stream stays the engine's.
    with pytest.raises(InvalidEvent, match="engine"):
        append_event(str(run.id), "note.added", tenant="a")

    clock.advance(minutes=1)
    run_until_idle()
    run.refresh_from_db()
    assert run.status == "completed"
    assert types(run) == ["run-started", "step.waiting", "step.resumed", "run-completed"]
    assert versions(str(run.id), "b") == [("note.added", 1)]


def test_erasing_one_tenants_stream_leaves_the_others():
    append_event(ORDER, "person.named", {"name": "Ada"}, tenant="a")
    append_event(ORDER, "person.named", {"name": "Bob"}, tenant="b")

    assert erase_stream(ORDER, tenant="a") == 1

    assert versions(ORDER, "a") == []
    assert versions(ORDER, "b") == [("person.named", 1)]


def test_retention_of_one_tenants_run_leaves_the_other_tenants_stream_of_its_id(registry, clock):
    define_workflow("quick", steps=[s.return_(1)])
    run = start_workflow("quick", tenant="a")
    append_event(str(run.id), "note.added", tenant="b")
    clock.advance(days=10)

    report = Retention(clock.now() - timedelta(days=1)).run()

    assert report.runs == 1 and not WorkflowRun.objects.exists()
    assert not Event.objects.filter(tenant_id="a").exists()
    assert versions(str(run.id), "b") == [("note.added", 1)]


def test_rebuild_is_identical_with_the_same_stream_ids_in_two_tenants(registry, clock):
    seen: list[tuple[str, str, int]] = []
    define_projection(
        "per-stream", {"*": lambda e: seen.append((e.tenant_id, e.stream_id, e.version))}
    )
    try:
        payment_waiter()
        define_workflow("napper", steps=[s.wait("PT1M"), s.return_("ok")])
        for tenant in ("a", "b"):
            append_event("cart-1", "checkout.done", {"order": ORDER}, tenant=tenant)
            append_event(ORDER, "order.placed", tenant=tenant)
        nap = start_workflow("napper", tenant="a")
        append_event(str(nap.id), "note.added", tenant="b")
        append_event(ORDER, "payment.received", {"by": "a"}, tenant="a")
        run_until_idle()
        assert sorted(WorkflowRun.objects.values_list("tenant_id", "status")) == [
            ("a", "completed"),
            ("a", "waiting"),
            ("b", "waiting_event"),
        ]
        runs = list(WorkflowRun.objects.order_by("pk").values())
        live = list(seen)

        rebuild_all()

        assert list(WorkflowRun.objects.order_by("pk").values()) == runs
        assert seen[len(live) :] == live
    finally:
        remove_projection("per-stream")


def test_the_admin_shows_an_engine_stream_without_another_tenants_stream_of_its_id(
    admin_client, registry
):
    from django.urls import reverse

    from kumiflow_django.models import Dispatch

    define_workflow("mailer", steps=[s.mail_send(to="a@x.io", subject="s", body="b")])
    run = start_workflow("mailer", tenant="a")
    dispatch = Dispatch.objects.get()
    append_event(str(dispatch.id), "intruder.noted", tenant="b")
    append_event(str(run.id), "intruder.noted", tenant="b")

    for page in ("dispatch", "workflowrun"):
        pk = dispatch.pk if page == "dispatch" else run.pk
        response = admin_client.get(reverse(f"admin:kumiflow_{page}_change", args=[pk]))
        assert response.status_code == 200
        html = response.content.decode()
        assert "intruder.noted" not in html, page
        assert "tenant=a" in html, f"{page}: the link to its events names the tenant"
