"""The benchmark's URLs: the testproject's, and the floor W14 measures the HTTP API against.

The floor views are the framework's cost of a JSON answer on the same
server: Django's request and middleware, a view, ``JsonResponse``; one of
them also reads one row through the ORM. They are here, not in the
testproject, because they are no part of any project's API.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path

from kumiflow_django.models import WorkflowRun
from testproject.urls import urlpatterns as project_urlpatterns


def floor(request: HttpRequest) -> JsonResponse:
    """A plain Django JSON view: no database."""
    return JsonResponse({"ok": True, "path": request.path})


def floor_db(request: HttpRequest, run_id: str) -> JsonResponse:
    """A plain Django JSON view reading one row by its key through the ORM."""
    row = WorkflowRun.objects.filter(pk=run_id).values("id", "status", "workflow").first()
    return JsonResponse({"run": None if row is None else {**row, "id": str(row["id"])}})


urlpatterns = [
    *project_urlpatterns,
    path("bench/floor/", floor),
    path("bench/floor-db/<uuid:run_id>/", floor_db),
]
