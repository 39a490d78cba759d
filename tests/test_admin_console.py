"""The operator console (issue 16): a failure explained in one screen, actions with
an audit trail, sending an awaited event, finding runs, and the overview."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from kumiflow_django import append_event, define_workflow, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.admin import overview
from kumiflow_django.definition import snapshots
from kumiflow_django.models import DefinitionSnapshot, Dispatch, Event, RunStatus, WorkflowRun
from kumiflow_django.store import names as ev
from kumiflow_django.testing import run_until_idle
from testproject.shop.models import Customer

pytestmark = pytest.mark.django_db


@pytest.fixture
def shop(registry, clock):
    """Three runs: one failed (a customer that does not exist), one waiting for an
    approval, one waiting on a timer; the failed run read a None before it failed."""
    define_workflow(
        "reminder",
        trigger=on_event("invoice.overdue"),
        business_key="payload.invoice",
        steps=[
            s.read.find_one(
                "customer",
                "shop.Customer",
                lambda ctx: {"user_id": ctx.event.payload["user"]},
                fields=["email"],
            ),
            s.mail_send(
                to=lambda ctx: ctx.steps["customer"]["email"], subject="Overdue", body="Pay"
            ),
        ],
    )
    define_workflow(
        "refund",
        trigger=on_event("refund.requested"),
        idempotency_key=lambda e: f"refund:{e.payload['refund']}",
        steps=[
            s.mail_send(to="support@shop.example", subject="Approve a refund", body="…"),
            s.wait_for_event(
                "refund.approved",
                match={"payload.refund": lambda ctx: ctx.event.payload["refund"]},
                timeout="P3D",
                name="approval",
            ),
            s.return_(lambda ctx: {"approved": not ctx.steps["approval"]["timed_out"]}),
        ],
    )
    define_workflow("sleepy", steps=[s.wait("P1D"), s.return_("slept")])
    append_event("invoice-1", "invoice.overdue", {"invoice": "INV-7", "user": "ghost"})
    append_event("refund-1", "refund.requested", {"refund": "R-1"})
    sleeper = start_workflow("sleepy")
    return {
        "failed": WorkflowRun.objects.get(workflow="reminder"),
        "waiting": WorkflowRun.objects.get(workflow="refund"),
        "sleeping": sleeper,
    }


def found(pattern: str, text: str, group: int = 0) -> str:
    """What ``pattern`` matches in ``text`` (across lines); the test fails if nothing."""
    match = re.search(pattern, text, re.S)
    assert match is not None, pattern
    return match.group(group)


def run_url(run) -> str:
    return reverse("admin:kumiflow_workflowrun_change", args=[run.pk])


def operate_url(run, name: str) -> str:
    return reverse("admin:kumiflow_workflowrun_operate", args=[run.pk, name])


def staff_with(*codenames: str) -> User:
    user = User.objects.create_user(f"op-{uuid.uuid4().hex[:6]}", password="pw", is_staff=True)
    for codename in ("view_workflowrun", "view_event", "view_dispatch", "view_cronschedule"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return User.objects.get(pk=user.pk)


# -- a failure in one screen ------------------------------------------------------


def test_a_failure_keeps_its_traceback_and_the_step_results_it_had(shop):
    failed = Event.objects.get(stream_id=str(shop["failed"].pk), type=ev.RUN_FAILED)
    payload = failed.payload
    assert payload["reason"] == "step_failed"
    assert "TypeError: 'NoneType' object is not subscriptable" in payload["traceback"]
    assert 'ctx.steps["customer"]["email"]' in payload["traceback"], "the user's own frame"
    assert payload["steps"] == {"customer": None}, "the None a later step indexed"
    assert set(payload["durations"]) == {"0", "1"}


def test_the_failure_panel_shows_reason_error_traceback_and_results_first(admin_client, shop):
    page = admin_client.get(run_url(shop["failed"])).content.decode()
    panel = page[page.index('id="kf-failure"') :]
    assert page.index('id="kf-failure"') < page.index("kf-picture"), "at the top"
    assert "Failed: step_failed at step 1" in panel
    assert "TypeError at step 1 (mail_send)" in panel
    assert "Traceback (most recent call last)" in panel
    assert "Step results at that moment" in panel and "{&quot;customer&quot;: null}" in panel
    assert "Retry" in panel, "what to do about it"


def test_a_traceback_is_capped_keeping_its_start_and_its_end(registry):
    def deep(n):
        if n == 0:
            raise ValueError("the bottom " + "x" * 30_000)
        return deep(n - 1)

    define_workflow("deep", steps=[s.compute("c", lambda ctx: deep(200))])
    run = start_workflow("deep")
    text = Event.objects.get(stream_id=str(run.pk), type=ev.RUN_FAILED).payload["traceback"]
    assert len(text) <= 16_384
    assert text.startswith("Traceback (most recent call last)")
    assert "characters of the traceback left out" in text
    assert text.rstrip().endswith("xxx"), "the message at the end is kept"


def test_step_results_too_large_for_the_failure_event_are_noted_not_kept(registry):
    big = "y" * 20_000
    define_workflow(
        "big",
        steps=[
            s.compute("small", lambda ctx: 1),
            s.compute("large", lambda ctx: big),
            s.compute("boom", lambda ctx: 1 / 0),
        ],
    )
    run = start_workflow("big")
    steps = Event.objects.get(stream_id=str(run.pk), type=ev.RUN_FAILED).payload["steps"]
    assert steps["small"] == 1
    assert steps["large"].startswith("… (20002 bytes, not kept)")


def test_a_completed_run_keeps_the_results_and_durations_of_its_last_segment(registry):
    define_workflow("add", steps=[s.compute("a", lambda ctx: 1), s.return_("done")])
    run = start_workflow("add")
    payload = Event.objects.get(stream_id=str(run.pk), type=ev.RUN_COMPLETED).payload
    assert payload["steps"] == {"a": 1}
    assert set(payload["durations"]) == {"0", "1"}
    assert all(ms >= 0 for ms in payload["durations"].values())


def test_the_picture_shows_results_durations_waits_and_deliveries(admin_client, shop, clock):
    clock.advance(hours=2)
    page = admin_client.get(run_url(shop["waiting"])).content.decode()
    mail = found(r'data-path="0">.*?</li>', page)
    assert "delivery:" in mail and "kf-delivery-pending" in mail, "requested, not delivered"
    wait = found(r'data-path="1">.*?</li>', page)
    assert "waited 2 h" in wait

    run_until_idle()  # the dispatch loop delivers the mail
    page = admin_client.get(run_url(shop["waiting"])).content.decode()
    assert "kf-delivery-delivered" in page

    page = admin_client.get(run_url(shop["failed"])).content.decode()
    read = found(r'data-path="0">.*?</li>', page)
    assert re.search(r'class="kf-took">[\d.]+ ms<', read), "how long the read took"
    assert '<code class="kf-value">null</code>' in read, "its result"


def test_the_timeline_is_one_line_per_event_saying_what_happened(admin_client, shop, clock):
    clock.advance(days=1)
    run_until_idle()
    page = admin_client.get(run_url(shop["sleeping"])).content.decode()
    summaries = re.findall(r'<span class="kf-what">([^<]*)</span>', page)
    assert summaries[0] == "started by manual"
    assert summaries[1].startswith("waits at step 0 until 2026-01-02 00:00:00 UTC")
    assert summaries[2:] == [
        "resumed at step 0 by timer",
        "completed with result &quot;slept&quot;",
    ]
    assert 'class="kf-operator"' not in page, "the engine's own events have no operator"
    assert page.count("<details>") >= 4, "each payload one click away"


# -- the definition the run started on -------------------------------------------------


def test_the_picture_is_drawn_from_the_definition_the_run_started_on(admin_client, registry):
    define_workflow(
        "crm",
        steps=[s.wait("PT1H"), s.webhook_send("https://crm.example.com/hook", body={})],
    )
    run = start_workflow("crm")
    registry.unregister("crm")
    define_workflow(
        "crm", steps=[s.wait("PT1H"), s.webhook_send("https://new-crm.example.com/hook", body={})]
    )
    page = admin_client.get(run_url(run)).content.decode()
    assert "webhook https://crm.example.com/hook" in page
    assert "new-crm.example.com" not in page
    assert "The registered definition differs from it" in page


def test_each_definition_version_is_stored_once(registry):
    workflow = define_workflow("once", steps=[s.return_(1)])
    for _ in range(3):
        start_workflow("once")
    snapshot = DefinitionSnapshot.objects.get()
    assert snapshot.fingerprint == workflow.fingerprint
    assert snapshot.outline["steps"][0]["label"] == "return"
    from kumiflow_django.definition.fingerprint import fingerprint

    assert fingerprint(snapshot.canonical) == workflow.fingerprint, "the canonical form itself"


def test_storing_a_snapshot_that_another_writer_stored_is_not_an_error(registry):
    workflow = define_workflow("twice", steps=[s.return_(1)])
    snapshots.remember(workflow)
    snapshots.forget()  # as a second process would: it does not know the row exists
    snapshots.remember(workflow)
    assert DefinitionSnapshot.objects.filter(fingerprint=workflow.fingerprint).count() == 1


# -- actions with an audit trail ------------------------------------------------------


@pytest.mark.parametrize(
    ("run_key", "operation", "summary"),
    [
        ("sleeping", "cancel", "cancelled"),
        ("sleeping", "wake", "woken now"),
        ("failed", "retry", "retried from the start"),
        ("failed", "retry-current", "retried from the start, on the current definition"),
    ],
)
def test_each_run_operation_confirms_first_then_records_operator_and_reason(
    admin_client, shop, run_key, operation, summary
):
    run = shop[run_key]
    before = run.version
    confirmation = admin_client.get(operate_url(run, operation))
    assert confirmation.status_code == 200
    assert "What will happen" in confirmation.content.decode()
    run.refresh_from_db()
    assert run.version == before, "a GET changes nothing"

    response = admin_client.post(
        operate_url(run, operation), {"reason": "ticket <b>#42</b>"}, follow=True
    )
    assert response.status_code == 200
    event = Event.objects.filter(stream_id=str(run.pk)).latest("version")
    assert event.created_by == "admin"
    assert event.payload["by"] == "admin"
    assert event.payload["reason"] == "ticket <b>#42</b>"
    page = response.content.decode()
    line = found(r'<li class="kf-event kf-line-operator".*?</summary>', page)
    assert summary in line
    assert "by admin" in line
    assert "ticket &lt;b&gt;#42&lt;/b&gt;" in line, "escaped"


def test_waking_a_run_that_waits_for_an_event_says_it_takes_the_timeout_path(admin_client, shop):
    page = admin_client.get(operate_url(shop["waiting"], "wake")).content.decode()
    assert "takes the TIMEOUT path" in page
    assert "use “Send event” instead" in page
    admin_client.post(operate_url(shop["waiting"], "wake"))
    run_until_idle()
    run = WorkflowRun.objects.get(pk=shop["waiting"].pk)
    assert run.result == {"approved": False}, "wake_run's behaviour is kept: a timeout"


def test_an_operation_that_does_not_apply_says_why_and_changes_nothing(admin_client, shop):
    run = shop["sleeping"]
    page = admin_client.get(operate_url(run, "retry")).content.decode()
    assert "Retry does not apply: the run is waiting, not failed" in page
    assert 'id="kf-confirm"' not in page
    response = admin_client.post(operate_url(run, "retry"), follow=True)
    assert "Not retried: the run is waiting, not failed: only failed runs are retried." in (
        response.content.decode()
    )
    assert Event.objects.filter(stream_id=str(run.pk)).count() == run.version


def test_retry_on_the_current_definition_moves_a_run_onto_a_changed_definition(
    admin_client, registry
):
    define_workflow("flaky", steps=[s.wait("PT1H"), s.compute("x", lambda ctx: 1 / 0)])
    run = start_workflow("flaky")
    registry.unregister("flaky")
    fixed = define_workflow(
        "flaky", on_change="fail", steps=[s.wait("PT1H"), s.compute("x", lambda ctx: 1)]
    )
    WorkflowRun.objects.filter(pk=run.pk).update(wake_at=run.started_at)
    run_until_idle()
    run.refresh_from_db()
    assert run.reason == "workflow_definition_changed"

    page = admin_client.get(operate_url(run, "retry")).content.decode()
    assert "no longer registered: the run will fail again" in page
    page = admin_client.get(operate_url(run, "retry-current")).content.decode()
    assert f"to the current one ({fixed.fingerprint[:12]}" in page
    admin_client.post(operate_url(run, "retry-current"), {"reason": "deployed the fix"})
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.fingerprint) == (RunStatus.COMPLETED, fixed.fingerprint)
    assert DefinitionSnapshot.objects.filter(fingerprint=fixed.fingerprint).exists()


def test_dispatch_and_schedule_operations_record_operator_and_reason(admin_client, shop):
    dispatch = Dispatch.objects.get(run_id=shop["waiting"].pk)
    url = reverse("admin:kumiflow_dispatch_operate", args=[dispatch.pk, "cancel"])
    assert "is not delivered" in admin_client.get(url).content.decode()
    admin_client.post(url, {"reason": "wrong address"})
    url = reverse("admin:kumiflow_dispatch_operate", args=[dispatch.pk, "redeliver"])
    admin_client.post(url, {"reason": "fixed it"})
    events = Event.objects.filter(stream_id=str(dispatch.pk)).order_by("version")
    cancelled, redelivery = [e for e in events if e.created_by == "admin"]
    assert cancelled.payload == {"by": "admin", "reason": "wrong address"}
    assert redelivery.payload == {"by": "admin", "reason": "fixed it"}


def test_operations_need_their_permission_also_to_see_the_confirmation(client, shop):
    viewer = staff_with()
    client.force_login(viewer)
    run = shop["sleeping"]
    for operation in ("cancel", "wake", "retry", "retry-current"):
        assert client.get(operate_url(run, operation)).status_code == 403
        assert client.post(operate_url(run, operation)).status_code == 403
    send = reverse("admin:kumiflow_workflowrun_send_event", args=[shop["waiting"].pk])
    assert client.get(send).status_code == 403
    assert client.post(send, {"stream_id": "x"}).status_code == 403
    page = client.get(run_url(shop["waiting"])).content.decode()
    assert 'id="kf-send-event"' not in page and 'id="kf-cancel"' not in page
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING

    client.force_login(staff_with("wake_workflowrun"))
    assert client.get(operate_url(run, "wake")).status_code == 200
    assert client.get(operate_url(run, "cancel")).status_code == 403


def test_operations_and_sending_an_event_need_the_csrf_token(shop):
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("root", "r@x.io", "pw"))
    assert client.post(operate_url(shop["sleeping"], "cancel")).status_code == 403
    send = reverse("admin:kumiflow_workflowrun_send_event", args=[shop["waiting"].pk])
    assert client.post(send, {"stream_id": "refund-1"}).status_code == 403
    page = client.get(operate_url(shop["sleeping"], "cancel")).content.decode()
    token = found(r'name="csrfmiddlewaretoken" value="([^"]+)"', page, 1)
    response = client.post(operate_url(shop["sleeping"], "cancel"), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert WorkflowRun.objects.get(pk=shop["sleeping"].pk).status == RunStatus.CANCELLED


def test_a_reason_too_long_is_refused_by_the_form_and_by_the_function(admin_client, shop):
    from kumiflow_django import InvalidEvent, cancel_run

    response = admin_client.post(operate_url(shop["sleeping"], "cancel"), {"reason": "x" * 1001})
    assert response.status_code == 200 and "at most 1000 characters" in response.content.decode()
    with pytest.raises(InvalidEvent, match="longer than 1000"):
        cancel_run(shop["sleeping"].pk, reason="x" * 1001)
    with pytest.raises(InvalidEvent, match="longer than 150"):
        cancel_run(shop["sleeping"].pk, by="o" * 151)
    with pytest.raises(InvalidEvent, match="control character"):
        cancel_run(shop["sleeping"].pk, by="op\nerator")
    assert WorkflowRun.objects.get(pk=shop["sleeping"].pk).status == RunStatus.WAITING


def test_bulk_actions_confirm_and_record_the_operator(admin_client, shop):
    url = reverse("admin:kumiflow_workflowrun_changelist")
    selected = {"action": "cancel_runs", "_selected_action": [shop["sleeping"].pk]}
    page = admin_client.post(url, selected).content.decode()
    assert "Cancel applies to 1 of the 1 selected" in page
    admin_client.post(url, {**selected, "confirm": "yes", "reason": "clean-up"})
    cancelled = Event.objects.get(stream_id=str(shop["sleeping"].pk), type=ev.RUN_CANCELLED)
    assert (cancelled.created_by, cancelled.payload["reason"]) == ("admin", "clean-up")


# -- sending the awaited event ------------------------------------------------------------


def test_the_send_event_form_is_prefilled_from_the_wait(admin_client, shop):
    url = reverse("admin:kumiflow_workflowrun_send_event", args=[shop["waiting"].pk])
    form = admin_client.get(url).context["form"]
    assert form.initial["stream_id"] == "refund-1", "the trigger's stream"
    assert form.initial["payload"] == '{\n  "refund": "R-1"\n}'
    page = admin_client.get(url).content.decode()
    assert '<code id="kf-event-type">refund.approved</code>' in page


def test_sending_the_awaited_event_moves_the_run_on_as_the_operator(admin_client, shop):
    url = reverse("admin:kumiflow_workflowrun_send_event", args=[shop["waiting"].pk])
    response = admin_client.post(
        url,
        {
            "stream_id": "refund-1",
            "payload": '{"refund": "R-1", "note": "<i>ok</i>"}',
            "reason": "approved by phone",
        },
        follow=True,
    )
    run = WorkflowRun.objects.get(pk=shop["waiting"].pk)
    assert run.status == RunStatus.COMPLETED and run.result == {"approved": True}
    sent = Event.objects.get(type="refund.approved")
    assert sent.created_by == "admin"
    assert sent.metadata["kumiflow.console"] == {
        "by": "admin",
        "run": str(run.pk),
        "reason": "approved by phone",
    }
    assert "the run took it and went on (now completed)" in response.content.decode()


def test_an_event_that_does_not_match_is_appended_and_the_operator_is_told(admin_client, shop):
    url = reverse("admin:kumiflow_workflowrun_send_event", args=[shop["waiting"].pk])
    response = admin_client.post(
        url, {"stream_id": "refund-1", "payload": '{"refund": "R-2"}'}, follow=True
    )
    assert "the run did not take it" in response.content.decode()
    assert WorkflowRun.objects.get(pk=shop["waiting"].pk).status == RunStatus.WAITING_EVENT


@pytest.mark.parametrize(
    ("payload", "error"),
    [("{not json", "not JSON"), ("[1, 2]", "must be a JSON object"), ('{"a": "\\u0000"}', "NUL")],
)
def test_a_bad_payload_is_a_form_error_not_a_server_error(admin_client, shop, payload, error):
    url = reverse("admin:kumiflow_workflowrun_send_event", args=[shop["waiting"].pk])
    response = admin_client.post(url, {"stream_id": "refund-1", "payload": payload})
    assert response.status_code == 200
    assert error in response.content.decode()
    assert not Event.objects.filter(type="refund.approved").exists()


def test_sending_needs_a_run_that_waits_for_an_event_of_the_application(admin_client, shop):
    url = reverse("admin:kumiflow_workflowrun_send_event", args=[shop["sleeping"].pk])
    assert "it waits for no event" in admin_client.get(url).content.decode()
    response = admin_client.post(url, {"stream_id": "x", "payload": "{}"})
    assert response.status_code == 302
    assert not Event.objects.filter(stream_id="x").exists()


# -- finding runs -----------------------------------------------------------------------------


def search(admin_client, term: str) -> list[WorkflowRun]:
    page = admin_client.get(reverse("admin:kumiflow_workflowrun_changelist"), {"q": term})
    return list(page.context["cl"].result_list)


def test_search_by_run_id_prefix(admin_client, shop):
    run = shop["sleeping"]
    assert search(admin_client, str(run.pk)[:8]) == [run]
    assert search(admin_client, str(run.pk)[:8].upper()) == [run]
    assert search(admin_client, str(run.pk)[:13]) == [run], "with its dash"


def test_a_run_id_prefix_needs_four_characters(admin_client, shop):
    assert search(admin_client, str(shop["sleeping"].pk)[:3]) == []


def test_search_by_idempotency_key_prefix_and_correlation_value(admin_client, shop):
    assert search(admin_client, "refund:") == [shop["waiting"]]
    assert search(admin_client, "REFUND:") in ([], [shop["waiting"]])  # case: as the database
    assert search(admin_client, "R-1") == [shop["waiting"]], "the value its wait matches on"
    assert search(admin_client, "refund:R-2") == []


def test_the_business_key_column(admin_client, shop):
    page = admin_client.get(reverse("admin:kumiflow_workflowrun_changelist")).content.decode()
    assert 'title="INV-7">INV-7<' in page, "the field the definition names"
    assert 'title="refund:R-1">refund:R-1<' in page, "the idempotency key"


def test_times_show_their_zone_and_how_far_they_are(admin_client, shop):
    page = admin_client.get(run_url(shop["sleeping"])).content.decode()
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d <span class=\"kf-tz\">UTC</span>", page)
    assert "in 24 h" in page or "in 23 h" in page, "its wake time"


def test_engine_events_are_hidden_unless_asked_for_or_a_stream_is_chosen(admin_client, shop):
    url = reverse("admin:kumiflow_event_changelist")

    def types(**params):
        return {e.type for e in admin_client.get(url, params).context["cl"].result_list}

    assert types() == {"invoice.overdue", "refund.requested"}
    assert ev.RUN_STARTED in types(engine="shown")
    assert types(engine="only") <= ev.RUN_EVENTS | ev.DISPATCH_EVENTS
    assert ev.RUN_STARTED in types(stream=str(shop["failed"].pk))
    assert types(type="refund.") == {"refund.requested"}, "a type's start"


# -- the overview -----------------------------------------------------------------------------


def test_the_overview_counts_runs_per_workflow_and_status_with_links(admin_client, shop):
    response = admin_client.get(reverse("admin:kumiflow_overview"))
    table = response.context["table"]
    rows = {name: figures for name, _, figures in table["rows"]}
    statuses = [s.value for s in overview.STATUSES]
    assert rows["reminder"][statuses.index("failed")].value == 1
    assert rows["refund"][statuses.index("waiting_event")].value == 1
    assert rows["sleepy"][statuses.index("waiting")].value == 1
    # The overview counts child runs too, so its links list them (the list hides them).
    url = table["total"][statuses.index("failed")].url
    assert url.endswith("?status__exact=failed&children=yes")
    page = response.content.decode()
    assert (
        'href="/admin/kumiflow/workflowrun/?workflow=reminder&amp;status__exact=failed'
        '&amp;children=yes">1<' in page
    )


def test_the_overview_needs_the_permission_to_view_runs(client, shop):
    user = User.objects.create_user("nobody", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(reverse("admin:kumiflow_overview")).status_code == 403
    client.force_login(staff_with())
    assert client.get(reverse("admin:kumiflow_overview")).status_code == 200


def test_a_count_stops_at_the_cap(admin_client, registry, monkeypatch):
    monkeypatch.setattr(overview, "CAP", 3)
    define_workflow("many", steps=[s.wait("P1D")])
    for _ in range(5):
        start_workflow("many")
    page = admin_client.get(reverse("admin:kumiflow_overview")).content.decode()
    assert ">3+<" in page


def test_the_overview_charts_count_per_minute_and_link_to_the_runs(admin_client, shop, clock):
    clock.advance(minutes=3)
    start_workflow("sleepy")
    start_workflow("sleepy")
    context = admin_client.get(reverse("admin:kumiflow_overview")).context
    hour, day = context["throughput"]
    started, completed, failed = hour["charts"]
    assert started["total"].value == 5
    assert failed["total"].value == 1
    bars = re.findall(r"<title>([^<]+)</title>", str(started["svg"]))
    assert len(bars) == 60
    counts = [int(title.rsplit(": ", 1)[1]) for title in bars]
    assert counts[-1] == 2 and counts[-4] == 3, "the last minute, and three minutes before"
    assert "started_at__gte=" in str(started["svg"]) and "started_at__lt=" in str(started["svg"])
    assert (
        sum(
            int(t.rsplit(": ", 1)[1])
            for t in re.findall(r"<title>([^<]+)</title>", str(day["charts"][0]["svg"]))
        )
        == 5
    )


def test_a_chart_bar_links_to_the_runs_it_counts(admin_client, shop):
    context = admin_client.get(reverse("admin:kumiflow_overview")).context
    failed = context["throughput"][0]["charts"][2]
    link = re.findall(
        r'<a href="([^"]+)"><rect class="kf-bar kf-bar-failed" x="[^"]+" y="[^"]+" '
        r'width="[^"]+" height="(?!0\.0)',
        str(failed["svg"]),
    )
    assert len(link) == 1
    url = link[0].replace("&amp;", "&")
    runs = admin_client.get(url).context["cl"].result_list
    assert list(runs) == [shop["failed"]]


def test_the_overview_shows_backlog_outbox_and_links_them(admin_client, shop, clock):
    clock.advance(days=1, minutes=1)  # the sleeper is due, for a minute now
    context = admin_client.get(reverse("admin:kumiflow_overview")).context
    backlog = context["backlog"]
    assert backlog["due"].value == 1
    assert 59 <= backlog["oldest"] <= 61
    due = admin_client.get(backlog["due"].url).context["cl"].result_list
    assert list(due) == [shop["sleeping"]]
    counts = dict(context["outbox"]["counts"])
    assert counts["pending"].value == 1, "the refund's mail (the reminder's was rolled back)"
    assert context["outbox"]["oldest_pending"] >= 60


def test_the_overview_reads_a_fixed_number_of_queries(admin_client, shop):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            admin_client.get(reverse("admin:kumiflow_overview"))
        return len(captured)

    before = queries()
    for _ in range(20):
        start_workflow("sleepy")
    assert queries() == before


def test_an_interval_holds_the_runs_from_its_start_to_just_before_its_end(registry, clock):
    define_workflow("tick", steps=[s.wait("P1D")])
    start = clock.now()
    start_workflow("tick")  # at 0 s: the first minute
    clock.advance(seconds=59.999)
    start_workflow("tick")  # still the first minute
    clock.advance(seconds=0.001)
    start_workflow("tick")  # at 60 s: the second
    [counts] = overview.interval_counts([("started_at", None, start, 60, 3)])
    assert counts == [2, 1, 0]
    [hours] = overview.interval_counts([("started_at", "waiting", start, 3600, 2)])
    assert hours == [3, 0]


# -- checks, demo --------------------------------------------------------------------------------


def test_a_model_label_of_a_read_or_model_step_is_checked_at_startup(registry):
    from kumiflow_django.checks import check_model_labels
    from kumiflow_django.definition.step import Step
    from kumiflow_django.definition.triggers import ManualTrigger
    from kumiflow_django.definition.workflow import Workflow

    # Defined while the app registry loads (a workflows.py), a label is not checked then.
    registry.register(
        Workflow(
            name="typo",
            trigger=ManualTrigger(),
            steps=(
                Step("read.find_one", "c", {"model": "shop.Custmer", "filter": {}}),
                Step("model.create", None, {"model": "Customer", "values": {}}),
                Step("model.create", None, {"model": "shop.Customer", "values": {}}),
                Step("model.create", None, {"model": Customer, "values": {}}),
            ),
        )
    )
    errors = check_model_labels()
    assert [(e.id, e.obj) for e in errors] == [("kumiflow.E100", "typo")] * 2
    assert "step 0 (read.find_one): 'shop.Custmer' is not an installed model" in errors[0].msg
    assert "it is not of the form 'app_label.ModelName'" in errors[1].msg


def test_the_admin_clock_is_the_engines(shop, clock):
    assert overview.context()["now"] == clock.now()
    clock.advance(timedelta(hours=1))
    assert overview.context()["now"] == clock.now()


def test_the_run_list_reads_a_fixed_number_of_queries_with_reasons_and_delivery_flags(
    admin_client, registry, clock
):
    """Each row says why its run failed and whether a delivery of a completed
    run is dead: read per page, not per run (5 runs or 50, the same queries);
    the error text a run failed with is escaped, where the list shows it."""
    from kumiflow_django.models import DispatchStatus

    define_workflow(
        "hooked",
        steps=[s.webhook_send("https://crm.example.com/hook", body={}, name="hook")],
    )

    def boom(ctx):
        raise RuntimeError("<script>alert('why')</script>")

    define_workflow("broken", steps=[s.compute("x<img src=x onerror=alert(1)>", boom)])

    def make(n: int) -> None:
        for _ in range(n):
            start_workflow("broken")
            start_workflow("hooked")
        Dispatch.objects.update(status=DispatchStatus.DEAD)

    def queries() -> tuple[int, str]:
        with CaptureQueriesContext(connection) as captured:
            page = admin_client.get(reverse("admin:kumiflow_workflowrun_changelist"))
        assert page.status_code == 200
        return len(captured), page.content.decode()

    make(3)
    few, html = queries()
    assert "webhook dead" in html
    assert "<script>alert(" not in html and "&lt;script&gt;" in html
    assert "<img src=x" not in html
    make(22)
    assert WorkflowRun.objects.count() == 50
    many, html = queries()
    assert html.count("webhook dead") == 25
    assert many == few
