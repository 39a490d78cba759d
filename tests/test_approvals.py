"""Approvals: a declared wait for a person, decided through decide_approval."""

from __future__ import annotations

import pytest

from kumiflow_django import (
    InvalidApproval,
    InvalidRunState,
    WorkflowDefinitionError,
    decide_approval,
    define_workflow,
    start_workflow,
    waiting_approvals,
)
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.store import names as ev
from tests.helpers import run_events

pytestmark = pytest.mark.django_db


@pytest.fixture
def refunds(registry):
    return define_workflow(
        "refund",
        attributes={"customer": lambda ctx: ctx.trigger.payload["customer"]},
        steps=[
            s.approval(
                "manager",
                choices=["approve", "decline"],
                fields={"note": str, "amount": int},
                timeout="P7D",
            ),
            s.return_(lambda ctx: ctx.steps["manager"]["payload"]["choice"]),
        ],
    )


def test_an_approved_run_continues_with_the_decision_as_the_step_result(refunds):
    run = start_workflow("refund", payload={"customer": "C-17"})
    assert run.status == RunStatus.WAITING_EVENT
    assert list(waiting_approvals()) == [run]

    decided = decide_approval(
        run.id, "approve", fields={"note": "ok", "amount": 12}, by="alice", reason="checked"
    )

    assert decided.status == RunStatus.COMPLETED
    assert decided.result == "approve"
    event = next(e for e in run_events(run) if e.type == ev.APPROVAL_DECIDED)
    assert event.created_by == "alice"
    assert event.payload == {
        "approval": "manager",
        "choice": "approve",
        "fields": {"note": "ok", "amount": 12},
        "by": "alice",
        "reason": "checked",
    }
    assert not waiting_approvals().exists()


@pytest.mark.parametrize(
    ("choice", "fields", "message"),
    [
        ("maybe", None, "not one of its choices"),
        ("approve", {"colour": "red"}, "declares no field 'colour'"),
        ("approve", {"amount": "12"}, "must be int, not str"),
        ("approve", {"amount": True}, "must be int, not bool"),
        ("approve", {"note": "a\x00b"}, "must not contain NUL"),
    ],
)
def test_a_decision_the_approval_does_not_declare_is_refused(refunds, choice, fields, message):
    run = start_workflow("refund", payload={"customer": "C-17"})
    with pytest.raises(InvalidApproval, match=message):
        decide_approval(run.id, choice, fields=fields, by="alice")
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_EVENT
    assert ev.APPROVAL_DECIDED not in [e.type for e in run_events(run)]


def test_a_run_that_does_not_wait_at_an_approval_is_refused(refunds):
    run = start_workflow("refund", payload={"customer": "C-17"})
    decide_approval(run.id, "decline", by="alice")
    with pytest.raises(InvalidRunState, match="not waiting at an approval"):
        decide_approval(run.id, "approve", by="bob")
    with pytest.raises(InvalidRunState, match="not 'other'"):
        decide_approval(
            start_workflow("refund", payload={"customer": "C-1"}).id, "approve", approval="other"
        )


def test_an_approval_event_appended_by_application_code_is_refused(refunds):
    from kumiflow_django import InvalidEvent, append_event

    run = start_workflow("refund", payload={"customer": "C-17"})
    with pytest.raises(InvalidEvent, match="reserved"):
        append_event(str(run.id), ev.APPROVAL_DECIDED, {"approval": "manager", "choice": "approve"})
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_EVENT


def test_a_run_rebuilt_keeps_its_version_past_the_decision(refunds):
    from kumiflow_django.projections.rebuild import rebuild_all

    run = start_workflow("refund", payload={"customer": "C-17"})
    decided = decide_approval(run.id, "approve", by="alice")
    rebuild_all()
    assert WorkflowRun.objects.get(pk=run.pk).version == decided.version


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"choices": []}, "1 to 10 choices"),
        ({"choices": ["ok", "ok"]}, "must differ"),
        ({"choices": ["not ok"]}, "identifier-like"),
        ({"fields": {"note": float}}, "must be str, int or bool"),
        ({"permission": "approve"}, "app_label.codename"),
    ],
)
def test_an_approval_is_checked_when_the_workflow_is_defined(registry, kwargs, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        define_workflow("bad-approval", steps=[s.approval("manager", **kwargs)])


def test_an_approval_in_a_parallel_branch_is_refused_when_the_workflow_is_defined(registry):
    with pytest.raises(WorkflowDefinitionError, match="cannot wait in a branch of a parallel"):
        define_workflow(
            "branch-approval",
            steps=[s.parallel("both", {"a": [s.approval("manager")], "b": [s.wait("PT1M")]})],
        )
    with pytest.raises(WorkflowDefinitionError, match="cannot wait in a branch of a parallel"):
        define_workflow(
            "loop-approval",
            steps=[
                s.for_each(
                    lambda ctx: [1, 2], "n", do=[s.approval("manager")], parallel=True, name="all"
                )
            ],
        )
    # a sequential loop is a run's own wait, one approval after the other
    define_workflow(
        "loop-approval", steps=[s.for_each(lambda ctx: [1, 2], "n", do=[s.approval("manager")])]
    )


def test_a_plain_wait_for_the_decision_event_is_refused_when_the_workflow_is_defined(registry):
    # It would sit in the inbox as an approval nobody can decide, or watch
    # another run's decisions through its match.
    with pytest.raises(WorkflowDefinitionError, match=r"steps\.approval"):
        define_workflow(
            "peek-approval",
            steps=[s.wait_for_event(ev.APPROVAL_DECIDED, match={"stream_id": "another-run"})],
        )
    assert not waiting_approvals().exists()


def test_a_decision_is_checked_against_the_runs_own_definition(registry):
    define_workflow("versioned-approval", version="1", steps=[s.approval("manager")])
    define_workflow(
        "versioned-approval",
        version="2",
        steps=[s.approval("manager", choices=["approve", "decline", "escalate"])],
    )
    run = start_workflow("versioned-approval", version="1")
    with pytest.raises(InvalidApproval, match="not one of its choices"):
        decide_approval(run.id, "escalate", by="alice")
    assert decide_approval(run.id, "approve", by="alice").status == RunStatus.COMPLETED
