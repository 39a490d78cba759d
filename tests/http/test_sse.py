"""Live run streams, in process: the frames, resuming, the end, WSGI and ASGI iterators.

The streams under a real ASGI server, with LISTEN on PostgreSQL, are in
test_live.py; here the view and the iterators are driven directly.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, connections
from django.test import AsyncClient, AsyncRequestFactory, RequestFactory, override_settings
from django.utils import timezone

from kumiflow_django import append_event, start_workflow
from kumiflow_django.http import sse
from kumiflow_django.http.auth import Principal, authenticate
from kumiflow_django.http.errors import STATUSES
from kumiflow_django.http.models import ApiToken
from kumiflow_django.http.sse import HEARTBEAT, OPENED, RunStream, Snapshot, StreamSpec
from kumiflow_django.http.tokens import API_PERMISSIONS, create_token, revoke_token
from kumiflow_django.models import RunStatus
from tests.http.conftest import API, TokenClient

pytestmark = pytest.mark.django_db


def parse(raw: bytes) -> list[dict]:
    """SSE messages as dicts of their fields; comments as {"comment": ...}."""
    messages = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        message: dict = {}
        for line in block.split("\n"):
            name, _, value = line.partition(": ")
            message[name or "comment"] = value
        messages.append(message)
    return messages


class ManualClock(sse.Clock):
    """A stream's clock that only moves when the stream waits: a poll's sleep
    advances it at once. So a heartbeat comes after so many empty polls, the
    same on an idle machine and a loaded one, and never while a test is busy."""

    def __init__(self) -> None:
        self.time = 1000.0

    def now(self) -> float:
        return self.time

    def sleep(self, seconds: float) -> None:
        self.time += seconds

    async def asleep(self, seconds: float) -> None:
        self.time += seconds


@pytest.fixture
def viewer(db):
    """A token's caller, as the view authenticates it (the stream asks again)."""
    _, secret = create_token("viewer", permissions=API_PERMISSIONS)
    request = RequestFactory().get("/", HTTP_AUTHORIZATION=f"Bearer {secret}")
    return authenticate(request)


def finished_run(approval):
    run = start_workflow("approval", payload={"order": "o-1"})
    append_event("o-1", "order.approved", {"order": "o-1", "by": "ann"})
    append_event("o-1", "order.shipped", {"order": "o-1"})
    run.refresh_from_db()
    assert (run.status, run.version) == (RunStatus.COMPLETED, 6)
    return run


TYPES = [
    "run-started",
    "step.waiting-for-event",
    "step.resumed",
    "step.waiting-for-event",
    "step.resumed",
    "run-completed",
]


def test_a_finished_run_streams_its_events_then_the_end_then_closes(api, approval):
    run = finished_run(approval)
    response = api.get(f"{API}runs/{run.id}/events/")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    messages = parse(b"".join(response.streaming_content))  # ends by itself
    assert messages[0] == {"comment": "connected"}
    events, end = messages[1:-1], messages[-1]
    assert [m["id"] for m in events] == ["1", "2", "3", "4", "5", "6"]
    assert [m["event"].removeprefix("kumiflow.workflow.") for m in events] == TYPES
    data = json.loads(events[-1]["data"])
    assert (data["version"], data["stream_id"], data["payload"]["result"]) == (
        6,
        str(run.id),
        {"order": "o-1", "by": "ann"},
    )
    assert end == {"event": "end", "data": '{"status":"completed","stream_version":6}'}


def test_last_event_id_resumes_after_it_and_a_finished_stream_answers_204(api, approval):
    run = finished_run(approval)
    url = f"{API}runs/{run.id}/events/"
    rest = parse(b"".join(api.get(url, HTTP_LAST_EVENT_ID="4").streaming_content))
    assert [m.get("id") for m in rest[1:]] == ["5", "6", None]
    by_query = parse(b"".join(api.get(url, {"last_event_id": 5}).streaming_content))
    assert [m.get("id") for m in by_query[1:]] == ["6", None]
    header_wins = api.get(url, {"last_event_id": 1}, HTTP_LAST_EVENT_ID="5")
    assert [m.get("id") for m in parse(b"".join(header_wins.streaming_content))[1:]] == ["6", None]
    assert api.get(url, HTTP_LAST_EVENT_ID="6").status_code == 204
    for bad in ("x", "-1", "1.5"):
        response = api.get(url, HTTP_LAST_EVENT_ID=bad)
        assert response.status_code == 400
        assert response.json()["error"]["field"] == "Last-Event-ID"


def test_under_asgi_the_stream_is_an_async_iterator(token_client, approval):
    from kumiflow_django.http.tokens import create_token

    run = finished_run(approval)
    _, secret = create_token("asgi", permissions=["view_workflowrun"])

    async def follow():
        # Headers per request: AsyncClient(headers=...) loses them on Django 6.1.3.
        response: Any = await AsyncClient().get(
            f"{API}runs/{run.id}/events/", headers={"Authorization": f"Bearer {secret}"}
        )
        assert response.is_async
        return [chunk async for chunk in response.streaming_content]

    with override_settings(KUMIFLOW_SSE_LISTEN=False):
        chunks = async_to_sync(follow)()
    messages = parse(b"".join(chunks))
    assert [m.get("id") for m in messages[1:]] == ["1", "2", "3", "4", "5", "6", None]


def test_frames_are_sent_once_and_the_end_only_when_caught_up():
    stream = RunStream(after=1)

    def row(version):
        return (
            version,
            "00000000-0000-0000-0000-000000000000",
            "t",
            "workflow-run",
            "r",
            version,
            f"type-{version}",
            1,
            "{}",
            "{}",
            None,
            "",
        )

    snapshot = Snapshot("completed", 3, [row(1), row(2)])  # a read cut short (BATCH)
    assert [f.split(b"\n")[0] for f in stream.frames(snapshot)] == [b"id: 2"]
    assert not stream.done, "version 3 is not sent yet"
    assert stream.frames(Snapshot("completed", 3, [row(2), row(3)]))[-1].startswith(b"event: end")
    assert (stream.done, stream.last) == (True, 3)
    assert RunStream(after=0).frames(Snapshot("running", 0, [])) == []
    gone = RunStream(after=5)
    assert gone.frames(Snapshot(None, 0, [])) == [
        b'event: end\ndata: {"status":null,"stream_version":0}\n\n'
    ]


def spec_of(run, principal: Principal, after=0, listen=None) -> StreamSpec:
    return StreamSpec(str(run.id), run.tenant_id, after, "default", listen, principal)


def heads(frames, count: int) -> list[bytes]:
    return [next(frames).split(b"\n")[0] for _ in range(count)]


def test_a_polling_stream_sends_heartbeats_while_waiting_and_events_as_they_come(approval, viewer):
    run = start_workflow("approval", payload={"order": "o-1"})
    clock = ManualClock()
    with override_settings(KUMIFLOW_SSE_HEARTBEAT=15, KUMIFLOW_SSE_POLL_INTERVAL=1):
        frames = sse.stream(spec_of(run, viewer), clock)
        assert next(frames) == OPENED
        assert heads(frames, 2) == [b"id: 1", b"id: 2"]
        quiet_since = clock.now()
        assert next(frames) == HEARTBEAT  # nothing new: a keep-alive comment
        assert clock.now() - quiet_since == 15, "after one heartbeat of quiet, not before"
        append_event("o-1", "order.approved", {"order": "o-1", "by": "ann"})
        assert heads(frames, 2) == [b"id: 3", b"id: 4"]
        append_event("o-1", "order.shipped", {"order": "o-1"})
        rest = list(frames)
    assert [f.split(b"\n")[0] for f in rest] == [b"id: 5", b"id: 6", b"event: end"]


# -- a stream lasts longer than its token may ------------------------------------------------


def error_of(frame: bytes) -> Any:
    [message] = parse(frame)
    assert message["event"] == "error", message
    return json.loads(message["data"])["error"]


def take_away(how: str) -> None:
    """What an operator does to the stream's token while the stream is open."""
    if how == "revoked":
        # what kumiflow_token revoke and the admin do
        assert revoke_token(ApiToken.objects.get().name)
    elif how == "expired":
        ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    elif how == "no-view":  # may no longer view runs
        ApiToken.objects.update(permissions=["kumiflow.append_event"])
    else:  # moved to another tenant: the run is not one it sees
        ApiToken.objects.update(tenant_id="elsewhere")


CODES = {
    "revoked": "unauthenticated",
    "expired": "unauthenticated",
    "no-view": "forbidden",
    "other-tenant": "not_found",
}


@pytest.mark.parametrize("how", list(CODES))
def test_a_stream_sends_nothing_appended_after_its_token_was_taken_away(approval, viewer, how):
    run = start_workflow("approval", payload={"order": "o-1"})
    clock = ManualClock()
    with override_settings(KUMIFLOW_SSE_HEARTBEAT=15, KUMIFLOW_SSE_POLL_INTERVAL=1):
        frames = sse.stream(spec_of(run, viewer), clock)
        assert heads(frames, 3) == [b": connected", b"id: 1", b"id: 2"]
        take_away(how)
        append_event("o-1", "order.approved", {"order": "o-1", "by": "ann"})
        assert error_of(next(frames))["code"] == CODES[how], "not the events 3 and 4"
        assert list(frames) == [], "then the stream closes"


@pytest.mark.parametrize("how", list(CODES))
def test_a_quiet_stream_ends_within_one_heartbeat_of_its_token_taken_away(approval, viewer, how):
    run = start_workflow("approval", payload={"order": "o-1"})
    clock = ManualClock()
    with override_settings(KUMIFLOW_SSE_HEARTBEAT=15, KUMIFLOW_SSE_POLL_INTERVAL=1):
        frames = sse.stream(spec_of(run, viewer), clock)
        assert heads(frames, 3) == [b": connected", b"id: 1", b"id: 2"]
        assert next(frames) == HEARTBEAT, "the token is still good"
        take_away(how)
        since = clock.now()
        assert error_of(next(frames))["code"] == CODES[how], "instead of the next heartbeat"
        assert clock.now() - since == 15
        assert list(frames) == []


@pytest.mark.parametrize("how", list(CODES))
def test_under_asgi_a_stream_ends_when_its_token_is_taken_away(approval, viewer, how):
    run = start_workflow("approval", payload={"order": "o-1"})
    clock = ManualClock()

    async def follow():
        frames = sse.astream(spec_of(run, viewer), clock)
        got = [await anext(frames) for _ in range(3)]
        got.append(await anext(frames))  # a heartbeat
        await sync_to_async(take_away)(how)
        since = clock.now()
        got.append(await anext(frames))
        waited = clock.now() - since
        await sync_to_async(append_event)("o-1", "order.approved", {"order": "o-1", "by": "a"})
        rest = [frame async for frame in frames]
        return got, waited, rest

    with override_settings(KUMIFLOW_SSE_HEARTBEAT=15, KUMIFLOW_SSE_POLL_INTERVAL=1):
        got, waited, rest = async_to_sync(follow)()
    assert [f.split(b"\n")[0] for f in got[:3]] == [b": connected", b"id: 1", b"id: 2"]
    assert got[3] == HEARTBEAT, "the token was still good"
    assert (error_of(got[4])["code"], waited, rest) == (CODES[how], 15, [])


@pytest.mark.parametrize("how", list(CODES))
def test_a_stream_opened_through_the_view_ends_when_its_token_is_taken_away(
    token_client, approval, monkeypatch, how
):
    """The whole path: the view's caller is the one the stream asks again."""
    run = start_workflow("approval", payload={"order": "o-1"})
    monkeypatch.setattr(sse, "CLOCK", ManualClock())
    client = token_client("view_workflowrun")
    with override_settings(KUMIFLOW_SSE_HEARTBEAT=15, KUMIFLOW_SSE_POLL_INTERVAL=1):
        frames = iter(client.get(f"{API}runs/{run.id}/events/").streaming_content)
        assert heads(frames, 3) == [b": connected", b"id: 1", b"id: 2"]
        take_away(how)
        append_event("o-1", "order.approved", {"order": "o-1", "by": "ann"})
        assert error_of(next(frames))["code"] == CODES[how], "not the event 3"
        assert list(frames) == []
    assert client.get(f"{API}runs/{run.id}/events/").status_code == STATUSES[CODES[how]]


# -- HEAD and OPTIONS ------------------------------------------------------------------------


def test_head_answers_the_streams_headers_without_opening_it(token_client, approval):
    run = start_workflow("approval", payload={"order": "o-1"})
    url = f"{API}runs/{run.id}/events/"
    client = token_client("view_workflowrun")
    head = client.head(url)
    assert head.status_code == 200
    assert (head["Content-Type"], head["Cache-Control"]) == ("text/event-stream", "no-cache")
    assert not head.has_header("Content-Length"), "as GET: the length is not known"
    assert client.head(url, HTTP_LAST_EVENT_ID="x").status_code == 400  # as GET checks
    assert token_client("append_event").head(url).status_code == 403
    assert TokenClient("kf_unknown").head(url).status_code == 401
    nowhere = f"{API}runs/00000000-0000-0000-0000-000000000000/events/"
    assert client.head(nowhere).status_code == 404
    finished = finished_run(approval)
    done = client.head(f"{API}runs/{finished.id}/events/", HTTP_LAST_EVENT_ID="6")
    assert done.status_code == 204


def body_of_the_view(request, run) -> tuple[int, bytes]:
    """The view's answer as the server gets it (the test client drops a HEAD's body itself)."""

    async def call():
        response: Any = await sse.run_events_view(request, str(run.id))
        if not response.streaming:
            return response.status_code, response.content
        if response.is_async:
            return response.status_code, b"".join([c async for c in response.streaming_content])
        return response.status_code, b"".join(response.streaming_content)

    answer: tuple[int, bytes] = async_to_sync(call)()
    return answer


def test_head_opens_no_stream_under_wsgi_and_asgi(approval):
    run = start_workflow("approval", payload={"order": "o-1"})
    _, secret = create_token("head", permissions=["view_workflowrun"])
    url, auth = f"{API}runs/{run.id}/events/", f"Bearer {secret}"
    with override_settings(KUMIFLOW_SSE_LISTEN=False):
        wsgi = body_of_the_view(RequestFactory().head(url, HTTP_AUTHORIZATION=auth), run)
        asgi = body_of_the_view(
            AsyncRequestFactory().head(url, headers={"Authorization": auth}), run
        )
    assert wsgi == asgi == (200, b""), "no ': connected', no event: no stream was opened"


def test_options_answers_allow_and_other_methods_405_with_it(token_client, approval):
    run = start_workflow("approval", payload={"order": "o-1"})
    url = f"{API}runs/{run.id}/events/"
    options = token_client().options(url)
    assert (options.status_code, options["Allow"], options.content) == (
        204,
        "GET, HEAD, OPTIONS",
        b"",
    )
    refused = token_client().post(url)
    assert (refused.status_code, refused["Allow"]) == (405, "GET, HEAD, OPTIONS")


def test_options_under_asgi(approval):
    run = start_workflow("approval", payload={"order": "o-1"})
    _, secret = create_token("asgi", permissions=["view_workflowrun"])

    async def ask():
        return await AsyncClient().options(
            f"{API}runs/{run.id}/events/", headers={"Authorization": f"Bearer {secret}"}
        )

    options = async_to_sync(ask)()
    assert (options.status_code, options["Allow"]) == (204, "GET, HEAD, OPTIONS")


def test_a_stream_opened_inside_a_transaction_polls_through_it(api, approval):
    """Test cases (and ATOMIC_REQUESTS-style wrappers) hold a transaction: a
    connection of the stream's own would not see its writes."""
    run = finished_run(approval)
    assert connection.in_atomic_block
    assert sse.listen_params("default") is None
    assert api.get(f"{API}runs/{run.id}/events/").status_code == 200


# -- PostgreSQL: LISTEN, in process ----------------------------------------------------------

postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's"
)


def sse_backends() -> int:
    """The database backends that live streams of this test database hold now (not
    those of another test run on the same server)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = 'kumiflow-sse' AND datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def approve_in_a_thread(order: str, event_type: str = "order.approved") -> threading.Thread:
    def work():
        try:
            append_event(order, event_type, {"order": order, "by": "ann"})
        finally:
            connections.close_all()

    thread = threading.Thread(target=work)
    thread.start()
    return thread


@pytest.fixture
def wakes(monkeypatch):
    """What ended each wait of the LISTEN streams: True for their run's notification,
    False for the timeout (a poll or a heartbeat is due)."""
    seen: list[bool] = []
    wait, await_ = sse.Listener.wait, sse.AsyncListener.await_

    def recorded_wait(self, timeout):
        seen.append(wait(self, timeout))
        return seen[-1]

    async def recorded_await(self, timeout):
        seen.append(await await_(self, timeout))
        return seen[-1]

    monkeypatch.setattr(sse.Listener, "wait", recorded_wait)
    monkeypatch.setattr(sse.AsyncListener, "await_", recorded_await)
    return seen


@postgres
@pytest.mark.django_db(transaction=True)
def test_a_listening_wsgi_stream_is_woken_by_the_notification(approval, viewer, wakes):
    run = start_workflow("approval", payload={"order": "o-1"})
    with override_settings(KUMIFLOW_SSE_POLL_INTERVAL=30, KUMIFLOW_SSE_HEARTBEAT=60):
        spec = spec_of(run, viewer, listen=sse.listen_params("default"))
        assert spec.listen is not None
        frames = sse.stream(spec)
        assert heads(frames, 3) == [b": connected", b"id: 1", b"id: 2"]
        thread = approve_in_a_thread("o-1")
        assert next(frames).split(b"\n")[0] == b"id: 3"
        assert wakes == [True], "woken by NOTIFY, not by the 30 s poll"
        assert connection.connection is None, "the token's check let go of Django's"
        thread.join()
        frames.close()


@postgres
@pytest.mark.django_db(transaction=True)
def test_a_listening_asgi_stream_is_woken_and_its_connection_closed_with_it(
    approval, viewer, wakes
):
    run = start_workflow("approval", payload={"order": "o-1"})

    async def follow():
        spec = spec_of(run, viewer, listen=sse.listen_params("default"))
        frames = sse.astream(spec)
        got = [await anext(frames) for _ in range(3)]
        assert got[0] == OPENED
        listening = await sync_to_async(sse_backends)()
        await sync_to_async(approve_in_a_thread("o-1").join)()
        got.append(await anext(frames))
        released = await sync_to_async(lambda: connection.connection is None)()
        await frames.aclose()  # what Django does when the client goes away
        return got, listening, released

    with override_settings(KUMIFLOW_SSE_POLL_INTERVAL=30, KUMIFLOW_SSE_HEARTBEAT=60):
        before = sse_backends()
        got, listening, released = async_to_sync(follow)()
    assert [f.split(b"\n")[0] for f in got[1:]] == [b"id: 1", b"id: 2", b"id: 3"]
    assert wakes == [True], "woken by NOTIFY, not by the 30 s poll"
    assert released, "the token's check let go of Django's connection"
    deadline = time.monotonic() + 10  # the server ends a closed backend on its own time
    while sse_backends() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (before, listening, sse_backends()) == (0, 1, 0)


@postgres
@pytest.mark.django_db(transaction=True)
def test_a_stream_whose_connection_breaks_reopens_it_and_misses_nothing(approval, viewer, caplog):
    run = start_workflow("approval", payload={"order": "o-1"})

    def sse_pids() -> list[int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE application_name = 'kumiflow-sse' AND datname = current_database()"
            )
            return [row[0] for row in cursor.fetchall()]

    with override_settings(KUMIFLOW_SSE_POLL_INTERVAL=0.05, KUMIFLOW_SSE_HEARTBEAT=60):
        spec = spec_of(run, viewer, listen=sse.listen_params("default"))
        frames = sse.stream(spec)
        assert [next(frames).split(b"\n")[0] for _ in range(3)] == [
            b": connected",
            b"id: 1",
            b"id: 2",
        ]
        [broken] = sse_pids()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [broken])
        approve_in_a_thread("o-1").join()  # committed while the stream has no connection
        assert [next(frames).split(b"\n")[0] for _ in range(2)] == [b"id: 3", b"id: 4"]
        [reopened] = sse_pids()
        frames.close()
    assert reopened != broken
    # The server ends the closed connection's backend on its own time: wait for it.
    deadline = time.monotonic() + 10
    while sse_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sse_pids() == []
    assert "connection broke; reopening it" in caplog.text


# -- a cap on the backends streams hold ------------------------------------------------------


def test_streams_beyond_the_listener_cap_poll_and_hold_no_connection_of_their_own(approval, viewer):
    run = start_workflow("approval", payload={"order": "o-1"})
    nowhere = {"host": "127.0.0.1", "port": 1, "dbname": "x", "connect_timeout": 1}
    with override_settings(KUMIFLOW_SSE_MAX_LISTENERS=0, KUMIFLOW_SSE_POLL_INTERVAL=0.01):
        frames = sse.stream(spec_of(run, viewer, listen=nowhere))
        assert next(frames) == OPENED  # no connection tried: it would have failed
        assert sse.LISTEN_SLOTS.taken == 0
        assert [next(frames).split(b"\n")[0] for _ in range(2)] == [b"id: 1", b"id: 2"]
        frames.close()


def test_a_stream_whose_listen_connection_is_refused_polls_instead(approval, viewer, caplog):
    pytest.importorskip("psycopg")
    run = start_workflow("approval", payload={"order": "o-1"})
    refused = {"host": "127.0.0.1", "port": 1, "dbname": "x", "connect_timeout": 1}
    with override_settings(KUMIFLOW_SSE_POLL_INTERVAL=0.01, KUMIFLOW_SSE_HEARTBEAT=60):
        frames = sse.stream(spec_of(run, viewer, listen=refused))
        assert next(frames) == OPENED
        assert sse.LISTEN_SLOTS.taken == 1
        assert [next(frames).split(b"\n")[0] for _ in range(2)] == [b"id: 1", b"id: 2"]
        append_event("o-1", "order.approved", {"order": "o-1", "by": "ann"})
        assert next(frames).split(b"\n")[0] == b"id: 3"
        frames.close()
    assert sse.LISTEN_SLOTS.taken == 0, "the slot is given back with the stream"
    assert "could not open its LISTEN connection" in caplog.text

    async def follow():
        frames = sse.astream(spec_of(run, viewer, listen=refused))
        got = [await anext(frames) for _ in range(2)]
        taken = sse.LISTEN_SLOTS.taken
        await frames.aclose()
        return got, taken

    with override_settings(KUMIFLOW_SSE_POLL_INTERVAL=0.01):
        got, taken = async_to_sync(follow)()
    assert (got[0], got[1].split(b"\n")[0], taken) == (OPENED, b"id: 1", 1)
    assert sse.LISTEN_SLOTS.taken == 0


@postgres
@pytest.mark.django_db(transaction=True)
def test_only_max_listeners_streams_hold_a_backend(approval, viewer):
    run = start_workflow("approval", payload={"order": "o-1"})

    with override_settings(
        KUMIFLOW_SSE_MAX_LISTENERS=2, KUMIFLOW_SSE_POLL_INTERVAL=0.05, KUMIFLOW_SSE_HEARTBEAT=60
    ):
        params = sse.listen_params("default")
        streams = [sse.stream(spec_of(run, viewer, listen=params)) for _ in range(5)]
        for frames in streams:
            assert next(frames) == OPENED
        assert (sse.LISTEN_SLOTS.taken, sse_backends()) == (2, 2)
        thread = approve_in_a_thread("o-1")
        thread.join()
        for frames in streams:  # the listening and the polling ones alike
            assert [next(frames).split(b"\n")[0] for _ in range(3)] == [
                b"id: 1",
                b"id: 2",
                b"id: 3",
            ]
            frames.close()
    assert sse.LISTEN_SLOTS.taken == 0
    deadline = time.monotonic() + 10
    while sse_backends() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sse_backends() == 0
