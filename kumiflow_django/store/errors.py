"""Exceptions of kumiflow-django's public API: every one lives here.

Import them from ``kumiflow_django``; each is also named in its ``__all__``.
They moved here from ``steps.task`` (``TaskFailed``), ``steps.child``
(``ChildFailed``), ``steps.model`` (``StaleVersion``), ``tasks.context``
(``NotInATask``) and ``outbox.errors``
(``DeliveryFailure``, ``PermanentFailure``) in 0.2; the old paths still
resolve, with a DeprecationWarning.
"""

from __future__ import annotations

from typing import Any

from kumiflow_django.store import names as ev


class KumiflowError(Exception):
    """Base class of every error raised on purpose by kumiflow-django."""


class Refusal(str):
    """Why an operation does not apply (as a ``refuse_*`` function says it), with
    the error the operation raises for it when it is not the usual one."""

    error: type[KumiflowError] | None

    def __new__(cls, text: str, error: type[KumiflowError] | None = None) -> Refusal:
        refusal = super().__new__(cls, text)
        refusal.error = error
        return refusal


def raise_refusal(refusal: str | None, error: type[KumiflowError], subject: str = "") -> None:
    """An operation's refusal, if any, raised: as ``error`` (or the refusal's own),
    its message after the subject (``run <id>``)."""
    if refusal is None:
        return
    if isinstance(refusal, Refusal) and refusal.error is not None:
        error = refusal.error
    raise error(f"{subject}: {refusal}" if subject else str(refusal))


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
    """Never raised any more: a stream is its tenant's, and the same stream id
    in another tenant is another stream. Kept so that code catching it imports."""

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


class InvalidApproval(KumiflowError, ValueError):
    """A decision the approval does not declare: a choice, a field, a type."""


class InvalidPauseState(KumiflowError):
    """A workflow or tenant pause does not apply (paused already, not paused)."""


class DispatchNotFound(KumiflowError, LookupError):
    """No dispatch with that id exists."""


class InvalidDispatchState(KumiflowError):
    """The operation does not apply to a dispatch in its current state."""


class TaskFailed(KumiflowError):
    """A task step's task failed for good (every attempt its policy allows)."""

    #: The ``reason`` of the run's ``run-failed`` event.
    run_failure_reason = ev.TASK_FAILED_REASON


class ChildFailed(KumiflowError):
    """A child run that its parent waited for failed or was cancelled."""

    #: The ``reason`` of the parent's ``run-failed`` event.
    run_failure_reason = ev.CHILD_FAILED_REASON


class NotInATask(KumiflowError):
    """``current_task()`` was called outside a task step's function."""


class StaleVersion(Exception):
    """A model step's row is not at the expected version: someone else changed it."""


class DeliveryFailure(Exception):
    """A failed attempt of a delivery that may succeed later (5xx, 429, network
    trouble): the dispatch loop tries again. Raised by a dispatch kind's ``deliver``."""

    retryable = True

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        retry_after: float | None = None,
        response: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after
        #: What the server answered, when the step awaits it (a webhook's response).
        self.response = response


class PermanentFailure(DeliveryFailure):
    """A failed attempt that will fail again the same way (4xx, a bad URL)."""

    retryable = False


class KumiflowDeprecationWarning(DeprecationWarning):
    """An old spelling of kumiflow-django's API that still works until 1.0.

    A category of its own, so that a project whose tests turn warnings into
    errors can let these through while it moves to the new spelling
    (``filterwarnings = ["error", "default::kumiflow_django.KumiflowDeprecationWarning"]``).
    """


class OperationConflict(KumiflowError):
    """The operation kept losing to concurrent transactions (a deadlock, a
    serialization failure): nothing was changed, and trying again may succeed."""
