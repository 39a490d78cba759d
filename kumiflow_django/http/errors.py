"""The API's one error shape, and how kumiflow's exceptions map onto HTTP statuses.

Every error answers ``{"error": {"code": ..., "message": ..., "field": ...}}``:
``field`` names the part of the request that is wrong (a body field, a
query parameter, a header) or is null when no single part is to blame.
"""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse

from kumiflow_django import (
    InvalidEvent,
    InvalidRunState,
    KumiflowError,
    OperationConflict,
    RunNotFound,
    TenantMismatch,
    UnknownWorkflow,
    VersionConflict,
)

#: code -> HTTP status. The codes are part of the API (see docs/http-api.md).
STATUSES = {
    "bad_request": 400,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
}


class ApiError(Exception):
    """An answer other than success; raised anywhere below a view, rendered once."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        assert code in STATUSES, code
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field

    @property
    def status(self) -> int:
        return STATUSES[self.code]

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}

    def response(self) -> JsonResponse:
        response = JsonResponse(self.body(), status=self.status)
        if self.code == "unauthenticated":
            response["WWW-Authenticate"] = 'Bearer realm="kumiflow"'
        return response


def bad_request(field: str | None, message: str) -> ApiError:
    return ApiError("bad_request", message, field)


def from_kumiflow(exc: KumiflowError, *, field: str | None = None) -> ApiError:
    """The API error of one of kumiflow's own exceptions.

    ``field`` is the request field the caller knows the error to be about
    (an unknown workflow is about ``workflow``). An unknown workflow is a
    400, not a 404: the URL exists, the body names something that does not.
    ``TenantMismatch`` is no longer raised (a stream is its tenant's); its
    conflict stays for code that still raises it.
    """
    if isinstance(exc, RunNotFound):
        return ApiError("not_found", "no such run", None)
    if isinstance(exc, UnknownWorkflow):
        return ApiError("bad_request", str(exc), field or "workflow")
    if isinstance(exc, InvalidEvent):
        return ApiError("bad_request", str(exc), field)
    if isinstance(exc, VersionConflict):
        return ApiError("conflict", str(exc), "expected_version")
    if isinstance(exc, TenantMismatch):
        return ApiError("conflict", f"stream {exc.stream_id!r} belongs to another tenant", field)
    if isinstance(exc, InvalidRunState | OperationConflict):
        return ApiError("conflict", str(exc), None)
    return ApiError("bad_request", str(exc), field)
