"""The definition fingerprint (B11-B13) and what changes it."""

from __future__ import annotations

import datetime as dt
import enum
import functools
import os
import subprocess
import sys
import uuid
from decimal import Decimal

import pytest
from django.db.models import Q

from kumiflow_django import define_workflow, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.definition.step import walk
from kumiflow_django.models import Dispatch
from testproject.shop.models import Customer, Order, Tally
from tests.processes import ROOT

LIMIT = 3


def build(event_type="x", extra=(), fn=None):
    return define_workflow(
        "fp",
        trigger=on_event(event_type),
        steps=[s.compute("a", fn or (lambda ctx: ctx.event.payload["n"] + 1)), *extra],
        register=False,
    )


def test_identical_definitions_hash_the_same_B11():
    assert build().fingerprint == build().fingerprint
    assert len(build().fingerprint) == 64


def test_adding_a_step_changes_it_B12():
    assert build().fingerprint != build(extra=[s.compute("noop", lambda ctx: None)]).fingerprint


def test_changing_the_trigger_changes_it_B13():
    assert build("x").fingerprint != build("y").fingerprint


def test_changing_a_resolvers_code_changes_it():
    assert (
        build(fn=lambda ctx: ctx.event.payload["n"] + 1).fingerprint
        != build(fn=lambda ctx: ctx.event.payload["n"] + 2).fingerprint
    )


def test_two_lambdas_on_one_line_are_told_apart():
    one = [s.compute("a", lambda ctx: 1), s.compute("b", lambda ctx: 2)]  # noqa: E501
    two = [s.compute("a", lambda ctx: 1), s.compute("b", lambda ctx: 3)]  # noqa: E501
    wf1 = define_workflow("fp2", steps=one, register=False)
    wf2 = define_workflow("fp2", steps=two, register=False)
    assert wf1.fingerprint != wf2.fingerprint


def test_a_constant_the_resolver_reads_is_part_of_it():
    def limited(ctx):
        return min(ctx.event.payload["n"], LIMIT)

    before = build(fn=limited).fingerprint
    global LIMIT
    LIMIT = 4
    try:
        assert build(fn=limited).fingerprint != before
    finally:
        LIMIT = 3


def test_a_changed_filter_changes_it():
    a = define_workflow("f", trigger=on_event("x", filter=lambda e: True), steps=[], register=False)
    b = define_workflow(
        "f", trigger=on_event("x", filter=lambda e: False), steps=[], register=False
    )
    assert a.fingerprint != b.fingerprint


# --- the same fingerprint in every process ----------------------------------

RATE = 0.2


class Status(enum.Enum):
    PAID = "paid"


@s.handler("tests.fingerprint.double")
def double(payload):
    return payload * 2


def every_kind():
    """One workflow with every built-in step kind, with and without their
    optional arguments: what another process must fingerprint the same."""
    threshold = 10  # a closure over a primitive

    def over_threshold(ctx, limit=threshold):
        return ctx.event.payload.get("n", 0) > limit

    return define_workflow(
        "every-kind",
        trigger=on_event("order.placed", filter=lambda e: e.payload.get("n") != 0),
        version=3,
        steps=[
            s.compute("n", lambda ctx: ctx.event.payload.get("n", 0) * RATE),
            s.compute("kind", lambda ctx: ctx.event.type in {"a", "b", "c", "d"}),
            s.read.find_one("customer", Customer, {"user_id": "u1"}),
            s.read.find_many(
                "orders",
                "shop.Order",
                Q(status__in={"placed", "paid", "shipped", "cancelled"}) & ~Q(total_cents=0),
                order_by=("-created_at",),
                fields=("id", "status"),
                limit=10,
                truncate=True,
            ),
            s.read.find_many("all_orders", Order),
            s.model.create("tally", Tally, {"key": "k", "count": 1}),
            s.model.update(
                "customer2",
                "shop.Customer",
                pk=1,
                values={"engaged": True},
                version_field="version",
                expected_version=lambda ctx: 1,
            ),
            s.model.upsert("tally2", "shop.Tally", {"key": "k"}, {"count": 2}),
            s.model.delete("gone", Tally, Q(key="old")),
            s.branch(
                over_threshold,
                then=[s.compute("big", functools.partial(max, 1))],
                else_=[s.wait(dt.timedelta(minutes=5))],
            ),
            s.for_each(
                lambda ctx: [1, 2],
                "item",
                do=[
                    s.wait("PT1M"),
                    s.call("doubled", "tests.fingerprint.double", lambda ctx: ctx.scope["item"]),
                ],
            ),
            s.call("tripled", lambda payload: payload * 3, 2),
            s.call("length", len, [1, 2]),
            s.wait(dt.datetime(2030, 1, 1, tzinfo=dt.UTC)),
            s.retry(
                [
                    s.webhook_send("https://hooks.example.com/a"),  # no body
                    s.webhook_send(
                        "https://hooks.example.com/b",
                        body={"paid": Status.PAID, "at": dt.date(2030, 1, 1)},
                        method="PUT",
                        headers={"X-Id": "1"},
                        secret="partner",
                        timeout=(1.0, 5.0),
                        retry={"attempts": 2},
                        await_delivery=True,
                        name="hook",
                    ),
                ],
                attempts=4,
                backoff="linear",
                base=dt.timedelta(seconds=5),
                max_delay="PT1H",
                jitter=0.1,
                on=(ConnectionError, TimeoutError),
            ),
            s.retry([s.compute("plain", lambda ctx: 1)]),
            s.mail_send("a@example.com", "Hi", "Body"),
            s.mail_send(
                to=lambda ctx: ["b@example.com"],
                subject="Receipt",
                body=lambda ctx: f"{ctx.steps['n']}",
                from_="shop@example.com",
                cc=["c@example.com"],
                bcc=["d@example.com"],
                reply_to="e@example.com",
                html="<b>hi</b>",
                headers={"X-Tag": "receipt"},
                retry={"attempts": 1},
                await_delivery=True,
                name="mail",
            ),
            s.wait_for_event(
                "payment.received",
                match={
                    "payload.order_id": lambda ctx: ctx.event.payload["order_id"],
                    "metadata.source": "shop",
                },
                timeout="P3D",
                name="payment",
            ),
            s.wait_for_event("order.confirmed", match={"stream_id": lambda ctx: "x"}),
            s.wait_for_event("order.closed", timeout=dt.timedelta(days=1)),
            s.task("doubled_later", double, compensate=[s.call(None, len, [1])]),
            s.parallel(
                "both",
                {
                    "left": [s.wait("PT1M"), s.compute("l", lambda ctx: 1)],
                    "right": [s.wait_for_event("order.paid", match={"stream_id": "x"})],
                },
                join="any",
            ),
            s.for_each(
                lambda ctx: [1, 2, 3],
                "n",
                do=[s.compute("per_item", lambda ctx: ctx.scope["n"])],
                parallel=True,
                max_concurrency=2,
                name="items",
            ),
            s.child(
                "sub",
                "every-kind-child",
                input=lambda ctx: {"n": 1},
                idempotency_key=lambda ctx: "k",
                on_failure="result",
                on_parent_cancel="abandon",
            ),
            s.child("fire", "every-kind-child", wait=False),
            s.task(
                "checked",
                double,
                args=lambda ctx: [ctx.steps["n"]],
                timeout="PT1M",
                heartbeat_timeout=10,
                retry={"attempts": 5, "base": 1.0},
                non_retryable=(ValueError,),
                queue="slow",
                on_error="result",
            ),
            s.append_event(lambda ctx: ctx.event.stream_id, "order.settled"),
            s.append_event(
                "audit",
                "order.audited",
                payload={"amount": Decimal("9.90"), "ref": uuid.UUID(int=7)},
                stream_type="audit",
                expected_version=lambda ctx: None,
                name="audited",
            ),
            s.approval(
                "manager",
                choices=["approve", "decline", "escalate"],
                fields={"note": str, "amount": int, "urgent": bool},
                timeout="P1D",
                permission="shop.approve_refund",
            ),
            s.set_attributes(tier="gold", n=lambda ctx: ctx.steps["n"]),
            s.return_(lambda ctx: ctx.steps["n"]),
        ],
        register=False,
    )


def child_fingerprint(seed: str) -> str:
    """``every_kind()``'s fingerprint computed by a fresh interpreter."""
    code = (
        "import django; django.setup(); "
        "from tests.test_fingerprint import every_kind; print(every_kind().fingerprint)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", "PYTHONHASHSEED": seed}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_another_process_computes_the_same_fingerprint():
    """A run started by one process resumes in another: their fingerprints must
    agree, whatever the memory addresses and string hashes of each process."""
    assert [child_fingerprint("1"), child_fingerprint("2")] == [every_kind().fingerprint] * 2


def test_the_every_kind_workflow_uses_every_builder():
    builders = {n for n in s.__all__ if n[0].islower()} - {
        "handler",
        "register_step_kind",
        "resolve",
    }
    kinds = {step.kind for _, step in walk(every_kind().steps)}
    assert {"model", "read"} <= builders
    assert kinds == {
        # an approval is a wait_for_event that declares its choices and fields
        *(b.rstrip("_") for b in builders - {"model", "read", "return_", "approval"}),
        "return",
        *("read." + n for n in ("find_one", "find_many")),
        *("model." + n for n in ("create", "update", "upsert", "delete")),
    }


@pytest.mark.django_db
def test_a_webhook_without_body_requests_none_and_body_none_requests_null(registry):
    define_workflow(
        "hooks",
        steps=[
            s.webhook_send("https://hooks.example.com/a"),
            s.webhook_send("https://hooks.example.com/b", body=None),
        ],
    )
    start_workflow("hooks")
    first, second = Dispatch.objects.order_by("step_path")
    assert "body" not in first.request
    assert second.request["body"] is None
