"""A workflow that awaits its webhook gets the response: status, headers, body."""

from __future__ import annotations

import json

import pytest

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import Dispatch, Event, RunStatus
from kumiflow_django.testing import run_until_idle
from tests.receiver import Receiver, Reply

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _loopback(settings):
    settings.KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]


def call_api(url: str, **options) -> dict:
    define_workflow(
        "api-call",
        steps=[
            s.webhook_send(url, body={"q": 1}, await_delivery=True, name="api", **options),
            s.return_(lambda ctx: ctx.steps["api"]),
        ],
    )
    run = start_workflow("api-call")
    run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.last_error
    assert isinstance(run.result, dict)
    return run.result


def test_a_json_answer_is_decoded_and_the_default_headers_are_kept(registry, clock):
    answer = {"id": "ch_1", "amount": 1250, "tags": ["a", "é"]}
    reply = Reply(
        201,
        {
            "Content-Type": "application/json; charset=utf-8",
            "ETag": '"v1"',
            "Set-Cookie": "session=secret",
            "X-Internal": "no",
        },
        body=json.dumps(answer).encode(),
    )
    with Receiver(reply) as receiver:
        result = call_api(receiver.url)
    assert result["delivered"] is True and result["status_code"] == 201
    assert result["body"] == answer
    assert result["truncated"] is False
    assert result["headers"]["ETag"] == '"v1"'
    assert "Set-Cookie" not in result["headers"] and "X-Internal" not in result["headers"]


def test_named_headers_are_the_ones_returned(registry, clock):
    reply = Reply(200, {"X-Rate-Remaining": "9", "ETag": "e"}, body=b"plain")
    with Receiver(reply) as receiver:
        result = call_api(receiver.url, response_headers=["x-rate-remaining"])
    assert result["headers"] == {"x-rate-remaining": "9"}
    assert result["body"] == "plain"


def test_text_that_claims_to_be_json_stays_text(registry, clock):
    reply = Reply(200, {"Content-Type": "application/json"}, body=b"{not json")
    with Receiver(reply) as receiver:
        result = call_api(receiver.url)
    assert result["body"] == "{not json"


def test_a_body_larger_than_the_setting_is_cut_and_marked(registry, clock, settings):
    settings.KUMIFLOW_MAX_RESULT_BYTES = 100
    body = json.dumps({"data": "x" * 500}).encode()
    reply = Reply(200, {"Content-Type": "application/json"}, body=body)
    with Receiver(reply) as receiver:
        result = call_api(receiver.url)
    assert result["truncated"] is True
    assert result["body"] == body[:100].decode()


def test_a_nul_in_the_answer_is_stored_safely(registry, clock):
    reply = Reply(200, {"Content-Type": "text/plain"}, body=b"a\x00b")
    with Receiver(reply) as receiver:
        result = call_api(receiver.url)
    assert "\x00" not in result["body"]


def test_a_refused_request_keeps_the_answer_for_the_workflow_to_read(registry, clock):
    reply = Reply(422, {"Content-Type": "application/json"}, body=b'{"error": "bad card"}')
    with Receiver(reply) as receiver:
        result = call_api(receiver.url)
    assert result["delivered"] is False and result["status_code"] == 422
    assert result["body"] == {"error": "bad card"}


def test_without_await_no_answer_is_kept(registry, clock):
    with Receiver(Reply(200, body=b"confidential answer")) as receiver:
        define_workflow("fire", steps=[s.webhook_send(receiver.url, body={})])
        start_workflow("fire")
        run_until_idle()
    dispatch = Dispatch.objects.get()
    assert "capture_response" not in dispatch.request
    assert "confidential" not in json.dumps(list(Dispatch.objects.values()), default=str)
    events = Event.objects.filter(stream_id=str(dispatch.id)).values_list("payload", flat=True)
    assert "confidential" not in json.dumps(list(events))


def test_response_headers_need_await_delivery(registry):
    with pytest.raises(ValueError, match="needs await_delivery=True"):
        s.webhook_send("https://example.com", response_headers=["ETag"])
