"""One vocabulary (docs/concepts.md): a run waiting for its task is "waiting for
task charge" in the console and ``waiting_for: {"kind": "task", ...}`` in the
API, while its status stays ``waiting_event`` (no status of its own)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from kumiflow_django import define_workflow, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus
from kumiflow_django.projections.waiting_for import waiting_for
from kumiflow_django.projections.waits import RunWait
from kumiflow_django.store import names as ev

pytestmark = pytest.mark.django_db


def charge(cents: int) -> dict[str, int]:
    return {"charged": cents}


@pytest.fixture
def checkout(registry):
    """A charge through a task step, then an approval the run waits for."""
    return define_workflow(
        "checkout",
        trigger=on_event("order.placed"),
        steps=[
            s.task("charge", charge, args=lambda ctx: [ctx.event.payload["cents"]]),
            s.wait_for_event(
                "order.approved",
                match={"payload.order": lambda ctx: ctx.event.payload["order"]},
                name="approval",
            ),
            s.return_(lambda ctx: ctx.steps["charge"]),
        ],
    )


def test_a_run_waiting_for_its_task_says_which_task(checkout):
    run = start_workflow("checkout", payload={"order": "o-1", "cents": 1999})
    assert (run.status, RunWait.objects.get(run_id=run.id, branch="").event_type) == (
        RunStatus.WAITING_EVENT,
        ev.TASK_SETTLED,
    )
    awaited = waiting_for(run)
    assert awaited is not None
    assert (awaited["kind"], awaited["step"], awaited["path"], awaited["text"]) == (
        "task",
        "charge",
        "0",
        "waiting for task charge",
    )
    assert (
        awaited["id"] == RunWait.objects.get(run_id=run.id, branch="").match["stream_id"]
    )  # the task's id


def test_the_console_shows_waiting_for_task_in_the_list_and_on_the_run_page(checkout, admin_client):
    run = start_workflow("checkout", payload={"order": "o-1", "cents": 1999})
    listing = admin_client.get(reverse("admin:kumiflow_workflowrun_changelist")).content.decode()
    assert "waiting for task charge" in listing
    assert f">{ev.TASK_SETTLED}<" not in listing  # the engine's event type is only a tooltip

    page = admin_client.get(reverse("admin:kumiflow_workflowrun_change", args=[run.pk]))
    text = page.content.decode()
    assert "<h2>Waiting for task charge</h2>" in text
    assert "nobody sends it by hand" in text


def test_an_event_wait_keeps_the_name_of_its_event(checkout, admin_client):
    from kumiflow_django.testing import run_until_idle

    run = start_workflow("checkout", payload={"order": "o-1", "cents": 1999})
    run_until_idle()
    run.refresh_from_db()
    assert RunWait.objects.get(run_id=run.id, branch="").event_type == "order.approved"
    awaited = waiting_for(run)
    assert awaited is not None
    assert (awaited["kind"], awaited["step"], awaited["id"], awaited["text"]) == (
        "event",
        "approval",
        None,
        "waiting for event order.approved",
    )
    page = admin_client.get(reverse("admin:kumiflow_workflowrun_change", args=[run.pk]))
    assert "<h2>Waiting for event order.approved</h2>" in page.content.decode()


def test_a_run_that_waits_for_nothing_has_no_waiting_for(registry):
    define_workflow("quick", steps=[s.return_("done")])
    assert waiting_for(start_workflow("quick")) is None


def test_a_run_waiting_for_its_delivery_says_which_step(registry):
    from kumiflow_django.models import Dispatch

    define_workflow(
        "notify",
        steps=[
            s.webhook_send(
                url="https://hooks.example.com/orders", body={}, await_delivery=True, name="hook"
            ),
            s.return_("sent"),
        ],
    )
    run = start_workflow("notify")
    assert (run.status, RunWait.objects.get(run_id=run.id, branch="").event_type) == (
        RunStatus.WAITING_EVENT,
        ev.SETTLED,
    )
    awaited = waiting_for(run)
    assert awaited is not None
    assert (awaited["kind"], awaited["step"], awaited["id"], awaited["text"]) == (
        "delivery",
        "hook",
        str(Dispatch.objects.get(run_id=run.pk).pk),
        "waiting for delivery hook",
    )
