"""The API's views: one generic wrapper around :mod:`kumiflow_django.http.service`.

For every request the wrapper does the same, in this order: pick the
endpoint by method (405 otherwise), authenticate (401), check the
endpoint's permission (403, before the body is even read, so a caller
without it learns nothing and changes nothing), parse and validate the
body and the query against the endpoint's schemas (400 naming the field),
call the handler, render JSON. Errors are rendered in one shape.

The views are exempt from Django's CSRF middleware because a bearer token
is not a cookie; session requests get the CSRF check in
:func:`~kumiflow_django.http.auth.authenticate` instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from kumiflow_django.http import approvals, openapi, schema, service
from kumiflow_django.http.auth import Principal, authenticate
from kumiflow_django.http.errors import ApiError, bad_request
from kumiflow_django.http.openapi import Endpoint
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.http")


@dataclass
class Call:
    """One validated request, as a handler sees it."""

    request: HttpRequest
    principal: Principal
    body: dict[str, Any] = field(default_factory=dict)
    query: dict[str, Any] = field(default_factory=dict)
    path: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Call], tuple[int, dict[str, Any]]]

HANDLERS: dict[str, Handler] = {
    "listRuns": lambda c: (200, service.list_runs(c.principal, **c.query)),
    "startRun": lambda c: (201, service.start_run(c.principal, c.body)),
    "getRun": lambda c: (200, service.get_run(c.principal, c.path["run_id"])),
    "cancelRun": lambda c: (200, service.operate(c.principal, c.path["run_id"], "cancel", c.body)),
    "retryRun": lambda c: (200, service.operate(c.principal, c.path["run_id"], "retry", c.body)),
    "wakeRun": lambda c: (200, service.operate(c.principal, c.path["run_id"], "wake", c.body)),
    "appendEvent": lambda c: (201, service.append(c.principal, c.body)),
    "planRestart": lambda c: (200, service.plan_restart(c.principal, c.path["run_id"], c.query)),
    "restartRun": lambda c: (201, service.restart(c.principal, c.path["run_id"], c.body)),
    "listApprovals": lambda c: (200, approvals.list_approvals(c.principal, **c.query)),
    "decideApproval": lambda c: (200, approvals.decide(c.principal, c.path["run_id"], c.body)),
    "pauseRun": lambda c: (200, service.operate(c.principal, c.path["run_id"], "pause", c.body)),
    "resumeRun": lambda c: (200, service.operate(c.principal, c.path["run_id"], "resume", c.body)),
    "failRun": lambda c: (200, service.operate(c.principal, c.path["run_id"], "fail", c.body)),
    "bulkRuns": lambda c: service.bulk(c.principal, c.body),
    "getBulkOperation": lambda c: (
        200,
        service.get_bulk(c.principal, c.path["operation_id"]),
    ),
}


def read_body(request: HttpRequest, endpoint: Endpoint) -> dict[str, Any]:
    """The JSON object of the body, checked against the endpoint's schema; an empty
    body is an empty object."""
    request_schema = endpoint.request_schema
    if request_schema is None:
        return {}
    try:
        raw = request.body
    except RequestDataTooBig:
        raise bad_request(
            None, "the body is larger than the server takes (DATA_UPLOAD_MAX_MEMORY_SIZE)"
        ) from None
    if not raw.strip():
        data: Any = {}
    else:
        try:
            data = json.loads(raw, object_pairs_hook=_unique_keys)
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad_request(None, f"the body is not JSON: {exc}") from None
        except RecursionError:  # nested deeper than the parser goes
            raise bad_request(None, "the body is not JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise bad_request(None, "the body must be a JSON object")
    schema.validate(data, request_schema, "")
    return data


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique: with a key twice, parsers differ on
    which value counts (this one took the last), so such a body is refused."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {key!r} appears twice in an object")
            seen.add(key)
    return found


_INTEGER = re.compile(r"-?[0-9]{1,30}")


def read_query(request: HttpRequest, endpoint: Endpoint) -> dict[str, Any]:
    """The endpoint's query parameters that are present, converted and checked."""
    values: dict[str, Any] = {}
    for param in endpoint.params:
        if param.where != "query" or param.name not in request.GET:
            continue
        values[param.name] = convert(request.GET[param.name], param.schema, param.name)
    return values


def convert(raw: str, param_schema: dict[str, Any], name: str) -> Any:
    """A query or header value as its schema's type, validated."""
    value: Any = raw
    if param_schema.get("type") == "integer":
        # ASCII digits only: Python's int() also takes "1_0", "+2", " 3 " and
        # other scripts' digits, which a cache or a proxy would read otherwise
        if not _INTEGER.fullmatch(raw):
            raise bad_request(name, "must be an integer")
        value = int(raw)
    schema.validate(value, param_schema, name)
    return value


def json_response(status: int, data: dict[str, Any]) -> JsonResponse:
    return JsonResponse(data, status=status, json_dumps_params={"ensure_ascii": False})


def allowed(methods: dict[str, Endpoint]) -> str:
    """The ``Allow`` header: the path's methods, HEAD with GET, and OPTIONS."""
    names = [m.upper() for m in methods]
    if "GET" in names:
        names.insert(names.index("GET") + 1, "HEAD")
    return ", ".join([*names, "OPTIONS"])


def options(methods: dict[str, Endpoint]) -> HttpResponse:
    """``OPTIONS``: what the path allows; nothing else is said."""
    response = HttpResponse(status=204)
    response["Allow"] = allowed(methods)
    return response


def method_not_allowed(methods: dict[str, Endpoint]) -> HttpResponse:
    allow = allowed(methods)
    response = ApiError("method_not_allowed", f"use {allow}").response()
    response["Allow"] = allow
    return response


def api_view(methods: dict[str, Endpoint]) -> Callable[..., HttpResponse]:
    """The view serving ``methods`` (one path's endpoints)."""

    @csrf_exempt
    def view(request: HttpRequest, **path: str) -> HttpResponse:
        method = (request.method or "").lower()
        if method == "options":
            return options(methods)
        # HEAD is GET without its body (the server drops it: RFC 9110, 9.3.2)
        endpoint = methods.get("get" if method == "head" else method)
        if endpoint is None:
            return method_not_allowed(methods)
        try:
            if endpoint.operation_id == "getOpenApi":
                return json_response(200, openapi.document(request.path.rsplit("/", 1)[0]))
            principal = authenticate(request)
            assert endpoint.permission is not None
            principal.require(endpoint.permission)
            call = Call(
                request,
                principal,
                body=read_body(request, endpoint),
                query=read_query(request, endpoint),
                path=path,
            )
            status, data = HANDLERS[endpoint.operation_id](call)
        except ApiError as error:
            return error.response()
        return json_response(status, data)

    # its GET and HEAD may be served from a read replica (kumiflow_django.routers)
    view.replica_readable = True  # type: ignore[attr-defined]
    return view
