"""The API's approvals: the inbox and a decision, through ``decide_approval``.

The same calls as the console's inbox: the list is ``waiting_approvals``
in the caller's tenants, a decision is ``decide_approval`` with the caller
as ``by``, permitted by ``can_decide`` (the ``decide_approval_workflowrun``
permission and the approval's own ``permission=``).
"""

from __future__ import annotations

from typing import Any

from kumiflow_django import decide_approval, waiting_approvals
from kumiflow_django.engine.approvals import approval_of, can_decide
from kumiflow_django.http import serializers, tokens
from kumiflow_django.http.auth import Principal
from kumiflow_django.http.errors import ApiError, from_kumiflow
from kumiflow_django.http.service import find_run, operator
from kumiflow_django.store import sql
from kumiflow_django.store.audit import check_operator
from kumiflow_django.store.errors import InvalidEvent, KumiflowError
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.http")

#: Runs the list answers at most (the longest waiting first).
LIMIT = 200


def list_approvals(principal: Principal, *, workflow: str | None = None) -> dict[str, Any]:
    principal.require(tokens.VIEW)
    qs = waiting_approvals().filter(sql.exact_in("tenant_id", principal.tenants))
    if workflow is not None:
        qs = qs.filter(workflow=workflow)
    out = []
    for run in qs[:LIMIT]:
        found = approval_of(run)
        out.append(
            {
                "run": serializers.run_summary(run),
                "approval": found.name if found else None,
                "choices": list(found.choices) if found else [],
                "fields": dict(found.fields) if found else {},
                "waiting_since": serializers.timestamp(run.updated_at),
            }
        )
    return {"approvals": out}


def decide(principal: Principal, run_id: str, body: dict[str, Any]) -> dict[str, Any]:
    principal.require(tokens.DECIDE)
    run = find_run(principal, run_id)
    if not can_decide(principal, run):
        found = approval_of(run)
        perm = found.permission if found is not None else tokens.DECIDE
        raise ApiError("forbidden", f"this approval needs the permission {perm}")
    by = operator(principal)
    try:
        __, reason = check_operator(by, body.get("reason", ""))
    except InvalidEvent as exc:
        raise from_kumiflow(exc, field="reason") from exc
    try:
        updated = decide_approval(
            run.id,
            body["choice"],
            fields=body.get("fields"),
            by=by,
            reason=reason,
            approval=body.get("approval"),
            tenant=run.tenant_id,
        )
    except KumiflowError as exc:
        raise from_kumiflow(exc, field="choice" if "choice" in str(exc) else "fields") from exc
    logger.info("run %s: approval decided %s by %s", run.id, body["choice"], principal.name)
    if principal.has_perm(tokens.VIEW):
        return serializers.run_detail(updated)
    return serializers.run_summary(updated)
