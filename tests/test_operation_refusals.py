"""Whether an operation applies is said once (``refuse_*`` beside the operation):
for runs and dispatches in every state, the admin offers exactly the operations
the engine accepts, and the HTTP API answers 409 for exactly the others."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse

from kumiflow_django import (
    KumiflowError,
    Limit,
    append_event,
    cancel_run,
    define_workflow,
    on_cron,
    on_event,
    restart_run,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.admin.dispatches import OPERATIONS as DISPATCH_OPERATIONS
from kumiflow_django.admin.runs import RUN_OPERATIONS
from kumiflow_django.admin.schedules import OPERATIONS as SCHEDULE_OPERATIONS
from kumiflow_django.cron.schedules import set_enabled
from kumiflow_django.http.tokens import API_PERMISSIONS, create_token
from kumiflow_django.models import (
    Compensation,
    CronSchedule,
    Dispatch,
    DispatchStatus,
    Event,
    RunStatus,
    WorkflowRun,
)
from kumiflow_django.outbox.actions import cancel_dispatch
from kumiflow_django.testing import run_until_idle
from kumiflow_django.workers.cron import CronLoop

pytestmark = pytest.mark.django_db


class Rollback(Exception):
    """Undoes what a probe did: every operation is tried on the same state."""


def accepted(perform: Callable[..., Any], *args: Any) -> bool:
    """Whether the engine does the operation (tried in a savepoint, then undone)."""
    try:
        with transaction.atomic():
            perform(*args, "probe", "")
            raise Rollback
    except Rollback:
        return True
    except KumiflowError:
        return False


def restart(run: WorkflowRun, definition: Any, by: str, reason: str) -> Any:
    return restart_run(run.id, from_step="0", definition=definition, by=by, reason=reason)


def reload(run: WorkflowRun) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=run.pk)


@pytest.fixture
def runs(registry, clock) -> dict[str, WorkflowRun]:
    """A run in each state an operator meets."""
    undo = [s.append_event("undo-log", "undo.ran")]
    define_workflow("done", steps=[s.return_("ok")])
    define_workflow("broken", steps=[s.compute("x", lambda ctx: 1 / 0)])
    define_workflow(
        "undone",
        steps=[
            s.compute("a", lambda ctx: 1, compensate=undo),
            s.wait("PT1M"),
            s.compute("b", lambda ctx: 1 / 0),
        ],
    )
    define_workflow(
        "undoing",
        steps=[
            s.compute("a", lambda ctx: 1, compensate=[s.wait("PT5M"), *undo]),
            s.wait("PT1M"),
            s.compute("b", lambda ctx: 1 / 0),
        ],
    )
    define_workflow("sleepy", steps=[s.wait("P1D"), s.return_("slept")])
    define_workflow("patient", steps=[s.wait_for_event("reply", name="r")])
    define_workflow(
        "flaky",
        steps=[s.retry([s.compute("x", lambda ctx: 1 / 0)], attempts=3, base=60.0)],
    )
    define_workflow(
        "limited",
        trigger=on_event("go"),
        concurrency=Limit(key=lambda event: "one", max=1),
        steps=[s.wait("P1D")],
    )
    define_workflow("evolving", steps=[s.wait("PT1M"), s.wait("PT1M"), s.return_("old")])

    made = {
        "completed": start_workflow("done"),
        "failed": start_workflow("broken"),
        "compensated": start_workflow("undone"),
        "compensating": start_workflow("undoing"),
        "waiting": start_workflow("sleepy"),
        "cancelled": start_workflow("sleepy"),
        "waiting for an event": start_workflow("patient"),
        "retry scheduled": start_workflow("flaky"),
        "evolved": start_workflow("evolving"),
    }
    cancel_run(made["cancelled"].id)
    append_event("g-1", "go")
    append_event("g-2", "go")
    made["queued"] = WorkflowRun.objects.get(workflow="limited", status=RunStatus.QUEUED)
    clock.advance(minutes=1)
    run_until_idle()
    registry.unregister("evolving")
    define_workflow("evolving", on_change="fail", steps=[s.return_("new")])
    clock.advance(minutes=1)
    run_until_idle()
    made = {state: reload(run) for state, run in made.items()}
    assert (made["compensated"].status, made["compensated"].compensation) == (
        RunStatus.FAILED,
        Compensation.COMPENSATED,
    )
    assert made["compensating"].compensation == Compensation.RUNNING
    assert made["retry scheduled"].status == RunStatus.RETRY_SCHEDULED
    assert made["evolved"].reason == "workflow_definition_changed"
    return made


def offered_on_page(client: Client, url: str) -> set[str]:
    page = client.get(url).content.decode()
    return set(re.findall(r'class="button kf-op" id="kf-([a-z-]+)"', page)) - {"send-event"}


def confirmable(client: Client, url: str) -> bool:
    return 'id="kf-confirm"' in client.get(url).content.decode()


def test_the_admin_offers_on_a_run_exactly_what_the_engine_accepts(admin_client, runs):
    seen: dict[str, set[str]] = {}
    for state, run in runs.items():
        engine = {name for name, op in RUN_OPERATIONS.items() if accepted(op.perform, run)}
        if any(accepted(restart, run, definition) for definition in ("run", "current")):
            engine.add("restart")  # its own page (the pre-flight), the same rule
        page = offered_on_page(
            admin_client, reverse("admin:kumiflow_workflowrun_change", args=[run.pk])
        )
        assert page == engine, state
        for name in RUN_OPERATIONS:
            url = reverse("admin:kumiflow_workflowrun_operate", args=[run.pk, name])
            assert confirmable(admin_client, url) == (name in engine), (state, name)
        seen[state] = engine
    # the states are the ones meant (and the compensated run is not offered a retry)
    assert seen["compensated"] == {"restart"}  # start again, not retry
    assert seen["failed"] == {"retry", "retry-current", "restart"}
    assert seen["evolved"] == {"retry", "restart"}
    assert seen["waiting"] == {"cancel", "wake", "pause", "fail"}
    assert seen["compensating"] == {"cancel", "wake", "pause"}  # it ends as it compensates
    assert seen["queued"] == {"cancel", "pause", "fail"}
    assert seen["completed"] == seen["cancelled"] == {"restart"}


def test_the_http_api_refuses_exactly_what_the_engine_refuses(runs):
    _, secret = create_token("probe", permissions=API_PERMISSIONS)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    for state, run in runs.items():
        for name in ("cancel", "retry", "wake"):
            engine = accepted(RUN_OPERATIONS[name].perform, run)
            with transaction.atomic():
                answer = client.post(
                    f"/api/kumiflow/runs/{run.pk}/{name}/", {}, content_type="application/json"
                )
                transaction.set_rollback(True)
            assert answer.status_code == (200 if engine else 409), (state, name)


def test_the_admin_offers_on_a_dispatch_exactly_what_the_outbox_accepts(
    admin_client, registry, clock
):
    define_workflow("notify", steps=[s.mail_send(to="a@x.io", subject="s", body="b")])
    define_workflow("hook", steps=[s.webhook_send(url="http://127.0.0.1/hook")])
    start_workflow("notify")
    start_workflow("hook")
    run_until_idle()
    start_workflow("notify")
    start_workflow("notify")
    cancel_dispatch(Dispatch.objects.filter(status=DispatchStatus.PENDING)[0].id)
    statuses = set()
    for dispatch in Dispatch.objects.all():
        engine = {
            name for name, op in DISPATCH_OPERATIONS.items() if accepted(op.perform, dispatch)
        }
        page = admin_client.get(reverse("admin:kumiflow_dispatch_change", args=[dispatch.pk]))
        offered = set(re.findall(r'/operate/([a-z-]+)/" *>', page.content.decode()))
        assert offered == engine, dispatch.status
        statuses.add(dispatch.status)
    assert statuses == {
        DispatchStatus.PENDING,
        DispatchStatus.DELIVERED,
        DispatchStatus.DEAD,
        DispatchStatus.CANCELLED,
    }


def test_the_admin_offers_on_a_schedule_exactly_what_changes_it(admin_client, registry, clock):
    """Fire applies to a registered workflow; enable and disable to a schedule
    that is not so already (set_enabled leaves such a one as it is)."""
    for name in ("on", "off", "gone"):
        define_workflow(name, trigger=on_cron("0 3 * * *"), steps=[s.return_(1)])
    CronLoop().run_once()
    set_enabled("off", False)
    registry.unregister("gone")
    offered_in = {}
    for schedule in CronSchedule.objects.all():

        def changes(op: Any, schedule: CronSchedule = schedule) -> bool:
            def perform(*args: Any) -> None:
                op.perform(*args)
                if Event.objects.filter(stream_id=schedule.stream_id).count() == schedule.version:
                    raise KumiflowError("nothing changed")

            return accepted(perform, schedule)

        engine = {name for name, op in SCHEDULE_OPERATIONS.items() if changes(op)}
        page = admin_client.get(
            reverse("admin:kumiflow_cronschedule_change", args=[schedule.pk])
        ).content.decode()
        assert set(re.findall(r'/operate/([a-z-]+)/" *>', page)) == engine, schedule.workflow
        offered_in[schedule.workflow] = engine
    assert offered_in == {"on": {"fire", "disable"}, "off": {"fire", "enable"}, "gone": {"disable"}}
