"""An async view of the testproject: it starts a run through the async entry points."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from kumiflow_django.engine.aio import aget_run, astart_workflow


async def astart(request: HttpRequest) -> JsonResponse:
    """Start a run of ``?workflow=`` and answer its status once its first segment has run."""
    run = await astart_workflow(
        request.GET.get("workflow", "http-approval"),
        payload={"order": request.GET.get("order", "o-1")},
    )
    again = await aget_run(run.id, tenant=run.tenant_id)
    return JsonResponse({"id": str(run.id), "status": again.status, "cursor": again.cursor})
