"""The JSON API: runs started, read, listed and operated, events appended, errors shaped."""

from __future__ import annotations

import threading
from datetime import timedelta
from unittest import mock

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings
from django.utils import timezone

from kumiflow_django import define_workflow, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.http.models import ApiToken
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from kumiflow_django.projections.waits import RunWait
from tests.http.conftest import API

pytestmark = pytest.mark.django_db


def error(response):
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "field"}
    return body["error"]


# -- the happy paths ---------------------------------------------------------------------


def test_a_run_is_started_signalled_and_read_through_the_api(api, approval):
    started = api.post_json(f"{API}runs/", {"workflow": "approval", "payload": {"order": "o-1"}})
    assert started.status_code == 201
    run = started.json()
    assert (run["status"], run["position"], run["awaiting"]) == (
        "waiting_event",
        "1",
        {"event_type": "order.approved"},
    )
    assert run["steps"] == {"results": {"order": "o-1"}, "trail": ["0"]}

    approved = api.post_json(
        f"{API}events/",
        {"stream_id": "o-1", "type": "order.approved", "payload": {"order": "o-1", "by": "ann"}},
    )
    assert approved.status_code == 201
    assert approved.json()["created_by"].startswith("token:")
    halfway = api.get(f"{API}runs/{run['id']}/").json()
    assert (halfway["status"], halfway["position"]) == ("waiting_event", "2")
    assert halfway["steps"]["results"]["approved"]["payload"]["by"] == "ann"

    api.post_json(
        f"{API}events/", {"stream_id": "o-1", "type": "order.shipped", "payload": {"order": "o-1"}}
    )
    done = api.get(f"{API}runs/{run['id']}/").json()
    assert (done["status"], done["result"], done["position"], done["error"]) == (
        "completed",
        {"order": "o-1", "by": "ann"},
        None,
        None,
    )
    assert done["steps"]["trail"] == ["0", "1", "2", "3"]
    assert done["finished_at"] is not None and done["stream_version"] == 6


def test_a_repeated_start_with_the_same_key_answers_the_first_run(api, approval):
    body = {"workflow": "approval", "payload": {"order": "o-1"}, "idempotency_key": "k-1"}
    first = api.post_json(f"{API}runs/", body).json()
    again = api.post_json(f"{API}runs/", body)
    assert again.status_code == 201 and again.json()["id"] == first["id"]
    assert WorkflowRun.objects.count() == 1


def test_cancel_wake_and_retry_go_through_the_public_functions(api, registry):
    broken = {"yes": True}

    def flaky(ctx):
        if broken["yes"]:
            raise RuntimeError("partner down")
        return "ok"

    define_workflow(
        "flaky", steps=[s.compute("call", flaky), s.return_(lambda ctx: ctx.steps["call"])]
    )
    define_workflow("sleepy", steps=[s.wait("P7D"), s.return_("woke")])
    failed = api.post_json(f"{API}runs/", {"workflow": "flaky"}).json()
    assert failed["status"] == "failed"
    assert (
        failed["error"]["reason"] == "step_failed" and "partner down" in failed["error"]["message"]
    )

    broken["yes"] = False
    retried = api.post_json(f"{API}runs/{failed['id']}/retry/", {"reason": "partner is back"})
    assert retried.status_code == 200 and retried.json()["status"] == "pending"

    sleepy = api.post_json(f"{API}runs/", {"workflow": "sleepy"}).json()
    woken = api.post_json(f"{API}runs/{sleepy['id']}/wake/")
    assert woken.status_code == 200 and woken.json()["wake_at"] is not None

    other = api.post_json(f"{API}runs/", {"workflow": "sleepy"}).json()
    cancelled = api.post_json(
        f"{API}runs/{other['id']}/cancel/", {"reason": "customer left"}
    ).json()
    assert (cancelled["status"], cancelled["error"]) == (
        "cancelled",
        {"reason": "cancelled", "message": "customer left"},
    )


# -- the run list ------------------------------------------------------------------------


def test_pages_follow_started_at_then_id_and_new_runs_do_not_move_them(api, approval, clock):
    for i in range(3):
        clock.advance(seconds=1)
        # Two runs per instant: the id breaks the tie (in the database's own order
        # of ids, which on MariaDB is not the order of their text).
        for j in range(2):
            start_workflow("approval", payload={"order": f"o-{i}-{j}"})
    everything = api.get(f"{API}runs/").json()
    assert everything["next_cursor"] is None and len(everything["runs"]) == 6

    first = api.get(f"{API}runs/", {"limit": 3}).json()  # cuts between two runs of one instant
    clock.advance(seconds=1)
    start_workflow("approval", payload={"order": "late"})  # appears on top, shifts nothing
    second = api.get(f"{API}runs/", {"limit": 3, "cursor": first["next_cursor"]}).json()

    assert first["runs"] + second["runs"] == everything["runs"]
    started = [r["started_at"] for r in everything["runs"]]
    assert started == sorted(started, reverse=True) and len(set(started)) == 3
    assert second["next_cursor"] is None


def test_the_list_filters_by_workflow_status_and_tenant(token_client, approval, registry):
    define_workflow("quick", steps=[s.return_(1)])
    start_workflow("approval", payload={"order": "o-1"})
    start_workflow("quick")
    start_workflow("quick", tenant="acme")
    api = token_client()

    def ids(**query):
        return [r["workflow"] for r in api.get(f"{API}runs/", query).json()["runs"]]

    assert sorted(ids()) == ["approval", "quick"], "only the token's tenant"
    assert ids(workflow="quick") == ["quick"]
    assert ids(status="waiting_event") == ["approval"]
    assert ids(status="completed", workflow="approval") == []
    assert api.get(f"{API}runs/", {"tenant": "default"}).status_code == 200
    refused = api.get(f"{API}runs/", {"tenant": "acme"})
    assert refused.status_code == 403 and error(refused)["field"] == "tenant"
    acme = token_client(tenant="acme")
    assert [r["tenant"] for r in acme.get(f"{API}runs/").json()["runs"]] == ["acme"]


def test_the_list_shows_a_tenant_its_own_runs_not_those_a_collation_calls_equal(token_client):
    """MariaDB compares text ignoring case and trailing spaces: a token of
    "acme" must still see neither "ACME"'s runs nor "acme "'s nor "Acme"'s."""
    define_workflow("w", steps=[s.compute("a", lambda ctx: 1)])
    mine = start_workflow("w", tenant="acme")
    for other in ("ACME", "acme ", "Acme"):
        start_workflow("w", tenant=other)

    runs = token_client(tenant="acme").get(f"{API}runs/").json()["runs"]

    assert [(r["id"], r["tenant"]) for r in runs] == [(str(mine.id), "acme")]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": "ten"}, "limit"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"status": "sleeping"}, "status"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": "WyJ5ZXN0ZXJkYXkiLCAxXQ"}, "cursor"),  # ["yesterday", 1]
    ],
)
def test_a_bad_query_is_a_400_naming_the_parameter(api, query, field):
    response = api.get(f"{API}runs/", query)
    assert response.status_code == 400
    assert error(response)["field"] == field


# -- tenants and permissions ---------------------------------------------------------------


def test_a_run_of_another_tenant_is_not_found_for_every_verb(token_client, approval):
    theirs = start_workflow("approval", payload={"order": "o-1"}, tenant="acme")
    ours = token_client()
    for response in (
        ours.get(f"{API}runs/{theirs.id}/"),
        ours.get(f"{API}runs/{theirs.id}/events/"),
        ours.post_json(f"{API}runs/{theirs.id}/cancel/"),
        ours.post_json(f"{API}runs/{theirs.id}/wake/"),
        ours.post_json(f"{API}runs/{theirs.id}/retry/"),
        ours.get(f"{API}runs/not-a-uuid/"),
    ):
        assert response.status_code == 404, response.content
        assert error(response)["code"] == "not_found"
    theirs.refresh_from_db()
    assert theirs.status == RunStatus.WAITING_EVENT
    assert token_client(tenant="acme").get(f"{API}runs/{theirs.id}/").status_code == 200


def test_writes_go_to_the_token_tenant_and_no_other(token_client, approval):
    acme = token_client(tenant="acme")
    run = acme.post_json(
        f"{API}runs/", {"workflow": "approval", "payload": {"order": "o-1"}}
    ).json()
    assert run["tenant"] == "acme"
    refused = acme.post_json(
        f"{API}runs/", {"workflow": "approval", "payload": {"order": "o-2"}, "tenant": "default"}
    )
    assert refused.status_code == 403 and error(refused)["field"] == "tenant"
    refused = acme.post_json(f"{API}events/", {"stream_id": "s", "type": "t", "tenant": "default"})
    assert refused.status_code == 403
    assert WorkflowRun.objects.count() == 1 and not Event.objects.filter(stream_id="s").exists()


@pytest.mark.parametrize(
    ("perm", "method", "path", "body"),
    [
        ("start_workflowrun", "post", "runs/", {"workflow": "approval", "payload": {"order": "x"}}),
        ("append_event", "post", "events/", {"stream_id": "o-1", "type": "order.approved"}),
        ("cancel_workflowrun", "post", "runs/{run}/cancel/", {}),
        ("wake_workflowrun", "post", "runs/{run}/wake/", {}),
        ("retry_workflowrun", "post", "runs/{run}/retry/", {}),
        ("view_workflowrun", "get", "runs/{run}/", None),
        ("view_workflowrun", "get", "runs/", None),
        ("view_workflowrun", "get", "runs/{run}/events/", None),
    ],
)
def test_a_token_without_the_permission_gets_403_and_changes_nothing(
    token_client, approval, perm, method, path, body
):
    run = start_workflow("approval", payload={"order": "o-1"})
    others = [
        p
        for p in (
            "view_workflowrun",
            "start_workflowrun",
            "append_event",
            "cancel_workflowrun",
            "wake_workflowrun",
            "retry_workflowrun",
        )
        if p != perm
    ]
    client = token_client(*others)
    events_before = Event.objects.count()
    url = API + path.format(run=run.id)
    response = client.post_json(url, body) if method == "post" else client.get(url)
    assert response.status_code == 403
    assert error(response) == {
        "code": "forbidden",
        "message": f"this needs the permission kumiflow.{perm}",
        "field": None,
    }
    assert Event.objects.count() == events_before and WorkflowRun.objects.count() == 1


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({}, "workflow", "is required"),
        ({"workflow": ""}, "workflow", "must not be empty"),
        ({"workflow": 3}, "workflow", "must be string, not integer"),
        ({"workflow": "approval", "payload": [1]}, "payload", "must be object, not array"),
        ({"workflow": "approval", "payload": 1.5}, "payload", "must be object, not a number"),
        ({"workflow": "approval", "idempotency_key": "a\nb"}, "idempotency_key", "control"),
        ({"workflow": "approval", "idempotency_key": "k" * 201}, "idempotency_key", "at most"),
        ({"workflow": "approval", "tenant": ""}, "tenant", "must not be empty"),
        ({"workflow": "approval", "payload": {}, "paylod": {}}, "paylod", "not a known field"),
        ({"workflow": "nope"}, "workflow", "no workflow named 'nope'"),
        ({"workflow": "approval", "version": "v9"}, "version", "version 'v9'"),
        # The engine's own check (the schema cannot know the workflow's key).
        ({"workflow": "approval", "payload": {"x": 1}}, None, None),
    ],
)
def test_a_malformed_start_is_a_400_naming_the_field(api, approval, body, field, message):
    response = api.post_json(f"{API}runs/", body)
    if message is None:  # a payload without "order": the first step fails, the run records it
        assert response.status_code == 201 and response.json()["status"] == "failed"
        return
    assert response.status_code == 400, response.content
    assert error(response)["field"] == field
    assert message in error(response)["message"]
    assert not WorkflowRun.objects.exists()


def test_a_body_that_is_no_json_object_is_a_400_without_a_field(api, approval):
    for raw in (b"{", b"[1]", b'"x"', b"\xff"):
        response = api.post(f"{API}runs/", raw, content_type="application/json")
        assert response.status_code == 400
        assert error(response)["field"] is None


def test_a_payload_the_engine_refuses_names_the_payload(api, approval):
    with override_settings(KUMIFLOW_MAX_VALUE_BYTES=100):
        response = api.post_json(
            f"{API}runs/", {"workflow": "approval", "payload": {"order": "x" * 200}}
        )
    assert response.status_code == 400 and error(response)["field"] == "payload"


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"type": "t"}, 400, "stream_id"),
        ({"stream_id": "s", "type": "kumiflow.workflow.run-started"}, 400, "type"),
        ({"stream_id": "s", "type": "t", "expected_version": -1}, 400, "expected_version"),
        ({"stream_id": "s", "type": "t", "expected_version": True}, 400, "expected_version"),
        ({"stream_id": "s", "type": "t", "schema_version": 0}, 400, "schema_version"),
        ({"stream_id": "s", "type": "t", "metadata": "x"}, 400, "metadata"),
        ({"stream_id": "s", "type": "t", "expected_version": 3}, 409, "expected_version"),
        # a stream the engine owns, by its id or by its type
        ({"stream_id": "cron:daily", "type": "t"}, 400, "stream_id"),
        ({"stream_id": "s", "type": "t", "stream_type": "workflow-run"}, 400, "stream_type"),
    ],
)
def test_a_refused_append_is_a_400_or_409(api, body, status, field):
    response = api.post_json(f"{API}events/", body)
    assert response.status_code == status, response.content
    assert error(response)["field"] == field
    assert not Event.objects.exists()


def test_one_tenants_append_does_not_block_anothers_stream_of_the_same_id(token_client, registry):
    """Streams are per tenant: acme's event on ORD-6388e4 used to make the
    default tenant's own event on it a 409, and its run waiting for it waited on."""
    from kumiflow_django.testing import run_until_idle

    define_workflow(
        "paid",
        trigger=on_event("checkout.done"),
        steps=[
            s.wait_for_event("payment.received", match={"stream_id": lambda c: "ORD-6388e4"}),
            s.return_("paid"),
        ],
    )
    acme, ours = token_client(tenant="acme"), token_client()
    ours.post_json(f"{API}events/", {"stream_id": "cart-1", "type": "checkout.done"})
    run = WorkflowRun.objects.get(tenant_id="default")

    body = {"stream_id": "ORD-6388e4", "type": "payment.received"}
    theirs = acme.post_json(f"{API}events/", body)
    assert (theirs.status_code, theirs.json()["version"]) == (201, 1)
    run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_EVENT, "acme's event is not ours"

    mine = ours.post_json(f"{API}events/", body)
    assert mine.status_code == 201, mine.content
    assert (mine.json()["version"], mine.json()["tenant"]) == (1, "default")
    run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED


@pytest.mark.parametrize("extra", [{}, {"expected_version": 0}, {"expected_version": 4}])
def test_another_tenants_run_id_is_answered_as_a_random_id(token_client, registry, extra):
    """Before, a foreign run id answered 400 "the engine's own", a random id 201."""
    import uuid

    define_workflow("napper", steps=[s.wait("PT1H"), s.return_(1)])
    foreign = start_workflow("napper", tenant="acme")
    api = token_client()

    def answer(stream_id):
        response = api.post_json(f"{API}events/", {"stream_id": stream_id, "type": "t", **extra})
        body = response.json()
        if response.status_code == 201:
            unique = ("position", "event_id", "created_at")
            body = {k: v for k, v in body.items() if k not in unique}
            assert body.pop("stream_id") == stream_id
        else:
            body["error"]["message"] = body["error"]["message"].replace(stream_id, "<id>")
        return response.status_code, body

    assert answer(str(foreign.id)) == answer(str(uuid.uuid4()))
    foreign.refresh_from_db()
    assert (foreign.status, foreign.version) == (RunStatus.WAITING, 2), "a's run is untouched"


def test_operations_a_run_state_does_not_allow_are_409(api, registry):
    define_workflow("quick", steps=[s.return_(1)])
    run = api.post_json(f"{API}runs/", {"workflow": "quick"}).json()
    for verb in ("cancel", "wake", "retry"):
        response = api.post_json(f"{API}runs/{run['id']}/{verb}/")
        assert response.status_code == 409 and error(response)["code"] == "conflict"
    refused = api.post_json(f"{API}runs/{run['id']}/cancel/", {"reason": 3})
    assert refused.status_code == 400 and error(refused)["field"] == "reason"


def test_a_wrong_method_is_a_405_that_says_which_are_allowed(api):
    response = api.delete(f"{API}runs/")
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD, POST, OPTIONS"
    assert error(response)["code"] == "method_not_allowed"
    assert (
        api.post_json(f"{API}runs/00000000-0000-0000-0000-000000000000/events/").status_code == 405
    )


# -- authentication ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header", [None, "Basic dXNlcjpwdw==", "Bearer", "Bearer kf_unknown", "Token abc"]
)
def test_without_valid_credentials_the_api_answers_401(db, header, approval):
    client = Client(HTTP_AUTHORIZATION=header) if header else Client()
    response = client.get(f"{API}runs/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert error(response)["code"] == "unauthenticated"
    assert (
        client.post(
            f"{API}runs/", {"workflow": "approval"}, content_type="application/json"
        ).status_code
        == 401
    )
    assert not WorkflowRun.objects.exists()


def test_an_expired_or_revoked_token_is_refused(token_client):
    client = token_client()
    assert client.get(f"{API}runs/").status_code == 200
    token = ApiToken.objects.get()
    token.expires_at = timezone.now() - timedelta(seconds=1)
    token.save()
    assert client.get(f"{API}runs/").status_code == 401
    token.delete()
    assert client.get(f"{API}runs/").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_every_request_reads_its_token_again_and_sees_a_revocation_at_once(
    token_client, approval, django_assert_num_queries
):
    """No cached answer: each request reads the token again (then the run and the
    wait it is in), and a token deleted from another connection is refused on the
    very next request."""
    client = token_client("view_workflowrun")
    run = start_workflow("approval", payload={"order": "A-1"})
    client.get(f"{API}runs/{run.id}/")  # records the token's first use
    for _ in range(2):
        with django_assert_num_queries(3) as queries:
            assert client.get(f"{API}runs/{run.id}/").status_code == 200
        assert "kumiflow_apitoken" in queries.captured_queries[0]["sql"]
    revoked = threading.Thread(target=_revoke_in_another_connection)
    revoked.start()
    revoked.join()
    assert client.get(f"{API}runs/{run.id}/").status_code == 401


def _revoke_in_another_connection() -> None:
    from django.db import connection

    try:
        assert ApiToken.objects.all().delete()[0] == 1
    finally:
        connection.close()


def test_a_token_is_refused_from_the_instant_of_its_expiry(token_client):
    client = token_client()
    token = ApiToken.objects.get()
    token.expires_at = expiry = timezone.now() + timedelta(hours=1)
    token.save()
    before, at = expiry - timedelta(microseconds=1), expiry
    with mock.patch("kumiflow_django.http.tokens.timezone.now", return_value=before):
        assert client.get(f"{API}runs/").status_code == 200
    with mock.patch("kumiflow_django.http.tokens.timezone.now", return_value=at):
        assert client.get(f"{API}runs/").status_code == 401


def test_a_token_records_its_last_use_at_most_once_a_minute(token_client):
    client = token_client()
    client.get(f"{API}runs/")
    first = ApiToken.objects.get().last_used_at
    assert first is not None
    client.get(f"{API}runs/")
    assert ApiToken.objects.get().last_used_at == first


@pytest.fixture
def user(db):
    user = User.objects.create_user("ops", password="pw")
    for codename in ("view_workflowrun", "start_workflowrun"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def test_a_signed_in_user_uses_the_session_and_its_permissions(user, approval):
    client = Client()
    client.force_login(user)
    body = {"workflow": "approval", "payload": {"order": "o-1"}}
    run = client.post(f"{API}runs/", body, content_type="application/json")
    assert run.status_code == 201 and run.json()["tenant"] == "default"
    assert client.get(f"{API}runs/").json()["runs"][0]["id"] == run.json()["id"]
    refused = client.post(
        f"{API}runs/{run.json()['id']}/cancel/", {}, content_type="application/json"
    )
    assert refused.status_code == 403


def test_a_session_write_needs_the_csrf_token(user, approval):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    body = {"workflow": "approval", "payload": {"order": "o-1"}}
    refused = client.post(f"{API}runs/", body, content_type="application/json")
    assert refused.status_code == 403 and "CSRF" in error(refused)["message"]
    assert not WorkflowRun.objects.exists()

    client.get("/admin/login/")  # any page that uses the CSRF token sets its cookie
    accepted = client.post(
        f"{API}runs/",
        body,
        content_type="application/json",
        HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
    )
    assert accepted.status_code == 201


def test_a_bearer_token_needs_no_csrf_token(db, approval):
    from kumiflow_django.http.tokens import create_token

    _, secret = create_token("ci", permissions=["start_workflowrun"])
    client = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {secret}")
    body = {"workflow": "approval", "payload": {"order": "o-1"}}
    assert client.post(f"{API}runs/", body, content_type="application/json").status_code == 201


def tenants_of(user):
    """The tenants hook of the test below: staff see two tenants, others none."""
    return ["acme", "default"] if user.is_staff else []


def test_a_hook_maps_users_to_tenants(user, approval):
    start_workflow("approval", payload={"order": "o-1"}, tenant="default")
    start_workflow("approval", payload={"order": "o-2"}, tenant="acme")
    client = Client()
    client.force_login(user)
    with override_settings(KUMIFLOW_API_USER_TENANTS="tests.http.test_api.tenants_of"):
        assert client.get(f"{API}runs/").json()["runs"] == []
        user.is_staff = True
        user.save()
        assert len(client.get(f"{API}runs/").json()["runs"]) == 2
        assert len(client.get(f"{API}runs/", {"tenant": "acme"}).json()["runs"]) == 1
        started = client.post(
            f"{API}runs/",
            {"workflow": "approval", "payload": {"order": "o-3"}},
            content_type="application/json",
        )
        assert started.json()["tenant"] == "acme", "the first tenant of the hook's list"


def test_a_start_and_an_event_carry_a_priority_and_a_bad_one_is_refused(api, registry):
    define_workflow("report", start_mode="deferred", steps=[s.return_(1)])
    define_workflow("on-signup", trigger=on_event("user.joined"), start_mode="deferred", steps=[])
    started = api.post_json(f"{API}runs/", {"workflow": "report", "priority": 30})
    assert started.status_code == 201
    assert WorkflowRun.objects.get(pk=started.json()["id"]).priority == 30
    appended = api.post_json(
        f"{API}events/", {"stream_id": "u-1", "type": "user.joined", "priority": -5}
    )
    assert appended.status_code == 201
    assert WorkflowRun.objects.get(workflow="on-signup").priority == -5
    refused = api.post_json(f"{API}runs/", {"workflow": "report", "priority": 101})
    assert refused.status_code == 400


def _charge(cents: int) -> int:
    return cents


def test_a_run_waiting_for_its_task_says_so_in_the_console_s_words(api, registry):
    """Status waiting_event (the status set is unchanged), and waiting_for names the task."""
    define_workflow("checkout", steps=[s.task("charge", _charge, args=[1999]), s.return_(1)])
    run = start_workflow("checkout")
    body = api.get(f"{API}runs/{run.pk}/").json()
    assert (body["status"], body["awaiting"]) == (
        "waiting_event",
        {"event_type": "kumiflow.task.settled"},
    )
    assert body["waiting_for"] == {
        "kind": "task",
        "step": "charge",
        "path": "0",
        "event_type": "kumiflow.task.settled",
        "id": RunWait.objects.get(run_id=run.id, branch="").match["stream_id"],
        "text": "waiting for task charge",
    }
