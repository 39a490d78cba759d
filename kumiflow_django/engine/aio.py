"""Async entry points: the public operations, awaitable from async views and tasks.

Each runs the sync function through ``sync_to_async(thread_sensitive=True)``:
the engine's transactions, savepoints and on-commit hooks need one
connection on one thread, as in sync code, and Django's async views run
thread-sensitive code on the request's own thread. So a run started here
behaves exactly as one started from a sync view (its first segment has run
when ``astart_workflow`` returns), and no ``SynchronousOnlyOperation`` is raised.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from asgiref.sync import sync_to_async

from kumiflow_django.engine.operations import cancel_run, retry_run, wake_run
from kumiflow_django.engine.starting import start_workflow
from kumiflow_django.projections.runs import WorkflowRun
from kumiflow_django.store.errors import RunNotFound
from kumiflow_django.store.log import append_event
from kumiflow_django.store.models import Event


def get_run(run_id: uuid.UUID | str, tenant: str | None = None) -> WorkflowRun:
    """The run with this id (in ``tenant``, if given); :class:`RunNotFound` otherwise,
    also for a malformed id."""
    try:
        pk = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    except ValueError:
        raise RunNotFound(f"{run_id!r} is not a run id") from None
    qs = WorkflowRun.objects.filter(pk=pk)
    if tenant is not None:
        qs = qs.filter(tenant_id=tenant)
    run = qs.first()
    if run is None:
        raise RunNotFound(f"no run {run_id}" + (f" in tenant {tenant!r}" if tenant else ""))
    return run


async def astart_workflow(
    name: str,
    *,
    payload: dict[str, Any] | None = None,
    tenant: str | None = None,
    idempotency_key: str | None = None,
    version: str | None = None,
    priority: int | None = None,
) -> WorkflowRun:
    """:func:`kumiflow_django.start_workflow`, awaitable."""
    return await sync_to_async(start_workflow, thread_sensitive=True)(
        name,
        payload=payload,
        tenant=tenant,
        idempotency_key=idempotency_key,
        version=version,
        priority=priority,
    )


async def aappend_event(
    stream_id: str | int | uuid.UUID,
    type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    stream_type: str = "",
    tenant: str | None = None,
    expected_version: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    schema_version: int = 1,
    created_by: str = "",
    priority: int | None = None,
) -> Event:
    """:func:`kumiflow_django.append_event`, awaitable."""
    return await sync_to_async(append_event, thread_sensitive=True)(
        stream_id,
        type,
        payload,
        stream_type=stream_type,
        tenant=tenant,
        expected_version=expected_version,
        metadata=metadata,
        schema_version=schema_version,
        created_by=created_by,
        priority=priority,
    )


async def aget_run(run_id: uuid.UUID | str, tenant: str | None = None) -> WorkflowRun:
    """The run with this id (in ``tenant``, if given); :class:`RunNotFound` otherwise."""
    return await sync_to_async(get_run, thread_sensitive=True)(run_id, tenant)


async def acancel_run(
    run_id: uuid.UUID | str, *, reason: str = "", tenant: str | None = None
) -> WorkflowRun:
    """:func:`kumiflow_django.cancel_run`, awaitable."""
    return await sync_to_async(cancel_run, thread_sensitive=True)(
        run_id, reason=reason, tenant=tenant
    )


async def aretry_run(
    run_id: uuid.UUID | str, *, adopt_current_definition: bool = False, tenant: str | None = None
) -> WorkflowRun:
    """:func:`kumiflow_django.retry_run`, awaitable."""
    return await sync_to_async(retry_run, thread_sensitive=True)(
        run_id, adopt_current_definition=adopt_current_definition, tenant=tenant
    )


async def awake_run(run_id: uuid.UUID | str, *, tenant: str | None = None) -> WorkflowRun:
    """:func:`kumiflow_django.wake_run`, awaitable."""
    return await sync_to_async(wake_run, thread_sensitive=True)(run_id, tenant=tenant)


__all__ = [
    "aappend_event",
    "acancel_run",
    "aget_run",
    "aretry_run",
    "astart_workflow",
    "awake_run",
    "get_run",
]
