"""Deciding approvals: the one function the console, the HTTP API and code call.

A run waiting at an ``approval`` step waits for an ``approval-decided``
event on its own stream. :func:`decide_approval` locks the run, asks
:func:`refuse_decide` whether it waits at that approval, checks the choice
and fields against the declaration, and appends the event with the operator
as its ``created_by`` (and in its payload, with the reason): the log says who
decided, when and why. Appending it wakes the run like any awaited event.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from kumiflow_django.definition.approvals import clean_decision
from kumiflow_django.definition.registry import registry
from kumiflow_django.engine.operations import _append, _lock
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.projections.waits import ROOT, RunWait, own_wait
from kumiflow_django.store import db, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl
from kumiflow_django.store.audit import check_operator
from kumiflow_django.store.errors import InvalidApproval, InvalidRunState, raise_refusal
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.engine.approvals")

#: The permission every decider needs (besides an approval's own ``permission=``).
DECIDE_PERMISSION = "kumiflow.decide_approval_workflowrun"


@dataclass(frozen=True)
class Approval:
    """The approval a run waits at, as its definition declares it."""

    name: str
    choices: tuple[str, ...]
    fields: dict[str, str]
    permission: str | None

    def declared(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "choices": list(self.choices),
            "fields": dict(self.fields),
            "permission": self.permission,
        }


def waiting_approvals() -> QuerySet[WorkflowRun, WorkflowRun]:
    """Runs that wait for a person (at an approval), the longest waiting first."""
    approvals = RunWait.objects.filter(branch=ROOT, event_type=ev.APPROVAL_DECIDED)
    return WorkflowRun.objects.filter(
        status=RunStatus.WAITING_EVENT, id__in=approvals.values("run_id")
    ).order_by("updated_at", "started_at")


def _awaited_approval(run: WorkflowRun) -> str | None | bool:
    """The approval's name the run's own wait matches on (None: unnamed), or
    False when the run does not wait for a decision."""
    if run.status != RunStatus.WAITING_EVENT:
        return False
    wait = own_wait(run)
    if wait is None or wait.event_type != ev.APPROVAL_DECIDED:
        return False
    match = wait.match if isinstance(wait.match, dict) else {}
    name = match.get("payload.approval")
    return name if isinstance(name, str) else None


def approval_of(run: WorkflowRun) -> Approval | None:
    """The approval ``run`` waits at (None: it waits at none, or its
    workflow is not registered here, or no longer declares it there)."""
    name = _awaited_approval(run)
    if name is False:
        return None
    if not registry.is_registered(run.workflow) or not run.cursor:
        return None
    # The run's own definition where it is registered (another version may
    # declare other choices); else the current one, which it would resume on.
    workflow = registry.with_fingerprint(run.workflow, run.fingerprint) or registry.get(
        run.workflow
    )
    try:
        step = workflow.step_at(list(run.cursor))
    except (LookupError, IndexError, TypeError, ValueError):
        return None
    declared = step.args.get("approval") if step.kind == "wait_for_event" else None
    if not declared or declared["name"] != name:
        return None
    return Approval(
        name=declared["name"],
        choices=tuple(declared["choices"]),
        fields=dict(declared["fields"]),
        permission=declared.get("permission"),
    )


def refuse_decide(run: WorkflowRun, approval: str | None = None) -> str | None:
    """Why :func:`decide_approval` does not apply to ``run`` (None: it does)."""
    if _awaited_approval(run) is False:
        return f"the run is {run.status}, not waiting at an approval"
    if run.matched_position is not None:
        return "the run's approval is decided already; it continues shortly"
    found = approval_of(run)
    if found is None:
        return "the run waits at an approval its registered definition no longer declares"
    if approval is not None and approval != found.name:
        return f"the run waits at approval {found.name!r}, not {approval!r}"
    return None


def can_decide(user: Any, run: WorkflowRun) -> bool:
    """Whether ``user`` may decide the approval ``run`` waits at: the
    ``decide_approval_workflowrun`` permission and the approval's own."""
    if not user.has_perm(DECIDE_PERMISSION):
        return False
    found = approval_of(run)
    return found is None or found.permission is None or bool(user.has_perm(found.permission))


@db.retrying
def decide_approval(
    run_id: uuid.UUID | str,
    choice: str,
    *,
    fields: dict[str, Any] | None = None,
    by: str = "",
    reason: str = "",
    approval: str | None = None,
    tenant: str | None = None,
) -> WorkflowRun:
    """Decide the approval a run waits at: ``choice`` one of its choices,
    ``fields`` its declared fields (all optional). ``approval`` names the
    approval the caller saw (a guard against deciding a later one).

    Raises RunNotFound, InvalidRunState (the run does not wait at an
    approval) or InvalidApproval (a choice or field the approval does not
    declare, a value of the wrong type).
    """
    by, reason = check_operator(by, reason)
    with db.atomic():
        run = _lock(run_id, tenant)
        raise_refusal(refuse_decide(run, approval), InvalidRunState, f"run {run.id}")
        found = approval_of(run)
        assert found is not None
        try:
            choice, cleaned = clean_decision(found.declared(), choice, fields)
        except ValueError as exc:
            raise InvalidApproval(str(exc)) from exc
        payload: pl.ApprovalDecided = {
            "approval": found.name,
            "choice": choice,
            "fields": cleaned,
            "by": by,
        }
        if reason:
            payload["reason"] = reason
        _append(run, ev.APPROVAL_DECIDED, dict(payload), by)
        updated = WorkflowRun.objects.get(pk=run.pk)
    logger.info(
        "run %s: approval %s decided %s by %s",
        run.id,
        found.name,
        choice,
        by or "code",
        extra=telemetry.run_log_fields(run),
    )
    return updated
