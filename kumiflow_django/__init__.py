"""kumiflow-django: durable, event-sourced workflows for Django.

The public API is importable from this package. Names are loaded on first
use, so importing the package (for example from a ``workflows.py``) never
touches the model registry.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("kumiflow-django")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0+unknown"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "wake_run": "kumiflow_django.operations",
    "retry_run": "kumiflow_django.operations",
    "cancel_run": "kumiflow_django.operations",
    "InvalidDispatchState": "kumiflow_django.exceptions",
    "DispatchNotFound": "kumiflow_django.exceptions",
    "cancel_dispatch": "kumiflow_django.outbox",
    "redeliver": "kumiflow_django.outbox",
    # workflows
    "define_workflow": "kumiflow_django.definition",
    "on_event": "kumiflow_django.definition",
    "on_cron": "kumiflow_django.definition",
    "manual": "kumiflow_django.definition",
    "Workflow": "kumiflow_django.definition",
    "start_workflow": "kumiflow_django.starting",
    "define_projection": "kumiflow_django.projections",
    "register_dispatch_kind": "kumiflow_django.outbox",
    "handler": "kumiflow_django.steps.call",
    "register_step_kind": "kumiflow_django.steps.base",
    "StepKind": "kumiflow_django.steps.base",
    # event store
    "NewEvent": "kumiflow_django.eventstore",
    "append_event": "kumiflow_django.eventstore",
    "append_events": "kumiflow_django.eventstore",
    "load_stream": "kumiflow_django.eventstore",
    "stream_version": "kumiflow_django.eventstore",
    "read_log": "kumiflow_django.eventstore",
    "erase_stream": "kumiflow_django.eventstore",
    "event_appended": "kumiflow_django.signals",
    # errors
    "KumiflowError": "kumiflow_django.exceptions",
    "InvalidEvent": "kumiflow_django.exceptions",
    "VersionConflict": "kumiflow_django.exceptions",
    "TenantMismatch": "kumiflow_django.exceptions",
    "ImmutableEvent": "kumiflow_django.exceptions",
    "WorkflowDefinitionError": "kumiflow_django.exceptions",
    "UnknownWorkflow": "kumiflow_django.exceptions",
    "RunNotFound": "kumiflow_django.exceptions",
    "InvalidRunState": "kumiflow_django.exceptions",
}

__all__ = [
    "__version__",
    "wake_run",
    "retry_run",
    "cancel_run",
    "InvalidDispatchState",
    "DispatchNotFound",
    "cancel_dispatch",
    "redeliver",
    "define_workflow",
    "on_event",
    "on_cron",
    "manual",
    "Workflow",
    "start_workflow",
    "define_projection",
    "register_dispatch_kind",
    "handler",
    "register_step_kind",
    "StepKind",
    "NewEvent",
    "append_event",
    "append_events",
    "load_stream",
    "stream_version",
    "read_log",
    "erase_stream",
    "event_appended",
    "KumiflowError",
    "InvalidEvent",
    "VersionConflict",
    "TenantMismatch",
    "ImmutableEvent",
    "WorkflowDefinitionError",
    "UnknownWorkflow",
    "RunNotFound",
    "InvalidRunState",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kumiflow_django' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from kumiflow_django.definition import (
        Workflow,
        define_workflow,
        manual,
        on_cron,
        on_event,
    )
    from kumiflow_django.eventstore import (
        NewEvent,
        append_event,
        append_events,
        erase_stream,
        load_stream,
        read_log,
        stream_version,
    )
    from kumiflow_django.exceptions import (
        DispatchNotFound,
        ImmutableEvent,
        InvalidDispatchState,
        InvalidEvent,
        InvalidRunState,
        KumiflowError,
        RunNotFound,
        TenantMismatch,
        UnknownWorkflow,
        VersionConflict,
        WorkflowDefinitionError,
    )
    from kumiflow_django.operations import cancel_run, retry_run, wake_run
    from kumiflow_django.outbox import cancel_dispatch, redeliver, register_dispatch_kind
    from kumiflow_django.projections import define_projection
    from kumiflow_django.signals import event_appended
    from kumiflow_django.starting import start_workflow
    from kumiflow_django.steps.base import StepKind, register_step_kind
    from kumiflow_django.steps.call import handler
