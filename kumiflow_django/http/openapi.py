"""The API's endpoints, declared once: the URLs, the checks and the OpenAPI 3.1 document.

Each :class:`Endpoint` says where it is, what permission it needs, what
body and query it takes and what it answers. :mod:`kumiflow_django.http.urls`
mounts the endpoints from this table, :mod:`kumiflow_django.http.views`
enforces the permission and the schemas from it, and :func:`document`
describes it, so the description cannot drift from what is served.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kumiflow_django import __version__
from kumiflow_django.http import schema, tokens


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "query", "path" or "header"
    schema: dict[str, Any]
    description: str
    required: bool = False


RUN_ID = Param(
    "run_id",
    "path",
    {"type": "string", "format": "uuid"},
    "The run's id. A malformed id, or one of another tenant, is a 404.",
    required=True,
)


@dataclass(frozen=True)
class Endpoint:
    operation_id: str
    method: str
    path: str  # relative to where the API is mounted, OpenAPI style: /runs/{run_id}/
    name: str  # the URL name (namespace "kumiflow_api"); one per path
    summary: str
    description: str
    permission: str | None  # None: served to anybody (the OpenAPI document only)
    status: int
    response: str | None  # a component of schema.COMPONENTS; None for the specials
    request: str | None = None
    params: tuple[Param, ...] = ()
    errors: tuple[int, ...] = (401, 403)
    media_type: str = "application/json"
    tags: tuple[str, ...] = field(default=("runs",))
    #: Other success statuses with the same body, and what each means.
    also: tuple[tuple[int, str], ...] = ()

    @property
    def request_schema(self) -> dict[str, Any] | None:
        return None if self.request is None else schema.COMPONENTS[self.request]


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "listRuns",
        "get",
        "/runs/",
        "runs",
        "List runs",
        "Runs of the caller's tenants, newest first, a page at a time. Follow "
        "`next_cursor` for older runs; a page never repeats or skips a run because "
        "runs were started meanwhile.",
        tokens.VIEW,
        200,
        "RunPage",
        params=(
            Param("workflow", "query", {"type": "string", "maxLength": 200}, "Only this workflow."),
            Param("status", "query", {"type": "string", "enum": schema.STATUSES}, "Only this."),
            Param(
                "tenant",
                "query",
                {"type": "string", "maxLength": 64},
                "Only this tenant (one the caller may see; others are a 403).",
            ),
            Param(
                "attribute",
                "query",
                {"type": "string", "minLength": 3, "maxLength": 265},
                "Only runs with this search attribute, as `name:value` "
                "(`customer:C-17`; booleans are `true`/`false`).",
            ),
            Param("cursor", "query", {"type": "string"}, "The `next_cursor` of the last page."),
            Param(
                "limit",
                "query",
                {"type": "integer", "minimum": 1},
                "Runs per page: KUMIFLOW_API_PAGE_SIZE by default, "
                "KUMIFLOW_API_MAX_PAGE_SIZE at most.",
            ),
        ),
        errors=(400, 401, 403),
    ),
    Endpoint(
        "startRun",
        "post",
        "/runs/",
        "runs",
        "Start a run",
        "Starts a run of a registered workflow. Its first segment runs before the "
        "answer unless the workflow is deferred. A start with the `idempotency_key` "
        "of an earlier one answers that run and starts nothing.",
        tokens.START,
        201,
        "Run",
        request="StartRun",
        errors=(400, 401, 403),
    ),
    Endpoint(
        "getRun",
        "get",
        "/runs/{run_id}/",
        "run",
        "Get a run",
        "A run's status, position, step results, trail, result and error.",
        tokens.VIEW,
        200,
        "Run",
        params=(RUN_ID,),
        errors=(401, 403, 404),
    ),
    Endpoint(
        "cancelRun",
        "post",
        "/runs/{run_id}/cancel/",
        "run-cancel",
        "Cancel a run",
        "Stops a run that has not finished; its outbox requests not delivered yet "
        "are cancelled with it. A finished run is a 409.",
        tokens.CANCEL,
        200,
        "OperatedRun",
        request="CancelRun",
        params=(RUN_ID,),
        errors=(400, 401, 403, 404, 409),
    ),
    Endpoint(
        "retryRun",
        "post",
        "/runs/{run_id}/retry/",
        "run-retry",
        "Retry a failed run",
        "Runs a failed run's failed segment again, from where it began. A run that "
        "has not failed is a 409.",
        tokens.RETRY,
        200,
        "OperatedRun",
        request="RetryRun",
        params=(RUN_ID,),
        errors=(400, 401, 403, 404, 409),
    ),
    # -- restart from a step (a new run, linked to the old) --
    Endpoint(
        "planRestart",
        "get",
        "/runs/{run_id}/restart/",
        "run-restart",
        "The pre-flight of a restart",
        "What restarting the run from `from_step` would do, changing nothing: the "
        "steps it can restart from, the steps that run again, each side effect that "
        "happens again (mails, webhooks, tasks, child runs) and under which "
        "idempotency key, the results carried; `refusal` says why it does not apply.",
        tokens.VIEW,
        200,
        "RestartPlan",
        params=(
            RUN_ID,
            Param(
                "from_step",
                "query",
                {"type": "string", "maxLength": 200},
                "The step's path (`2`, `2.then.0`); default `0`, its first step.",
            ),
            Param(
                "definition",
                "query",
                {"type": "string", "enum": ["run", "current"]},
                "On the run's own definition (default) or the workflow's current one.",
            ),
        ),
        errors=(400, 401, 403, 404),
    ),
    Endpoint(
        "pauseRun",
        "post",
        "/runs/{run_id}/pause/",
        "run-pause",
        "Pause a run",
        "No worker takes the run until it is resumed; its status stays. Events it "
        "waits for are still recorded and its timers still come due: it takes them "
        "when resumed. A finished or paused run is a 409.",
        tokens.PAUSE,
        200,
        "OperatedRun",
        request="PauseRun",
        params=(RUN_ID,),
        errors=(400, 401, 403, 404, 409),
    ),
    Endpoint(
        "resumeRun",
        "post",
        "/runs/{run_id}/resume/",
        "run-resume",
        "Resume a paused run",
        "Workers take the run again. A run paused because its retries ran out "
        '(`on_exhausted="pause"`) continues at the failed step with its whole retry '
        "policy. A run that is not paused is a 409.",
        tokens.PAUSE,
        200,
        "OperatedRun",
        request="PauseRun",
        params=(RUN_ID,),
        errors=(400, 401, 403, 404, 409),
    ),
    Endpoint(
        "failRun",
        "post",
        "/runs/{run_id}/fail/",
        "run-fail",
        "Fail a run",
        "Ends a run that has not finished as failed (reason `failed_by_operator`, the "
        "reason as its error), compensating first where it has completed compensable "
        "steps. A finished run is a 409.",
        tokens.FAIL,
        200,
        "OperatedRun",
        request="PauseRun",
        params=(RUN_ID,),
        errors=(400, 401, 403, 404, 409),
    ),
    Endpoint(
        "bulkRuns",
        "post",
        "/bulk/",
        "bulk",
        "Act on every run that matches a filter",
        "Cancels, retries, resumes, pauses or fails every run of the caller's tenants "
        "that the list endpoint's `filters` match. With `dry_run` it answers the "
        "matching count (200) and changes nothing; else it records a bulk operation "
        "(202) that the worker works through in batches, each run through the same "
        "operation as one run's endpoint (its event names the caller and the reason); "
        "runs the action does not apply to are skipped and counted with the reason. "
        "Follow it with `getBulkOperation`. Needs the action's own permission too.",
        tokens.VIEW,
        202,
        "BulkOperation",
        request="BulkRuns",
        errors=(400, 401, 403),
        also=((200, "A dry run: the matching count, nothing changed."),),
    ),
    Endpoint(
        "getBulkOperation",
        "get",
        "/bulk/{operation_id}/",
        "bulk-operation",
        "Follow a bulk operation",
        "Its progress: runs done, skipped (with the reasons) and errors so far.",
        tokens.VIEW,
        200,
        "BulkOperation",
        params=(
            Param(
                "operation_id",
                "path",
                {"type": "string", "format": "uuid"},
                "The operation's id (a malformed one, or one of another caller, is a 404).",
                required=True,
            ),
        ),
        errors=(401, 403, 404),
    ),
    Endpoint(
        "restartRun",
        "post",
        "/runs/{run_id}/restart/",
        "run-restart",
        "Restart a run from a step",
        "Starts a new run from a step of a failed, cancelled or completed run, with "
        "the results its steps before it had; the old run keeps its end and gets a "
        "`run-restarted` event naming the new run. Answers the new run. A run or a "
        "step it does not apply to is a 409 (see the pre-flight, GET).",
        tokens.RETRY,
        201,
        "OperatedRun",
        request="RestartRun",
        params=(RUN_ID,),
        errors=(400, 401, 403, 404, 409),
    ),
    Endpoint(
        "wakeRun",
        "post",
        "/runs/{run_id}/wake/",
        "run-wake",
        "Wake a waiting run",
        "Makes a waiting run due now: a timer ends early, a wait for an event times "
        "out now, a scheduled retry runs now. A run that is not waiting is a 409.",
        tokens.WAKE,
        200,
        "OperatedRun",
        request="WakeRun",
        params=(RUN_ID,),
        errors=(400, 401, 403, 404, 409),
    ),
    Endpoint(
        "listApprovals",
        "get",
        "/approvals/",
        "approvals",
        "List runs waiting for a person",
        "Runs of the caller's tenants that wait at an approval step, the longest "
        "waiting first (at most 200), with the approval's choices and fields.",
        tokens.VIEW,
        200,
        "ApprovalPage",
        params=(
            Param("workflow", "query", {"type": "string", "maxLength": 200}, "Only this workflow."),
        ),
        errors=(400, 401, 403),
        tags=("approvals",),
    ),
    Endpoint(
        "decideApproval",
        "post",
        "/runs/{run_id}/approve/",
        "run-approve",
        "Decide the approval a run waits at",
        "Appends the decision (the caller as its author) through decide_approval: the "
        "run continues with it. A choice or field the approval does not declare is a "
        "400; a run that does not wait at an approval is a 409. An approval declared "
        "with its own `permission=` is decided by a user who has it (a token cannot).",
        tokens.DECIDE,
        200,
        "OperatedRun",
        request="DecideApproval",
        params=(RUN_ID,),
        errors=(400, 401, 403, 404, 409),
        tags=("approvals",),
    ),
    Endpoint(
        "streamRunEvents",
        "get",
        "/runs/{run_id}/events/",
        "run-events",
        "Follow a run live (server-sent events)",
        "The run's events as they are appended, as server-sent events: `id:` the "
        "event's version in the run's stream, `event:` its type, `data:` the event "
        "as JSON (the Event schema). Resumes after `Last-Event-ID`. When the run has "
        "finished, a last message `event: end` with `data: "
        '{"status": ..., "stream_version": ...}` is sent and the stream closes; a '
        "reconnect after that is answered 204 (which stops an EventSource). "
        "Comments (`: keep-alive`) are sent every KUMIFLOW_SSE_HEARTBEAT seconds. "
        "The token is checked again at every heartbeat and before new events are "
        "sent: once it is revoked, expired or without the view permission, a last "
        "message `event: error` with `data:` the Error schema ends the stream.",
        tokens.VIEW,
        200,
        None,
        params=(
            RUN_ID,
            Param(
                "Last-Event-ID",
                "header",
                {"type": "integer", "minimum": 0},
                "Send only the events after this version (EventSource sends it on reconnect).",
            ),
            Param(
                "last_event_id",
                "query",
                {"type": "integer", "minimum": 0},
                "The same, for clients that cannot set headers; the header wins.",
            ),
        ),
        errors=(400, 401, 403, 404),
        media_type="text/event-stream",
    ),
    Endpoint(
        "appendEvent",
        "post",
        "/events/",
        "events",
        "Append an event",
        "Appends an event to a stream of the caller's tenant: how a service signals "
        "a run waiting for it (the run resumes), or starts the workflows it triggers. "
        "A stale `expected_version` is a 409.",
        tokens.APPEND,
        201,
        "Event",
        request="AppendEvent",
        errors=(400, 401, 403, 409),
        tags=("events",),
    ),
    Endpoint(
        "getOpenApi",
        "get",
        "/openapi.json",
        "openapi",
        "This document",
        "The OpenAPI 3.1 description of this API.",
        None,
        200,
        None,
        errors=(),
        tags=("meta",),
    ),
)

_ERROR_TEXT = {
    400: "The request is malformed; `error.field` names the part.",
    401: "No credentials, or a token that is unknown, revoked or expired.",
    403: "The caller lacks the permission (or the tenant, or the CSRF token); nothing changed.",
    404: "No such run in the caller's tenants.",
    409: "The run's state, or the stream's version, does not allow it; nothing changed.",
}


def by_path() -> dict[str, dict[str, Endpoint]]:
    """path -> method -> endpoint, in declaration order."""
    paths: dict[str, dict[str, Endpoint]] = {}
    for endpoint in ENDPOINTS:
        paths.setdefault(endpoint.path, {})[endpoint.method] = endpoint
    return paths


def _operation(endpoint: Endpoint) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": endpoint.operation_id,
        "summary": endpoint.summary,
        "description": endpoint.description,
        "tags": list(endpoint.tags),
    }
    if endpoint.permission is None:
        op["security"] = []
    else:
        op["description"] += f"\n\nNeeds the permission `{endpoint.permission}`."
    if endpoint.params:
        op["parameters"] = [
            {
                "name": p.name,
                "in": p.where,
                "required": p.required,
                "description": p.description,
                "schema": p.schema,
            }
            for p in endpoint.params
        ]
    if endpoint.request is not None:
        op["requestBody"] = {
            "required": endpoint.request in ("StartRun", "AppendEvent"),
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{endpoint.request}"}}
            },
        }
    if endpoint.response is not None:
        body: dict[str, Any] = {"$ref": f"#/components/schemas/{endpoint.response}"}
    elif endpoint.media_type == "text/event-stream":
        body = {"type": "string", "description": "A stream of server-sent events."}
    else:
        body = {"type": "object"}
    responses: dict[str, Any] = {
        str(endpoint.status): {
            "description": endpoint.summary,
            "content": {endpoint.media_type: {"schema": body}},
        }
    }
    for status, description in endpoint.also:
        responses[str(status)] = {
            "description": description,
            "content": {endpoint.media_type: {"schema": body}},
        }
    if endpoint.media_type == "text/event-stream":
        responses["204"] = {"description": "The run had finished and nothing is left to send."}
    for status in endpoint.errors:
        responses[str(status)] = {
            "description": _ERROR_TEXT[status],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    op["responses"] = responses
    return op


def document(server_url: str = "/") -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API mounted at ``server_url``."""
    from django.conf import settings as django_settings

    paths = {
        path: {method: _operation(endpoint) for method, endpoint in methods.items()}
        for path, methods in by_path().items()
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "kumiflow-django",
            "version": __version__,
            "description": "Start, inspect, follow and operate workflow runs; append events.",
        },
        "servers": [{"url": server_url.rstrip("/") or "/"}],
        "paths": paths,
        "components": {
            "schemas": schema.COMPONENTS,
            "securitySchemes": {
                "token": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API token (manage.py kumiflow_token create).",
                },
                "session": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": django_settings.SESSION_COOKIE_NAME,
                    "description": "A signed-in Django user; unsafe requests need the "
                    "CSRF token in the X-CSRFToken header.",
                },
            },
        },
        "security": [{"token": []}, {"session": []}],
        "tags": [
            {"name": "runs", "description": "Workflow runs."},
            {"name": "events", "description": "The event log."},
            {"name": "meta", "description": "About the API."},
        ],
    }
