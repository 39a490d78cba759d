"""The async entry points behave as the sync functions they wrap.

That they are safe in an async view under a real ASGI server (no
SynchronousOnlyOperation) is shown in test_live.py.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from kumiflow_django import InvalidRunState, RunNotFound, define_workflow
from kumiflow_django import steps as s
from kumiflow_django.engine.aio import (
    aappend_event,
    acancel_run,
    aget_run,
    aretry_run,
    astart_workflow,
    awake_run,
)
from kumiflow_django.models import RunStatus

pytestmark = pytest.mark.django_db


def test_a_run_started_awaited_signalled_and_read_from_async_code(approval):
    async def scenario():
        run = await astart_workflow("approval", payload={"order": "o-1"}, tenant="acme")
        waiting = (await aget_run(run.id, tenant="acme")).status
        await aappend_event("o-1", "order.approved", {"order": "o-1", "by": "ann"}, tenant="acme")
        await aappend_event("o-1", "order.shipped", {"order": "o-1"}, tenant="acme")
        return waiting, await aget_run(str(run.id))

    waiting, done = async_to_sync(scenario)()
    assert waiting == RunStatus.WAITING_EVENT
    assert (done.status, done.result) == (RunStatus.COMPLETED, {"order": "o-1", "by": "ann"})


def test_aget_run_raises_run_not_found_like_the_operations(approval):
    run = async_to_sync(astart_workflow)("approval", payload={"order": "o-1"})
    for run_id, tenant in ((run.id, "acme"), ("not-a-uuid", None), ("0" * 32, None)):
        with pytest.raises(RunNotFound):
            async_to_sync(aget_run)(run_id, tenant=tenant)


def test_the_operations_are_awaitable(registry):
    define_workflow("sleepy", steps=[s.wait("P1D"), s.compute("x", lambda ctx: 1 / 0)])

    async def scenario():
        run = await astart_workflow("sleepy")
        woken = await awake_run(run.id)
        return run, woken

    run, woken = async_to_sync(scenario)()
    assert woken.wake_at is not None
    with pytest.raises(InvalidRunState, match="only failed runs"):
        async_to_sync(aretry_run)(run.id)
    cancelled = async_to_sync(acancel_run)(run.id, reason="enough")
    assert (cancelled.status, cancelled.last_error) == (RunStatus.CANCELLED, "enough")
