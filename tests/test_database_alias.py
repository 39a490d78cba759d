"""KUMIFLOW_DATABASE: every table, transaction and lock of kumiflow-django in
another database than the project's default one.

The run, its events, its outbox rows and its cron schedule are all written to
and read from the "workflows" database; the default database holds none of
them, and the engine works the same (a wait, a resume, a delivery, the admin).
"""

from __future__ import annotations

import pytest
from django.test import override_settings

from kumiflow_django import append_event, define_workflow, on_cron, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import CronSchedule, Dispatch, Event, WorkflowRun
from kumiflow_django.testing import run_until_idle

pytestmark = [
    pytest.mark.django_db(databases=["default", "workflows"], transaction=True),
]


@pytest.fixture
def on_workflows_db():
    with override_settings(KUMIFLOW_DATABASE="workflows"):
        yield


def counts(alias: str) -> dict[str, int]:
    return {
        model.__name__: model._base_manager.using(alias).count()
        for model in (Event, WorkflowRun, Dispatch, CronSchedule)
    }


def test_everything_lives_in_the_configured_database(registry, clock, on_workflows_db, mailoutbox):
    define_workflow(
        "welcome",
        trigger=on_event("user.signed-up"),
        steps=[
            s.wait("PT1H"),
            s.mail_send(to="ada@example.com", subject="Hello", body="…"),
            s.return_("done"),
        ],
    )
    define_workflow("nightly", trigger=on_cron("0 3 * * *"), steps=[s.return_(1)])
    append_event("user-1", "user.signed-up", {"id": 1})
    run = WorkflowRun.objects.get()
    assert run.status == "waiting"

    clock.advance(hours=1)
    run_until_idle()

    run.refresh_from_db()
    assert run.status == "completed" and run._state.db == "workflows"
    assert len(mailoutbox) == 1
    assert counts("default") == {"Event": 0, "WorkflowRun": 0, "Dispatch": 0, "CronSchedule": 0}
    assert counts("workflows")["Event"] >= 5
    assert counts("workflows")["Dispatch"] == 1
    assert counts("workflows")["CronSchedule"] == 1


def test_the_admin_and_operations_use_it_too(registry, clock, on_workflows_db, admin_client):
    define_workflow("napper", steps=[s.wait("PT1H"), s.return_(1)])
    run = start_workflow("napper")

    page = admin_client.get(f"/admin/kumiflow/workflowrun/{run.id}/change/")
    listing = admin_client.get("/admin/kumiflow/workflowrun/")

    assert page.status_code == 200 and str(run.id) in page.content.decode()
    assert listing.status_code == 200 and str(run.id)[:8] in listing.content.decode()
    assert counts("default")["WorkflowRun"] == 0
