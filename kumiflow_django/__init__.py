"""kumiflow-django: durable, event-sourced workflows for Django.

The public API is importable from this package. Names are loaded on first
use, so importing the package (for example from a ``workflows.py``) never
touches the model registry.

The package is cut into layers; each imports only the layers below it
(checked by import-linter in ``make lint``; docs/architecture.md)::

    admin | management            Django's fixed places: the console, the commands
    workers                       the loops: resume, dispatch, cron; the worker
    cron                          schedules that fire each occurrence once
    engine                        segments, the runner, start, resume, operations
    outbox                        delivery kinds, requests, delivery, actions
    projections                   the stream-write helper; runs, dispatches, schedules
    steps                         the step vocabulary, one module per kind
    definition                    workflows, triggers, the context, registries
    store                         the event log, its rules, errors and names

At the root only the app's conventional modules: ``apps``, ``conf``,
``checks``, ``signals``, ``models`` (where Django looks), ``tasks`` (where
a queued Django task's import path must not move) and ``testing``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kumiflow_django.store import errors as _errors

try:
    __version__ = version("kumiflow-django")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0+unknown"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "KumiflowDeprecationWarning": "kumiflow_django.store.errors",
    "ResolverContext": "kumiflow_django.definition.context",
    "wake_run": "kumiflow_django.engine.operations",
    "retry_run": "kumiflow_django.engine.operations",
    "cancel_run": "kumiflow_django.engine.operations",
    # restart from a step (a new run, linked to the old)
    "restart_run": "kumiflow_django.engine.restart",
    "restart_plan": "kumiflow_django.engine.restart",
    "RestartPlan": "kumiflow_django.engine.restart",
    "arestart_run": "kumiflow_django.engine.aio",
    # search attributes and approvals
    "find_runs": "kumiflow_django.projections.runs",
    "decide_approval": "kumiflow_django.engine.approvals",
    "waiting_approvals": "kumiflow_django.engine.approvals",
    "adecide_approval": "kumiflow_django.engine.aio",
    "InvalidApproval": "kumiflow_django.store.errors",
    "pause_run": "kumiflow_django.engine.operations",
    "resume_run": "kumiflow_django.engine.operations",
    "fail_run": "kumiflow_django.engine.operations",
    "pause_workflow": "kumiflow_django.engine.operations",
    "resume_workflow": "kumiflow_django.engine.operations",
    "pause_tenant": "kumiflow_django.engine.operations",
    "resume_tenant": "kumiflow_django.engine.operations",
    "bulk_runs": "kumiflow_django.engine.bulk",
    "continue_bulk": "kumiflow_django.engine.bulk",
    "InvalidDispatchState": "kumiflow_django.store.errors",
    "DispatchNotFound": "kumiflow_django.store.errors",
    "cancel_dispatch": "kumiflow_django.outbox.actions",
    "redeliver": "kumiflow_django.outbox.actions",
    # workflows
    "define_workflow": "kumiflow_django.definition.workflow",
    "on_event": "kumiflow_django.definition.triggers",
    "on_cron": "kumiflow_django.definition.triggers",
    "manual": "kumiflow_django.definition.triggers",
    "Workflow": "kumiflow_django.definition.workflow",
    "start_workflow": "kumiflow_django.engine.starting",
    "define_projection": "kumiflow_django.projections.user",
    "register_dispatch_kind": "kumiflow_django.outbox.kinds",
    "handler": "kumiflow_django.steps.call",
    "register_step_kind": "kumiflow_django.definition.step",
    "StepKind": "kumiflow_django.definition.step",
    # flow control
    "Limit": "kumiflow_django.definition.flow",
    "Rate": "kumiflow_django.definition.flow",
    "set_flow_limit": "kumiflow_django.flow.limits",
    # task steps
    "current_task": "kumiflow_django.tasks.context",
    "TaskContext": "kumiflow_django.tasks.context",
    "TaskFailed": "kumiflow_django.store.errors",
    "ChildFailed": "kumiflow_django.store.errors",
    "NotInATask": "kumiflow_django.store.errors",
    # async entry points (and reading a run)
    "astart_workflow": "kumiflow_django.engine.aio",
    "aappend_event": "kumiflow_django.engine.aio",
    "aget_run": "kumiflow_django.engine.aio",
    "acancel_run": "kumiflow_django.engine.aio",
    "aretry_run": "kumiflow_django.engine.aio",
    "awake_run": "kumiflow_django.engine.aio",
    "apause_run": "kumiflow_django.engine.aio",
    "aresume_run": "kumiflow_django.engine.aio",
    "afail_run": "kumiflow_django.engine.aio",
    "apause_workflow": "kumiflow_django.engine.aio",
    "aresume_workflow": "kumiflow_django.engine.aio",
    "apause_tenant": "kumiflow_django.engine.aio",
    "aresume_tenant": "kumiflow_django.engine.aio",
    "abulk_runs": "kumiflow_django.engine.aio",
    "get_run": "kumiflow_django.engine.aio",
    # event store
    "NewEvent": "kumiflow_django.store.log",
    "append_event": "kumiflow_django.store.log",
    "append_events": "kumiflow_django.store.log",
    "load_stream": "kumiflow_django.store.log",
    "stream_version": "kumiflow_django.store.log",
    "read_log": "kumiflow_django.store.log",
    "erase_stream": "kumiflow_django.store.log",
    "event_appended": "kumiflow_django.signals",
    # errors
    "KumiflowError": "kumiflow_django.store.errors",
    "InvalidEvent": "kumiflow_django.store.errors",
    "VersionConflict": "kumiflow_django.store.errors",
    "TenantMismatch": "kumiflow_django.store.errors",
    "ImmutableEvent": "kumiflow_django.store.errors",
    "WorkflowDefinitionError": "kumiflow_django.store.errors",
    "UnknownWorkflow": "kumiflow_django.store.errors",
    "RunNotFound": "kumiflow_django.store.errors",
    "InvalidRunState": "kumiflow_django.store.errors",
    "DeliveryFailure": "kumiflow_django.store.errors",
    "PermanentFailure": "kumiflow_django.store.errors",
    "StaleVersion": "kumiflow_django.store.errors",
    "OperationConflict": "kumiflow_django.store.errors",
    # reads on a replica (kumiflow_django.routers)
    "replica_reads": "kumiflow_django.store.replica",
    "InvalidPauseState": "kumiflow_django.store.errors",
}

__all__ = [
    "KumiflowDeprecationWarning",
    "replica_reads",
    "ResolverContext",
    "__version__",
    "wake_run",
    "retry_run",
    "cancel_run",
    "find_runs",
    "decide_approval",
    "waiting_approvals",
    "adecide_approval",
    "InvalidApproval",
    "pause_run",
    "resume_run",
    "fail_run",
    "pause_workflow",
    "resume_workflow",
    "pause_tenant",
    "resume_tenant",
    "bulk_runs",
    "continue_bulk",
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
    "Limit",
    "Rate",
    "set_flow_limit",
    "current_task",
    "TaskContext",
    "TaskFailed",
    "ChildFailed",
    "NotInATask",
    "astart_workflow",
    "aappend_event",
    "aget_run",
    "acancel_run",
    "aretry_run",
    "awake_run",
    "apause_run",
    "aresume_run",
    "afail_run",
    "apause_workflow",
    "aresume_workflow",
    "apause_tenant",
    "aresume_tenant",
    "abulk_runs",
    "get_run",
    "restart_run",
    "restart_plan",
    "RestartPlan",
    "arestart_run",
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
    "DeliveryFailure",
    "PermanentFailure",
    "StaleVersion",
    "OperationConflict",
    "InvalidPauseState",
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


# -- modules that moved in 0.2 (the layered package): old imports keep working ----

#: old module -> the module that holds what it held (deprecated; see CHANGELOG.md)
MOVED_MODULES: dict[str, str] = {
    "kumiflow_django.eventstore": "kumiflow_django.store.log",
    "kumiflow_django.exceptions": "kumiflow_django.store.errors",
    "kumiflow_django.run_events": "kumiflow_django.store.names",
    "kumiflow_django.jsonvalues": "kumiflow_django.store.values",
    "kumiflow_django.clock": "kumiflow_django.store.clock",
    "kumiflow_django.wakeups": "kumiflow_django.store.wakeups",
    "kumiflow_django.locking": "kumiflow_django.store.db",
    "kumiflow_django.durations": "kumiflow_django.definition.durations",
    "kumiflow_django.backoff": "kumiflow_django.definition.backoff",
    "kumiflow_django.matching": "kumiflow_django.definition.matching",
    "kumiflow_django.fingerprint": "kumiflow_django.definition.fingerprint",
    "kumiflow_django.registry": "kumiflow_django.definition.registry",
    "kumiflow_django.context": "kumiflow_django.definition.context",
    "kumiflow_django.starting": "kumiflow_django.engine.starting",
    "kumiflow_django.resuming": "kumiflow_django.engine.resuming",
    "kumiflow_django.operations": "kumiflow_django.engine.operations",
    "kumiflow_django.rebuild": "kumiflow_django.projections.rebuild",
    "kumiflow_django.mail_delivery": "kumiflow_django.outbox.mail",
    "kumiflow_django.webhook_delivery": "kumiflow_django.outbox.webhook",
    "kumiflow_django.delivery_errors": "kumiflow_django.store.errors",
    "kumiflow_django.loop": "kumiflow_django.workers.loop",
    "kumiflow_django.resume_loop": "kumiflow_django.workers.resume",
    "kumiflow_django.dispatch_loop": "kumiflow_django.workers.dispatch",
    "kumiflow_django.cron_loop": "kumiflow_django.workers.cron",
    "kumiflow_django.worker": "kumiflow_django.workers.worker",
    "kumiflow_django.picture": "kumiflow_django.admin.picture",
    "kumiflow_django.steps.base": "kumiflow_django.definition.step",
    "kumiflow_django.models.event": "kumiflow_django.store.models",
    "kumiflow_django.models.run": "kumiflow_django.projections.runs",
    "kumiflow_django.models.dispatch": "kumiflow_django.projections.dispatches",
    "kumiflow_django.models.cron": "kumiflow_django.projections.schedules",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module that replaced it, with a warning."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED_MODULES[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new} in kumiflow-django 0.2; import it from there",
            _errors.KumiflowDeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, already executed."""


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())


if TYPE_CHECKING:  # pragma: no cover
    from kumiflow_django.definition.context import ResolverContext
    from kumiflow_django.definition.step import StepKind, register_step_kind
    from kumiflow_django.definition.triggers import manual, on_cron, on_event
    from kumiflow_django.definition.workflow import Workflow, define_workflow
    from kumiflow_django.engine.aio import (
        aappend_event,
        abulk_runs,
        acancel_run,
        adecide_approval,
        afail_run,
        aget_run,
        apause_run,
        apause_tenant,
        apause_workflow,
        arestart_run,
        aresume_run,
        aresume_tenant,
        aresume_workflow,
        aretry_run,
        astart_workflow,
        awake_run,
        get_run,
    )
    from kumiflow_django.engine.approvals import decide_approval, waiting_approvals
    from kumiflow_django.engine.bulk import bulk_runs, continue_bulk
    from kumiflow_django.engine.operations import (
        cancel_run,
        fail_run,
        pause_run,
        pause_tenant,
        pause_workflow,
        resume_run,
        resume_tenant,
        resume_workflow,
        retry_run,
        wake_run,
    )
    from kumiflow_django.engine.restart import RestartPlan, restart_plan, restart_run
    from kumiflow_django.engine.starting import start_workflow
    from kumiflow_django.outbox.actions import cancel_dispatch, redeliver
    from kumiflow_django.outbox.kinds import register_dispatch_kind
    from kumiflow_django.projections.runs import find_runs
    from kumiflow_django.projections.user import define_projection
    from kumiflow_django.signals import event_appended
    from kumiflow_django.steps.call import handler
    from kumiflow_django.store.errors import (
        ChildFailed,
        DeliveryFailure,
        DispatchNotFound,
        ImmutableEvent,
        InvalidApproval,
        InvalidDispatchState,
        InvalidEvent,
        InvalidPauseState,
        InvalidRunState,
        KumiflowDeprecationWarning,
        KumiflowError,
        NotInATask,
        OperationConflict,
        PermanentFailure,
        RunNotFound,
        StaleVersion,
        TaskFailed,
        TenantMismatch,
        UnknownWorkflow,
        VersionConflict,
        WorkflowDefinitionError,
    )
    from kumiflow_django.store.log import (
        NewEvent,
        append_event,
        append_events,
        erase_stream,
        load_stream,
        read_log,
        stream_version,
    )
    from kumiflow_django.tasks.context import TaskContext, current_task
