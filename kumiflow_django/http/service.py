"""What each endpoint does, as plain functions of a caller and validated input.

The views only authenticate, parse and render; everything that decides
something is here and is tested without HTTP. Every function checks the
caller's permission first, so a caller without it changes nothing, and
reads runs only within the caller's tenants, so another tenant's run is
"not found" rather than "forbidden".
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kumiflow_django import (
    KumiflowError,
    UnknownWorkflow,
    append_event,
    cancel_run,
    fail_run,
    pause_run,
    restart_plan,
    restart_run,
    resume_run,
    retry_run,
    start_workflow,
    wake_run,
)
from kumiflow_django.conf import settings
from kumiflow_django.definition.attributes import parse_filter
from kumiflow_django.engine import bulk as bulk_ops
from kumiflow_django.http import serializers, tokens
from kumiflow_django.http.auth import Principal
from kumiflow_django.http.errors import ApiError, bad_request, from_kumiflow
from kumiflow_django.models import WorkflowRun
from kumiflow_django.projections import attributes as attribute_index
from kumiflow_django.store import limits, log, sql
from kumiflow_django.store.audit import check_operator
from kumiflow_django.store.errors import InvalidEvent
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.values import to_json

logger = get_logger("kumiflow_django.http")


def parse_run_id(run_id: str) -> uuid.UUID:
    """A run id of the URL; a malformed one is a run that does not exist (404)."""
    try:
        return uuid.UUID(run_id)
    except (ValueError, TypeError):
        raise ApiError("not_found", "no such run") from None


def find_run(principal: Principal, run_id: str) -> WorkflowRun:
    """The run with this id in one of the caller's tenants, or a 404 (also for a
    run of another tenant: it is not found, not forbidden)."""
    run = sql.select_one(WorkflowRun, id=parse_run_id(run_id))
    if run is None or run.tenant_id not in principal.tenants:
        raise ApiError("not_found", "no such run")
    return run


def get_run(principal: Principal, run_id: str) -> dict[str, Any]:
    principal.require(tokens.VIEW)
    return serializers.run_detail(find_run(principal, run_id))


def list_runs(
    principal: Principal,
    *,
    workflow: str | None = None,
    status: str | None = None,
    tenant: str | None = None,
    attribute: str | None = None,
    cursor: str | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """A page of runs, newest first, and the cursor of the next page.

    Pages are cut on (started_at, id), not on offsets: a run started while
    a client pages through the list appears at the top and never shifts or
    repeats a row of the pages that follow.
    """
    principal.require(tokens.VIEW)
    size = settings.API_PAGE_SIZE if limit is None else limit
    if size > settings.API_MAX_PAGE_SIZE:
        raise bad_request("limit", f"must be at most {settings.API_MAX_PAGE_SIZE}")
    tenants = (principal.tenant(tenant),) if tenant is not None else principal.tenants
    using = WorkflowRun.objects.all().db  # routed as the ORM routes a read
    field = WorkflowRun._meta.get_field

    def column(name: str) -> str:
        return sql.column(field(name), using)  # type: ignore[arg-type]

    def value(name: str, given: Any) -> Any:
        return sql.prep(field(name), given, using)  # type: ignore[arg-type]

    marks = ", ".join(["%s"] * len(tenants))
    conditions = [f"{column('tenant_id')} IN ({marks})"]
    params = [value("tenant_id", t) for t in tenants]
    exact = sql.exactly(column("tenant_id"), using)
    if exact != column("tenant_id"):
        # MariaDB: its collation would let a token of "acme" list the runs of
        # "ACME" and "acme "; the index finds the candidates, this keeps its own.
        conditions.append(f"{exact} IN ({marks})")
        params += [value("tenant_id", t) for t in tenants]
    for name, given in (("workflow", workflow), ("status", status)):
        if given is not None:
            conditions.append(f"{column(name)} = %s")
            params.append(value(name, given))
    if attribute is not None:
        try:
            name, wanted = parse_filter(attribute)
        except ValueError as exc:
            raise bad_request("attribute", str(exc)) from exc
        matching = attribute_index.matching(name, wanted).query.get_compiler(using=using)
        subquery, more = matching.as_sql()
        conditions.append(f"{column('id')} IN ({subquery})")
        params.extend(more)
    if cursor is not None:
        started, last_id = serializers.decode_cursor(cursor)
        at, before = value("started_at", started), value("id", last_id)
        started_at, run_id = column("started_at"), column("id")
        conditions.append(f"({started_at} < %s OR ({started_at} = %s AND {run_id} < %s))")
        params.extend((at, at, before))
    columns = ", ".join(column(name) for name in serializers.SUMMARY_FIELDS)
    # Names come from the model, quoted; values are parameters; the limit an int.
    statement = (
        f"SELECT {columns} FROM {sql.table(WorkflowRun, using)} "  # noqa: S608
        f"WHERE {' AND '.join(conditions)} "
        f"ORDER BY {column('started_at')} DESC, {column('id')} DESC LIMIT {int(size) + 1}"
    )
    rows = sql.rows(statement, params, using=using) if tenants else []
    page = serializers.summaries(rows[:size], using)
    more = len(rows) > size
    return {
        "runs": page,
        "next_cursor": serializers.encode_cursor(
            datetime.fromisoformat(page[-1]["started_at"]), uuid.UUID(page[-1]["id"])
        )
        if more
        else None,
    }


def start_run(principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    """Start a run (its first segment runs now, unless the workflow is deferred)."""
    principal.require(tokens.START)
    tenant = principal.tenant(body.get("tenant"))
    _check_fields(
        body,
        (
            "idempotency_key",
            lambda k: k is None or log.check_text(k, "idempotency_key", limits.IDEMPOTENCY_KEY),
        ),
        ("payload", lambda p: to_json(dict(p or {}), "payload")),
    )
    try:
        run = start_workflow(
            body["workflow"],
            payload=body.get("payload"),
            tenant=tenant,
            idempotency_key=body.get("idempotency_key"),
            version=body.get("version"),
            priority=body.get("priority"),
        )
    except UnknownWorkflow as exc:
        raise from_kumiflow(exc, field="version" if body.get("version") else "workflow") from exc
    except KumiflowError as exc:
        # The name, the key and the version are checked by the schema; what the
        # engine still refuses is the payload (its size, its values, a key from it).
        raise from_kumiflow(exc, field="payload") from exc
    logger.info("run %s of %s started by %s", run.id, run.workflow, principal.name)
    return serializers.run_detail(run)


def append(principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    """Append an event: how a service signals a run waiting for it, or starts workflows."""
    principal.require(tokens.APPEND)
    tenant = principal.tenant(body.get("tenant"))
    _check_fields(
        body,
        ("stream_id", log.check_stream_id),
        ("type", log.check_event_type),
        (
            "stream_type",
            lambda t: log.check_text(t or "", "stream_type", limits.STREAM_TYPE, empty=True),
        ),
        ("payload", lambda p: to_json(dict(p or {}), "payload")),
        ("metadata", lambda m: to_json(dict(m or {}), "metadata")),
    )
    if body.get("stream_type") in log.ENGINE_STREAM_TYPES:
        raise bad_request("stream_type", "is reserved for the workflow engine")
    if str(body["stream_id"]).startswith(log.RESERVED_STREAM_PREFIXES):
        raise bad_request("stream_id", "is reserved for the workflow engine")
    try:
        event = append_event(
            body["stream_id"],
            body["type"],
            body.get("payload"),
            stream_type=body.get("stream_type", ""),
            tenant=tenant,
            expected_version=body.get("expected_version"),
            metadata=body.get("metadata"),
            schema_version=body.get("schema_version", 1),
            created_by=principal.name[:150],
            priority=body.get("priority"),
        )
    except InvalidEvent as exc:
        # what the fields' own checks above cannot see: a stream id that is an
        # event type this project handles (swapped arguments)
        raise from_kumiflow(exc, field="stream_id" if "stream id" in str(exc) else None) from exc
    except KumiflowError as exc:
        raise from_kumiflow(exc) from exc
    return serializers.event_json(tuple(getattr(event, f) for f in serializers.EVENT_FIELDS))


def operate(
    principal: Principal, run_id: str, operation: str, body: dict[str, Any]
) -> dict[str, Any]:
    """Cancel, retry, wake, pause, resume or fail a run of the caller's tenants,
    through the public functions.

    The run is looked up in the caller's tenants first and the operation is
    then scoped to the run's tenant, so a run id of another tenant is a 404
    even for a caller with the permission.
    """
    perm = PERMISSIONS[operation]
    principal.require(perm)
    run = find_run(principal, run_id)
    by = operator(principal)
    try:
        __, reason = check_operator(by, body.get("reason", ""))
    except InvalidEvent as exc:
        raise from_kumiflow(exc, field="reason") from exc
    # the same calls as the admin's: who and why go on the run's event
    try:
        if operation == "cancel":
            updated = cancel_run(run.id, reason=reason, tenant=run.tenant_id, by=by)
        elif operation == "retry":
            updated = retry_run(
                run.id,
                adopt_current_definition=body.get("adopt_current_definition", False),
                tenant=run.tenant_id,
                by=by,
                reason=reason,
            )
        elif operation in SIMPLE:
            updated = SIMPLE[operation](run.id, tenant=run.tenant_id, by=by, reason=reason)
        else:
            updated = wake_run(run.id, tenant=run.tenant_id, by=by, reason=reason)
    except KumiflowError as exc:
        raise from_kumiflow(exc) from exc
    logger.info(
        "run %s: %s by %s (%s)", run.id, operation, principal.name, reason or "no reason given"
    )
    if principal.has_perm(tokens.VIEW):
        return serializers.run_detail(updated)
    return serializers.run_summary(updated)  # the permission to act is not one to read


def plan_restart(principal: Principal, run_id: str, query: dict[str, Any]) -> dict[str, Any]:
    """The pre-flight of a restart (``restart_plan``), changing nothing."""
    principal.require(tokens.VIEW)
    run = find_run(principal, run_id)
    try:
        plan = restart_plan(
            run.id,
            query.get("from_step") or "0",
            definition=query.get("definition") or "run",
            tenant=run.tenant_id,
        )
    except KumiflowError as exc:
        raise from_kumiflow(exc) from exc
    return plan.as_dict()


def restart(principal: Principal, run_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """Restart a run from a step (``restart_run``): the new run."""
    principal.require(tokens.RETRY)
    run = find_run(principal, run_id)
    by = operator(principal)
    try:
        __, reason = check_operator(by, body.get("reason", ""))
    except InvalidEvent as exc:
        raise from_kumiflow(exc, field="reason") from exc
    try:
        new = restart_run(
            run.id,
            from_step=body["from_step"],
            definition=body.get("definition", "run"),
            tenant=run.tenant_id,
            by=by,
            reason=reason,
        )
    except KumiflowError as exc:
        raise from_kumiflow(exc) from exc
    logger.info("run %s restarted as %s by %s", run.id, new.id, principal.name)
    if principal.has_perm(tokens.VIEW):
        return serializers.run_detail(new)
    return serializers.run_summary(new)


#: The permission of each run operation (a bulk action needs its own too).
PERMISSIONS = {
    "cancel": tokens.CANCEL,
    "retry": tokens.RETRY,
    "wake": tokens.WAKE,
    "pause": tokens.PAUSE,
    "resume": tokens.PAUSE,
    "fail": tokens.FAIL,
    "restart": tokens.RETRY,
}
#: The operations that take only the reason.
SIMPLE: dict[str, Callable[..., WorkflowRun]] = {
    "pause": pause_run,
    "resume": resume_run,
    "fail": fail_run,
}


def bulk(principal: Principal, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The pre-flight count of a bulk operation (``dry_run``), or the operation
    recorded for the worker (202), on the caller's tenants only."""
    action = body["action"]
    principal.require(PERMISSIONS[action])
    filters = dict(body.get("filters") or {})
    if "tenant" in filters:
        filters["tenant"] = principal.tenant(filters["tenant"], field="filters.tenant")
    filters["tenants"] = list(principal.tenants)
    try:
        by, reason = operator(principal), check_operator("", body.get("reason", ""))[1]
        step = {"from_step": body.get("from_step"), "definition": body.get("definition", "run")}
        if body.get("dry_run"):
            count = bulk_ops.preflight(action, filters, **step)
            return 200, {
                "id": None,
                "action": action,
                "status": "dry_run",
                "filters": filters,
                "matching": count,
            }
        operation = bulk_ops.bulk_runs(
            action,
            filters=filters,
            reason=reason,
            by=by,
            batch_size=body.get("batch_size", bulk_ops.DEFAULT_BATCH),
            run=False,
            **step,
        )
    except KumiflowError as exc:
        raise from_kumiflow(exc) from exc
    logger.info(
        "bulk %s %s of %d runs by %s", operation.id, action, operation.total, principal.name
    )
    return 202, serializers.bulk_operation(operation)


def get_bulk(principal: Principal, operation_id: str) -> dict[str, Any]:
    """A bulk operation of the caller's tenants (its filter names them)."""
    principal.require(tokens.VIEW)
    try:
        pk = uuid.UUID(operation_id)
    except ValueError:
        raise ApiError("not_found", "no such bulk operation") from None
    operation = bulk_ops.BulkOperation.objects.filter(pk=pk).first()
    if operation is None or not set(operation.filters.get("tenants") or ()) <= set(
        principal.tenants
    ):
        raise ApiError("not_found", "no such bulk operation")
    return serializers.bulk_operation(operation)


def operator(principal: Principal) -> str:
    """Who an operation's event names: the caller's name as the audit stores it
    (a name it cannot store is recorded as ``api``, and the call still runs)."""
    name = principal.name[: limits.OPERATOR]
    try:
        return check_operator(name, "")[0] or "api"
    except InvalidEvent:
        return "api"


def _check_fields(body: dict[str, Any], *checks: tuple[str, Callable[[Any], object]]) -> None:
    """Each field through the engine's own check of it, so that a refusal names
    its field (the engine refuses the same values, without saying which field)."""
    for name, check in checks:
        try:
            check(body.get(name))
        except InvalidEvent as exc:
            raise from_kumiflow(exc, field=name) from exc
