"""The outbox: webhook delivery against a real receiver on loopback, mail through
the locmem backend, retries, redelivery and cancelling."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json

import pytest
from django.core.management import call_command

from kumiflow_django import (
    InvalidDispatchState,
    cancel_dispatch,
    define_workflow,
    redeliver,
    register_dispatch_kind,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.definition.context import Context
from kumiflow_django.definition.step import Step, StepKind, register_step_kind, step_kinds
from kumiflow_django.models import Dispatch, Event, RunStatus
from kumiflow_django.outbox.kinds import dispatch_kinds
from kumiflow_django.steps.dispatch import request as request_dispatch
from kumiflow_django.testing import run_until_idle
from kumiflow_django.workers.dispatch import DispatchLoop
from tests.receiver import Receiver, Reply

pytestmark = pytest.mark.django_db

SECRET = "s3cret"


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    settings.KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
    settings.KUMIFLOW_WEBHOOK_SECRETS = {"partner": SECRET}
    settings.KUMIFLOW_DISPATCH_RETRY = {
        "attempts": 3,
        "backoff": "exponential",
        "base": 10.0,
        "max_delay": 3600.0,
        "jitter": 0.0,
    }


def send(url, **kwargs):
    define_workflow(
        "hook",
        steps=[s.webhook_send(url, body={"order": 7, "note": "grüße"}, secret="partner", **kwargs)],
    )
    start_workflow("hook")
    return Dispatch.objects.get()


def deliver() -> int:
    return DispatchLoop(batch_size=50).run_once()


def outcome_types(dispatch):
    return [
        e.type.removeprefix("kumiflow.step.")
        for e in Event.objects.filter(stream_id=str(dispatch.id)).order_by("version")
    ]


def test_a_delivered_webhook_is_signed_and_carries_its_idempotency_key(registry, clock):
    with Receiver(Reply(200)) as receiver:
        dispatch = send(receiver.url + "/in")
        assert deliver() == 1

    dispatch.refresh_from_db()
    assert (dispatch.status, dispatch.attempts, dispatch.last_status_code) == ("delivered", 1, 200)
    assert outcome_types(dispatch) == [
        "dispatch-requested",
        "dispatch-attempt-started",
        "dispatched",
    ]
    [request] = receiver.seen
    assert (request.method, request.path) == ("POST", "/in")
    # Compact UTF-8 JSON (PostgreSQL's jsonb keeps keys sorted, so compare parsed).
    assert json.loads(request.body) == {"order": 7, "note": "grüße"}
    assert b" " not in request.body and "grüße".encode() in request.body
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["Idempotency-Key"] == str(dispatch.id)
    timestamp = request.headers["X-Kumiflow-Timestamp"]
    expected = hmac.new(SECRET.encode(), timestamp.encode() + b"." + request.body, hashlib.sha256)
    assert request.headers["X-Kumiflow-Signature"] == "v1=" + expected.hexdigest()
    assert SECRET not in json.dumps(list(Event.objects.values_list("payload", flat=True)))


def test_500_then_success_retries_with_the_same_idempotency_key(registry, clock):
    with Receiver(Reply(500), Reply(200)) as receiver:
        dispatch = send(receiver.url)
        deliver()
        dispatch.refresh_from_db()
        assert (dispatch.status, dispatch.attempts) == ("failed", 1)
        assert dispatch.last_error == "HTTP 500: Internal Server Error"
        assert dispatch.next_attempt_at == clock.now() + dt.timedelta(seconds=10)
        assert deliver() == 0, "not before the backoff is over"
        clock.advance(seconds=10)
        assert deliver() == 1

    dispatch.refresh_from_db()
    assert (dispatch.status, dispatch.attempts) == ("delivered", 2)
    keys = {r.headers["Idempotency-Key"] for r in receiver.seen}
    assert len(receiver.seen) == 2 and keys == {str(dispatch.id)}
    assert outcome_types(dispatch) == [
        "dispatch-requested",
        "dispatch-attempt-started",
        "dispatch-attempt-failed",
        "dispatch-attempt-started",
        "dispatched",
    ]


def test_429_honours_retry_after(registry, clock):
    with Receiver(Reply(429, {"Retry-After": "120"})) as receiver:
        dispatch = send(receiver.url)
        deliver()
    dispatch.refresh_from_db()
    assert dispatch.status == "failed"
    assert dispatch.last_status_code == 429
    assert dispatch.next_attempt_at == clock.now() + dt.timedelta(seconds=120)


def test_a_receiver_that_hangs_times_out_and_is_retried(registry, clock):
    with Receiver(Reply(200, delay=1.0)) as receiver:
        dispatch = send(receiver.url, timeout=(0.5, 0.2))
        deliver()
    dispatch.refresh_from_db()
    assert dispatch.status == "failed"
    assert "timed out" in dispatch.last_error


def test_a_redirect_is_not_followed_and_is_final(registry, clock):
    with Receiver(Reply(302, {"Location": "http://127.0.0.1:1/elsewhere"})) as receiver:
        dispatch = send(receiver.url)
        deliver()
    dispatch.refresh_from_db()
    assert (dispatch.status, dispatch.last_status_code) == ("dead", 302)
    assert "redirects are not followed" in dispatch.last_error
    assert len(receiver.seen) == 1


def test_404_is_final_and_says_why(registry, clock):
    with Receiver(Reply(404)) as receiver:
        dispatch = send(receiver.url)
        deliver()
        clock.advance(days=1)
        assert deliver() == 0
    dispatch.refresh_from_db()
    assert (dispatch.status, dispatch.attempts) == ("dead", 1)
    failed = Event.objects.get(stream_id=str(dispatch.id), type="kumiflow.step.dispatch-failed")
    assert failed.payload == {
        "kind": "webhook",
        "attempt": 1,
        "error": "HTTP 404: Not Found",
        "status_code": 404,
    }


def test_garbage_from_the_receiver_is_a_failed_attempt(registry, clock):
    with Receiver(Reply(raw=b"\x00\x01 not http at all\r\n\r\n")) as receiver:
        dispatch = send(receiver.url)
        deliver()
    dispatch.refresh_from_db()
    assert dispatch.status == "failed"
    assert "webhook request failed" in dispatch.last_error


def test_after_the_last_attempt_the_dispatch_is_dead(registry, clock):
    with Receiver(Reply(503)) as receiver:
        dispatch = send(receiver.url)
        for _ in range(3):
            deliver()
            clock.advance(hours=1)
    dispatch.refresh_from_db()
    assert (dispatch.status, dispatch.attempts) == ("dead", 3)
    assert len(receiver.seen) == 3


def test_private_addresses_are_refused_unless_allowed(registry, clock, settings):
    settings.KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = []
    with Receiver() as receiver:
        dispatch = send(receiver.url)
        deliver()
    dispatch.refresh_from_db()
    assert dispatch.status == "dead"
    assert "non-public address 127.0.0.1" in dispatch.last_error
    assert receiver.seen == []


def test_a_missing_secret_is_final(registry, clock, settings):
    settings.KUMIFLOW_WEBHOOK_SECRETS = {}
    with Receiver() as receiver:
        dispatch = send(receiver.url)
        deliver()
    dispatch.refresh_from_db()
    assert dispatch.status == "dead"
    assert "'partner' is not in KUMIFLOW_WEBHOOK_SECRETS" in dispatch.last_error


def test_redeliver_a_dead_dispatch_and_cancel_a_pending_one(registry, clock):
    with Receiver(Reply(404), Reply(200)) as receiver:
        dispatch = send(receiver.url)
        deliver()
        with pytest.raises(InvalidDispatchState):
            cancel_dispatch(dispatch.id)
        redeliver(dispatch.id)
        assert deliver() == 1
    dispatch.refresh_from_db()
    assert dispatch.status == "delivered"
    assert [r.headers["Idempotency-Key"] for r in receiver.seen] == [str(dispatch.id)] * 2

    with pytest.raises(InvalidDispatchState, match="only dead or cancelled"):
        redeliver(dispatch.id)

    Dispatch.objects.all().delete()
    registry.unregister("hook")
    other = send("https://hooks.example.com/never")
    cancel_dispatch(other.id, reason="customer left")
    assert deliver() == 0
    other.refresh_from_db()
    assert (other.status, other.last_error) == ("cancelled", "customer left")


def test_mail_goes_through_the_configured_backend(registry, clock, mailoutbox):
    define_workflow(
        "mail",
        steps=[
            s.mail_send(
                to="ada@example.com",
                subject="Hello",
                body="plain text",
                html="<p>rich</p>",
                from_="shop@example.com",
                cc=["cc@example.com"],
                bcc=["bcc@example.com"],
                reply_to="help@example.com",
                headers={"X-Campaign": "welcome"},
            )
        ],
    )
    start_workflow("mail")
    assert deliver() == 1
    [message] = mailoutbox
    assert message.subject == "Hello"
    assert message.body == "plain text"
    assert message.from_email == "shop@example.com"
    assert message.to == ["ada@example.com"]
    assert message.cc == ["cc@example.com"]
    assert message.bcc == ["bcc@example.com"]
    assert message.reply_to == ["help@example.com"]
    assert message.alternatives[0][0] == "<p>rich</p>"
    assert message.extra_headers["X-Campaign"] == "welcome"
    assert message.extra_headers["X-Kumiflow-Dispatch"] == str(Dispatch.objects.get().id)


def test_a_registered_dispatch_kind(registry, clock):
    sent = []
    with dispatch_kinds.isolated(), step_kinds.isolated():
        register_dispatch_kind(
            "sms",
            lambda request, dispatch: sent.append((request["to"], request["text"])),
            check=lambda request: None if request.get("to") else "an sms needs a number",
        )

        class SmsSend(StepKind):
            kind = "tests.sms_send"

            def execute(self, step, ctx: Context, path, resume):
                return request_dispatch(ctx, path, "sms", dict(step.args), None)

        register_step_kind(SmsSend())
        define_workflow(
            "sms", steps=[Step("tests.sms_send", None, {"to": "+49 30 1234", "text": "hi"})]
        )
        start_workflow("sms")
        deliver()
        assert sent == [("+49 30 1234", "hi")]
        assert Dispatch.objects.get().status == "delivered"
    assert "sms" not in dispatch_kinds and "tests.sms_send" not in step_kinds


@pytest.mark.parametrize(("reply", "branch"), [(Reply(200), "sent"), (Reply(404), "not sent")])
def test_a_run_can_wait_for_its_delivery_and_branch_on_the_outcome(registry, clock, reply, branch):
    with Receiver(reply) as receiver:
        define_workflow(
            "careful",
            steps=[
                s.webhook_send(receiver.url, body={}, await_delivery=True, name="delivery"),
                s.branch(
                    lambda ctx: ctx.steps["delivery"]["delivered"],
                    then=[s.compute("said", lambda ctx: "sent")],
                    else_=[s.compute("said", lambda ctx: "not sent")],
                ),
                s.return_(lambda ctx: ctx.steps["said"]),
            ],
        )
        run = start_workflow("careful")
        assert run.status == RunStatus.WAITING_EVENT
        run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, branch)


def test_prune_removes_old_delivered_dispatches_and_their_streams(registry, clock):
    with Receiver() as receiver:
        dispatch = send(receiver.url)
        deliver()
    clock.advance(days=31)
    call_command("kumiflow_prune_outbox", "--dry-run", verbosity=0)
    assert Dispatch.objects.exists()
    call_command("kumiflow_prune_outbox", "--min-age-days", "30", verbosity=0)
    assert not Dispatch.objects.exists()
    assert not Event.objects.filter(stream_id=str(dispatch.id)).exists()
