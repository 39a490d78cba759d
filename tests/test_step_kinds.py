"""Each step kind of the vocabulary, and extending it."""

from __future__ import annotations

from typing import Any

import pytest

from kumiflow_django import StepKind, define_workflow, on_event, register_step_kind, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.definition.step import Step, step_kinds
from kumiflow_django.models import Dispatch, Event, RunStatus, WorkflowRun
from testproject.shop.models import Customer
from tests.factories import CustomerFactory

pytestmark = pytest.mark.django_db


def run(steps, payload=None):
    define_workflow("wf", steps=steps)
    return start_workflow("wf", payload=payload or {})


def test_compute_stores_results_and_later_steps_read_them(registry):
    r = run(
        [
            s.compute("a", lambda ctx: ctx.event.payload["n"] + 1),
            s.compute("b", lambda ctx: ctx.steps["a"] * 10),
            s.return_(lambda ctx: ctx.steps),
        ],
        {"n": 1},
    )
    assert r.result == {"a": 2, "b": 20}


def test_branch_runs_one_side_and_its_results_reach_later_steps(registry):
    steps = [
        s.branch(
            lambda ctx: ctx.event.payload["vip"],
            then=[s.compute("greeting", lambda ctx: "welcome back")],
            else_=[s.compute("greeting", lambda ctx: "hello")],
        ),
        s.return_(lambda ctx: ctx.steps["greeting"]),
    ]
    assert run(steps, {"vip": True}).result == "welcome back"
    WorkflowRun.objects.all().delete()
    registry.unregister("wf")
    assert run(steps, {"vip": False}).result == "hello"


def test_for_each_runs_items_in_order_with_the_item_in_scope(registry):
    seen: list[Any] = []
    r = run(
        [
            s.for_each(
                lambda ctx: ctx.event.payload["items"],
                "item",
                do=[
                    s.compute(
                        "last",
                        lambda ctx: seen.append(ctx.scope["item"]) or ctx.scope["item"],  # type: ignore[func-returns-value]
                    )
                ],
            ),
            s.return_(lambda ctx: {"last": ctx.steps["last"], "scope": ctx.scope}),
        ],
        {"items": ["a", "b", "c"]},
    )
    assert seen == ["a", "b", "c"]
    assert r.result == {"last": "c", "scope": {}}


def test_read_find_one_and_find_many(registry):
    CustomerFactory(user_id="u1", engaged=True)
    CustomerFactory(user_id="u2", engaged=True)
    CustomerFactory(user_id="u3", engaged=False)
    r = run(
        [
            s.read.find_one(
                "one", "shop.Customer", lambda ctx: {"user_id": "u3"}, fields=["email"]
            ),
            s.read.find_one("none", Customer, {"user_id": "nobody"}),
            s.read.find_many(
                "engaged",
                "shop.Customer",
                {"engaged": True},
                order_by=["user_id"],
                fields=["user_id"],
            ),
            s.return_(lambda ctx: ctx.steps),
        ]
    )
    assert r.result == {
        "one": {"email": "u3@example.com"},
        "none": None,
        "engaged": [{"user_id": "u1"}, {"user_id": "u2"}],
    }


def test_find_many_refuses_to_cut_a_result_silently(registry):
    for i in range(3):
        CustomerFactory(user_id=f"c{i}")
    r = run([s.read.find_many("rows", "shop.Customer", {}, limit=2)])
    assert r.status == RunStatus.FAILED
    assert "more than 2 rows match" in r.last_error
    WorkflowRun.objects.all().delete()
    registry.unregister("wf")
    r = run(
        [
            s.read.find_many("rows", "shop.Customer", {}, limit=2, truncate=True),
            s.return_(lambda ctx: len(ctx.steps["rows"])),
        ]
    )
    assert r.result == 2


def test_model_create_update_with_optimistic_lock_upsert_delete(registry):
    r = run(
        [
            s.model.create("c", "shop.Customer", lambda ctx: {"user_id": "m1", "email": "m@x.io"}),
            s.model.update(
                "u",
                "shop.Customer",
                pk=lambda ctx: ctx.steps["c"]["id"],
                values={"engaged": True},
                version_field="version",
                expected_version=1,
            ),
            s.model.upsert("up", "shop.Customer", {"user_id": "m2"}, {"email": "m2@x.io"}),
            s.model.upsert("up2", "shop.Customer", {"user_id": "m2"}, {"email": "new@x.io"}),
            s.model.delete("gone", "shop.Customer", {"user_id": "m1"}),
            s.return_(lambda ctx: ctx.steps),
        ]
    )
    assert r.status == RunStatus.COMPLETED, r.last_error
    assert r.result["u"]["engaged"] is True
    assert r.result["u"]["version"] == 2
    assert r.result["up"]["created"] is True
    assert r.result["up2"]["created"] is False
    assert r.result["gone"] == {"deleted": 1}
    assert list(Customer.objects.values_list("user_id", "email")) == [("m2", "new@x.io")]


def test_model_update_with_a_stale_version_fails_and_changes_nothing(registry):
    customer = CustomerFactory.create(user_id="stale", version=3)
    r = run(
        [
            s.model.update(
                "u",
                Customer,
                pk=customer.pk,
                values={"engaged": True},
                version_field="version",
                expected_version=2,
            )
        ]
    )
    assert r.status == RunStatus.FAILED
    assert r.last_error.startswith("StaleVersion at step 0")
    customer.refresh_from_db()
    assert (customer.engaged, customer.version) == (False, 3)


def test_call_invokes_a_registered_handler(registry):
    @s.handler("tests.double")
    def double(payload):
        return payload["n"] * 2

    r = run(
        [s.call("d", "tests.double", lambda ctx: {"n": 21}), s.return_(lambda ctx: ctx.steps["d"])]
    )
    assert r.result == 42
    with pytest.raises(ValueError, match="already registered"):
        s.handler("tests.double")(lambda p: p)


def test_append_event_writes_a_domain_event_that_starts_another_workflow(registry):
    define_workflow(
        "child", trigger=on_event("order.shipped"), steps=[s.return_(lambda ctx: ctx.event.payload)]
    )
    r = run(
        [
            s.append_event(
                lambda ctx: "order-9",
                "order.shipped",
                payload=lambda ctx: {"order": 9},
                name="shipped",
            ),
            s.return_(lambda ctx: ctx.steps["shipped"]),
        ]
    )
    shipped = Event.objects.get(type="order.shipped")
    assert r.result["position"] == shipped.position
    assert shipped.metadata == {"run_id": str(r.id), "workflow": "wf"}
    child = WorkflowRun.objects.get(workflow="child")
    assert child.result == {"order": 9}
    assert child.trigger_position == shipped.position


def test_mail_and_webhook_only_write_outbox_requests(registry, mailoutbox):
    r = run(
        [
            s.mail_send(to="a@x.io", subject="Hi", body="text", html="<b>hi</b>", cc=["c@x.io"]),
            s.webhook_send(
                "https://hooks.example.com/x", body={"a": 1}, headers={"X-A": "1"}, name="hook"
            ),
            s.return_(lambda ctx: ctx.steps["hook"]),
        ]
    )
    assert mailoutbox == []
    mail, hook = Dispatch.objects.order_by("step_path")
    assert (mail.kind, mail.status, mail.request["cc"]) == ("mail", "pending", ["c@x.io"])
    assert hook.request == {
        "url": "https://hooks.example.com/x",
        "method": "POST",
        "headers": {"X-A": "1"},
        "secret": None,
        "timeout": None,
        "body": {"a": 1},
    }
    assert r.result == {"dispatch_id": str(hook.id)}


@pytest.mark.parametrize(
    ("step", "error"),
    [
        (s.webhook_send("ftp://files.example.com/x"), "only http and https"),
        (
            s.webhook_send("https://x.example.com", body=lambda ctx: {"when": object()}),
            "not JSON-serialisable",
        ),
        (s.mail_send(to=[], subject="s", body="b"), "at least one recipient"),
    ],
)
def test_an_undeliverable_request_is_dead_at_once_and_the_run_goes_on(registry, step, error):
    r = run([step, s.return_("done")])
    assert r.status == RunStatus.COMPLETED
    dispatch = Dispatch.objects.get()
    assert dispatch.status == "dead"
    assert error in dispatch.last_error


def test_a_user_registered_step_kind(registry):
    class Shout(StepKind):
        kind = "tests.shout"
        resolver_args = ("text",)

        def execute(self, step, ctx, path, resume):
            return s.resolve(step.args["text"], ctx).upper()

    with step_kinds.isolated():
        register_step_kind(Shout())
        r = run(
            [
                Step("tests.shout", "loud", {"text": lambda ctx: "hi"}),
                s.return_(lambda ctx: ctx.steps["loud"]),
            ]
        )
        assert r.result == "HI"
        with pytest.raises(ValueError, match="already registered"):
            register_step_kind(type("Other", (StepKind,), {"kind": "tests.shout"})())
    assert "tests.shout" not in step_kinds
