"""Live run streams and async entry points under a real ASGI server (uvicorn).

The server runs the testproject on the test database. On PostgreSQL its
streams LISTEN and neither poll nor send heartbeats for an hour, so an
event that arrives before the client's 20 s read timeout was delivered by
NOTIFY (nothing else would read it); elsewhere they poll every 50 ms. The run
is the testproject's ``http-approval``: it waits for an approval and then a
shipment of its order, which the test appends through the API, so the
order of everything is decided by the test, never by a clock.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.db import connection

from kumiflow_django.http.models import ApiToken
from kumiflow_django.http.tokens import create_token, hash_token, revoke_token
from tests.http.live import Api, Server, data, version
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LISTENS = connection.vendor == "postgresql"
TYPES = [
    "run-started",
    "step.waiting-for-event",
    "step.resumed",
    "step.waiting-for-event",
    "step.resumed",
    "run-completed",
]


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    if LISTENS:
        env = {"KUMIFLOW_SSE_POLL_INTERVAL": "3600", "KUMIFLOW_SSE_HEARTBEAT": "3600"}
    else:
        env = {"KUMIFLOW_SSE_POLL_INTERVAL": "0.05"}
    the_server = Server(env)
    yield the_server
    the_server.stop()
    log = the_server.log()
    assert "Traceback" not in log and "SynchronousOnlyOperation" not in log, log


@pytest.fixture
def api(server):
    _, secret = create_token(
        f"live-{uuid.uuid4()}",
        permissions=["view_workflowrun", "start_workflowrun", "append_event"],
    )
    return Api(server, secret)


def start(api: Api) -> tuple[str, str]:
    order = f"o-{uuid.uuid4()}"
    response = api.post("runs/", {"workflow": "http-approval", "payload": {"order": order}})
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "waiting_event"
    return response.json()["id"], order


def signal(api: Api, order: str, event_type: str) -> None:
    body = {"stream_id": order, "type": event_type, "payload": {"order": order, "by": "ann"}}
    response = api.post("events/", body)
    assert response.status_code == 201, response.text


def test_a_run_is_followed_from_its_start_to_its_completion(api):
    run_id, order = start(api)
    stream = api.stream(run_id)
    assert stream.next() == {"comment": "connected"}
    seen = stream.until(lambda m: version(m) == 2)

    signal(api, order, "approval.granted")
    # on PostgreSQL only the notification reads it before the client's read times out
    seen += stream.until(lambda m: version(m) == 4)

    signal(api, order, "approval.shipped")
    seen += stream.until(lambda m: m.get("event") == "end")
    assert stream.next() is None, "the stream closes after the end"

    events, end = seen[:-1], seen[-1]
    assert [version(m) for m in events] == [1, 2, 3, 4, 5, 6]
    assert [m["event"].removeprefix("kumiflow.workflow.") for m in events] == TYPES
    assert data(events[-1])["payload"]["result"] == {"order": order, "by": "ann"}
    assert data(end) == {"status": "completed", "stream_version": 6}


def test_a_client_that_reconnects_with_last_event_id_loses_and_repeats_nothing(api):
    run_id, order = start(api)
    first = api.stream(run_id)
    seen = first.until(lambda m: version(m) == 2)
    first.close()

    signal(api, order, "approval.granted")  # the run moves on while nobody listens
    second = api.stream(run_id, last_event_id=version(seen[-1]))
    seen += second.until(lambda m: version(m) == 4)
    signal(api, order, "approval.shipped")
    seen += second.until(lambda m: m.get("event") == "end")

    assert [m.get("id") for m in seen] == ["1", "2", "3", "4", "5", "6", None]
    again = requests.get(
        api.server.url(f"runs/{run_id}/events/"),
        headers={**api.headers, "Last-Event-ID": "6"},
        timeout=10,
    )
    assert again.status_code == 204, "nothing left: an EventSource stops reconnecting"


def test_a_revoked_token_ends_its_open_stream_before_the_next_event(server, api):
    run_id, order = start(api)
    _, secret = create_token(f"follower-{uuid.uuid4()}", permissions=["view_workflowrun"])
    follower = Api(server, secret)
    stream = follower.stream(run_id)
    assert stream.until(lambda m: version(m) == 2)[-1]["id"] == "2"
    assert revoke_token(ApiToken.objects.get(key_hash=hash_token(secret)).name)

    signal(api, order, "approval.granted")  # appended after the revocation
    [end] = stream.until(lambda m: True)
    assert end["event"] == "error", end
    assert data(end)["error"]["code"] == "unauthenticated"
    assert stream.next() is None, "the stream closes"
    again = requests.get(server.url(f"runs/{run_id}/events/"), headers=follower.headers, timeout=10)
    assert again.status_code == 401


def test_an_async_view_starts_a_run_through_the_async_entry_points(server):
    response = requests.get(f"{server.base}/demo/astart/", {"order": "o-async"}, timeout=30)
    assert response.status_code == 200, server.log()
    assert (response.json()["status"], response.json()["cursor"]) == ("waiting_event", [1])


def backends() -> int:
    """Connections to the test database, from the database's own view."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE()"
            )
        return int(cursor.fetchone()[0])


@pytest.mark.server_db
def test_a_thousand_clients_that_come_and_go_leave_no_connection_behind(api):
    run_id, _ = start(api)
    url = api.server.url(f"runs/{run_id}/events/")

    def connect_and_leave(_: int) -> None:
        with requests.get(url, headers=api.headers, stream=True, timeout=(5, 20)) as response:
            first = next(response.iter_content(chunk_size=None))
            # Sent once the stream listens (PostgreSQL) or is about to poll.
            assert first.startswith(b": connected"), first

    connect_and_leave(0)
    wait_for(lambda: backends() == 1, 30, "the warm-up stream to let go")  # just ours
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(connect_and_leave, range(1000)))
    wait_for(lambda: backends() == 1, 30, "every stream's connection to close")
