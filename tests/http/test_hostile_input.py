"""What a hostile caller sends the API: crafted cursors, bodies nested past the
parser, text the schema and the engine could read differently, an operator
token without the permission to read. Each answer is a 4xx JSON error that
names its field, or an answer that shows no more than the caller may see;
never a 500, and nothing changes on a refusal."""

from __future__ import annotations

import base64
import json

import pytest
from django.test import Client, override_settings

from kumiflow_django import define_workflow
from kumiflow_django import steps as s
from kumiflow_django.http import tokens
from kumiflow_django.models import Event, WorkflowRun
from tests.http.conftest import API

pytestmark = pytest.mark.django_db


def error(response):
    return response.json()["error"]


def cursor(value) -> str:
    raw = value if isinstance(value, str) else json.dumps(value)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "crafted",
    [
        cursor(["2024-01-01T00:00:00+00:00", 5]),
        cursor(["2024-01-01T00:00:00+00:00", ["x"]]),
        cursor([5, "0b7c2f6e-58b8-4c1e-9a62-0d4b5d1f3a10"]),
        cursor(["0001-01-01T00:00:00+14:00", "0b7c2f6e-58b8-4c1e-9a62-0d4b5d1f3a10"]),
        cursor(["9999-12-31T23:59:59-14:00", "0b7c2f6e-58b8-4c1e-9a62-0d4b5d1f3a10"]),
        cursor("[" * 100_000 + "]" * 100_000),
        cursor({"a": 1}),
        cursor(["2024-01-01T00:00:00+00:00"]),
        "x" * 5000,
    ],
)
def test_a_crafted_cursor_is_a_400_on_cursor(api, crafted):
    response = api.get(f"{API}runs/", {"cursor": crafted})
    assert response.status_code == 400, response.content
    assert error(response)["field"] == "cursor"


@pytest.mark.parametrize("path", ["runs/", "events/"])
def test_a_body_nested_deeper_than_the_parser_goes_is_a_400(api, path):
    deep = "[" * 100_000 + "]" * 100_000
    fields = '"workflow": "approval", "stream_id": "s", "type": "t"'
    body = "{" + fields + ', "payload": {"a": ' + deep + "}}"
    response = api.post(f"{API}{path}", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "nested too deeply" in error(response)["message"]
    assert not Event.objects.exists()


def test_a_body_larger_than_the_server_takes_is_a_json_400(api):
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000):
        response = api.post_json(
            f"{API}events/", {"stream_id": "s", "type": "t", "payload": {"a": "x" * 2000}}
        )
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in error(response)["message"]
    assert not Event.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        # "$" of a JSON Schema pattern ends the text: a final newline is not let through
        ({"stream_id": "s\n", "type": "t"}, "stream_id"),
        ({"stream_id": "s", "type": "t\n"}, "type"),
        ({"stream_id": "s", "type": "t", "stream_type": "order\n"}, "stream_type"),
        ({"stream_id": "s\ud800", "type": "t"}, "stream_id"),
        ({"stream_id": "s", "type": "t", "payload": {"a": "\ud800"}}, "payload"),
        ({"stream_id": "s", "type": "t", "metadata": {"a": "\udfff"}}, "metadata"),
        ({"stream_id": "s", "type": "t", "payload": {"a": float("nan")}}, "payload"),
    ],
)
def test_an_append_the_engine_would_refuse_names_its_field(api, body, field):
    raw = json.dumps(body)  # NaN and lone surrogates as a sender's JSON has them
    response = api.post(f"{API}events/", raw, content_type="application/json")
    assert response.status_code == 400, response.content
    assert error(response)["field"] == field
    assert not Event.objects.exists()


def test_a_payload_too_large_for_the_store_names_the_payload(api):
    with override_settings(KUMIFLOW_MAX_VALUE_BYTES=100):
        response = api.post_json(
            f"{API}events/", {"stream_id": "s", "type": "t", "metadata": {"a": "x" * 200}}
        )
    assert response.status_code == 400 and error(response)["field"] == "metadata"


def test_an_idempotency_key_the_engine_refuses_names_the_key(api, approval):
    response = api.post_json(
        f"{API}runs/", {"workflow": "approval", "idempotency_key": "k\n", "payload": {"order": 1}}
    )
    assert response.status_code == 400, response.content
    assert error(response)["field"] == "idempotency_key"
    assert not WorkflowRun.objects.exists()


@pytest.fixture
def sleepy(registry):
    return define_workflow("sleepy", steps=[s.wait("PT1H"), s.compute("done", lambda ctx: 1)])


def test_api_operations_record_who_and_why_on_the_runs_events(token_client, sleepy):
    ops = token_client(*tokens.API_PERMISSIONS)
    run = ops.post_json(f"{API}runs/", {"workflow": "sleepy"}).json()
    assert ops.post_json(f"{API}runs/{run['id']}/wake/", {"reason": "ticket 42"}).status_code == 200
    cancelled = ops.post_json(f"{API}runs/{run['id']}/cancel/", {"reason": "customer asked"})
    assert cancelled.status_code == 200
    events = {e.type: e for e in Event.objects.filter(stream_id=run["id"])}
    woken, stopped = (
        events["kumiflow.workflow.run-woken"],
        events["kumiflow.workflow.run-cancelled"],
    )
    assert woken.payload == {"by": "token:test-0", "reason": "ticket 42"}
    assert stopped.payload["by"] == "token:test-0" and stopped.payload["reason"] == "customer asked"


@pytest.mark.parametrize("reason", ["a\u0000b", "\ud800", "x" * 501])
@pytest.mark.parametrize("operation", ["wake", "cancel"])
def test_a_reason_the_audit_refuses_is_a_400_on_reason_and_changes_nothing(
    api, sleepy, operation, reason
):
    run = api.post_json(f"{API}runs/", {"workflow": "sleepy"}).json()
    before = Event.objects.count()
    response = api.post(
        f"{API}runs/{run['id']}/{operation}/",
        json.dumps({"reason": reason}),
        content_type="application/json",
    )
    assert response.status_code == 400, response.content
    assert error(response)["field"] == "reason"
    assert Event.objects.count() == before
    assert WorkflowRun.objects.get(id=run["id"]).status == "waiting"


def test_an_operator_token_without_view_gets_the_summary_not_the_run(token_client, sleepy):
    starter = token_client(tokens.START)
    run = starter.post_json(
        f"{API}runs/", {"workflow": "sleepy", "payload": {"card": "4242"}}
    ).json()
    waker = token_client(tokens.WAKE)
    answer = waker.post_json(f"{API}runs/{run['id']}/wake/").json()
    assert answer["id"] == run["id"] and answer["status"] == "waiting"
    assert "input" not in answer and "steps" not in answer and "result" not in answer
    viewer = token_client(tokens.WAKE, tokens.VIEW)
    assert viewer.post_json(f"{API}runs/{run['id']}/wake/").json()["input"] == {"card": "4242"}


def test_head_is_get_without_a_body_and_options_says_what_is_allowed(api, approval):
    get, head = api.get(f"{API}runs/"), api.head(f"{API}runs/")
    assert (head.status_code, head["Content-Type"]) == (get.status_code, get["Content-Type"])
    assert head.content == b""
    assert api.head(f"{API}openapi.json").status_code == 200
    options = api.options(f"{API}runs/")
    assert (options.status_code, options["Allow"]) == (204, "GET, HEAD, POST, OPTIONS")
    assert api.options(f"{API}events/")["Allow"] == "POST, OPTIONS"
    # HEAD asks as GET does: the same authentication
    assert Client().head(f"{API}runs/").status_code == 401


def test_a_key_given_twice_is_refused_not_read_one_way(api, approval):
    body = '{"workflow": "nope", "workflow": "approval", "payload": {"order": 1}}'
    response = api.post(f"{API}runs/", body, content_type="application/json")
    assert response.status_code == 400 and "'workflow' appears twice" in error(response)["message"]
    nested = '{"stream_id": "s", "type": "t", "payload": {"a": 1, "a": 2}}'
    assert api.post(f"{API}events/", nested, content_type="application/json").status_code == 400
    assert not WorkflowRun.objects.exists() and not Event.objects.exists()


@pytest.mark.parametrize("raw", ["1_0", "+2", " 3 ", "\uff13", "1e2", "9" * 40])
def test_a_query_integer_is_ascii_digits_only(api, raw):
    response = api.get(f"{API}runs/", {"limit": raw})
    assert response.status_code == 400 and error(response)["field"] == "limit"


def _reason_samples() -> list[str]:
    """Each character of the C0 and C1 ranges, DEL, the white space that trimming
    removes, lone surrogates and a few plain ones, alone, inside text and at
    either end; CR LF, and white space around a control character."""
    chars = [chr(c) for c in (*range(0x00, 0x21), *range(0x7F, 0xA1))]
    chars += ["\u1680", "\u2000", "\u200a", "\u200b", "\u2028", "\u2029", "\u202f", "\u3000"]
    chars += ["\ud800", "\udbff", "\udc00", "\udfff", "\ufeff", "é", "\U0001f600", "a"]
    samples = ["", "\r\n", "line\r\nline", "\t\x01 ", " \x0b\x1f x \x85", "x \x1f y"]
    for ch in chars:
        samples += [ch, f"a{ch}b", f"{ch}a", f"a{ch}", f" {ch} ", f"{ch}\x01", ch * 3]
    return samples


def test_the_reason_schema_refuses_exactly_what_the_audit_refuses():
    """The OpenAPI document says what the check does: a client that validates
    against the schema is never surprised by a 400 on reason, nor the reverse."""
    from kumiflow_django.http import schema
    from kumiflow_django.http.errors import ApiError
    from kumiflow_django.store.audit import check_operator
    from kumiflow_django.store.errors import InvalidEvent

    def audit_takes(reason: str) -> bool:
        try:
            check_operator("", reason)
        except InvalidEvent:
            return False
        return True

    reasons = {
        name: schema.COMPONENTS[name]["properties"]["reason"]
        for name in ("CancelRun", "WakeRun", "RetryRun")
    }
    assert all("pattern" in r for r in reasons.values())
    samples = _reason_samples()
    assert not all(map(audit_takes, samples)) and any(map(audit_takes, samples))
    for name, reason_schema in reasons.items():
        for sample in samples:
            try:
                schema.validate(sample, reason_schema, "reason")
                schema_takes = True
            except ApiError as exc:
                assert (exc.field, exc.message) == (
                    "reason",
                    "must not contain control characters other than tabs and line breaks",
                )
                schema_takes = False
            assert schema_takes == audit_takes(sample), (name, ascii(sample))


@pytest.mark.parametrize(
    ("reason", "status"),
    [("a\x7fb", 400), ("a\x85b", 400), ("a\x1bb", 400), ("two\r\nlines\tand a tab", 200)],
)
def test_a_reason_is_refused_by_the_schema_as_documented(api, sleepy, reason, status):
    run = api.post_json(f"{API}runs/", {"workflow": "sleepy"}).json()
    response = api.post_json(f"{API}runs/{run['id']}/wake/", {"reason": reason})
    assert response.status_code == status, response.content
    if status == 400:
        assert error(response)["field"] == "reason"
        assert "control characters other than tabs and line breaks" in error(response)["message"]
