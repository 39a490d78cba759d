"""Async entry points: the public operations, awaitable from async views and tasks.

Each twin is made from its sync function by :func:`async_twin`, so it takes
exactly the same parameters (its signature is the function's: a twin
cannot drift from it). It runs the sync function through
``sync_to_async(thread_sensitive=True)``: the engine's transactions,
savepoints and on-commit hooks need one connection on one thread, as in
sync code, and Django's async views run thread-sensitive code on the
request's own thread. So a run started here behaves exactly as one started
from a sync view (its first segment has run when ``astart_workflow``
returns), and no ``SynchronousOnlyOperation`` is raised.
"""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from asgiref.sync import sync_to_async

from kumiflow_django.engine.approvals import decide_approval
from kumiflow_django.engine.bulk import bulk_runs
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
from kumiflow_django.engine.restart import restart_run
from kumiflow_django.engine.starting import start_workflow
from kumiflow_django.projections.runs import WorkflowRun
from kumiflow_django.store.deprecation import keyword_only
from kumiflow_django.store.errors import RunNotFound
from kumiflow_django.store.log import append_event


@keyword_only("tenant")
def get_run(run_id: uuid.UUID | str, *, tenant: str | None = None) -> WorkflowRun:
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


def async_twin[**P, R](func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """``a<name>``: ``func``, awaitable, with ``func``'s signature and docs."""
    call = sync_to_async(func, thread_sensitive=True)

    @functools.wraps(func)
    async def twin(*args: P.args, **kwargs: P.kwargs) -> R:
        return await call(*args, **kwargs)

    twin.__name__ = f"a{func.__name__}"
    twin.__qualname__ = twin.__name__
    twin.__module__ = __name__
    twin.__doc__ = f":func:`kumiflow_django.{func.__name__}`, awaitable.\n\n{func.__doc__ or ''}"
    twin.__signature__ = inspect.signature(func)  # type: ignore[attr-defined]
    return twin


astart_workflow = async_twin(start_workflow)
aappend_event = async_twin(append_event)
aget_run = async_twin(get_run)
acancel_run = async_twin(cancel_run)
adecide_approval = async_twin(decide_approval)
aretry_run = async_twin(retry_run)
awake_run = async_twin(wake_run)
arestart_run = async_twin(restart_run)
apause_run = async_twin(pause_run)
aresume_run = async_twin(resume_run)
afail_run = async_twin(fail_run)
apause_workflow = async_twin(pause_workflow)
aresume_workflow = async_twin(resume_workflow)
apause_tenant = async_twin(pause_tenant)
aresume_tenant = async_twin(resume_tenant)
abulk_runs = async_twin(bulk_runs)


__all__ = [
    "aappend_event",
    "abulk_runs",
    "afail_run",
    "apause_run",
    "apause_tenant",
    "apause_workflow",
    "aresume_run",
    "aresume_tenant",
    "aresume_workflow",
    "acancel_run",
    "adecide_approval",
    "aget_run",
    "arestart_run",
    "aretry_run",
    "astart_workflow",
    "async_twin",
    "awake_run",
    "get_run",
]
