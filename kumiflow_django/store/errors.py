"""Exceptions raised by kumiflow-django's public API."""

from __future__ import annotations


class KumiflowError(Exception):
    """Base class of every error raised on purpose by kumiflow-django."""


class InvalidEvent(KumiflowError, ValueError):
    """An event to append is malformed; nothing was written."""


class VersionConflict(KumiflowError):
    """The stream is not at the expected version: another writer got there first."""

    def __init__(self, stream_id: str, expected_version: int, actual_version: int | None) -> None:
        self.stream_id = stream_id
        self.expected_version = expected_version
        self.actual_version = actual_version
        actual = "unknown" if actual_version is None else str(actual_version)
        super().__init__(
            f"stream {stream_id!r} is at version {actual}, not at the expected "
            f"version {expected_version}"
        )


class TenantMismatch(KumiflowError):
    """The stream belongs to another tenant."""

    def __init__(self, stream_id: str, tenant: str) -> None:
        self.stream_id = stream_id
        self.tenant = tenant
        super().__init__(f"stream {stream_id!r} belongs to another tenant than {tenant!r}")


class ImmutableEvent(KumiflowError):
    """Events are append-only: they are never updated, and deleted only by erasure."""


class WorkflowDefinitionError(KumiflowError, ValueError):
    """A workflow definition is invalid; raised when it is built (at import time)."""


class UnknownWorkflow(KumiflowError, LookupError):
    """No workflow of that name is registered."""


class RunNotFound(KumiflowError, LookupError):
    """No run with that id exists in that tenant."""


class InvalidRunState(KumiflowError):
    """The operation does not apply to a run in its current state."""


class DispatchNotFound(KumiflowError, LookupError):
    """No dispatch with that id exists."""


class InvalidDispatchState(KumiflowError):
    """The operation does not apply to a dispatch in its current state."""


class OperationConflict(KumiflowError):
    """The operation kept losing to concurrent transactions (a deadlock, a
    serialization failure): nothing was changed, and trying again may succeed."""
