"""The run list filtered by a search attribute: ``?attr=customer:C-17``.

The filter reads the attribute index (``RunAttribute``): one range of its
``(name, value, top, started_at, run_id)`` index, whatever the number of
runs. The list hides child runs unless asked: the index rows say which runs
have no parent (``top``), so neither the page nor its count reads a run row
to find out, and a list filtered by the attribute alone is counted from the
index alone (:func:`count_rows`). A value that is not ``name:value`` shows
an empty list, not a server error.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse

from kumiflow_django.admin.base import InputFilter
from kumiflow_django.definition.attributes import as_text, parse_filter
from kumiflow_django.projections.attributes import RunAttribute, matching

PARAMETER = "attr"


def children_shown(request: HttpRequest) -> bool:
    """Whether the run list shows child runs: asked for ("children=yes"), or a
    parent filter or a search (a run looked for is found, child or not)."""
    return request.GET.get("children") == "yes" or any(
        request.GET.get(name, "").strip() for name in ("parent", "q")
    )


def wanted(request: HttpRequest) -> tuple[str, Any] | None:
    """The ``(name, value)`` the list is filtered by (None: no filter, or one
    that is not ``name:value``). Only leading blanks go: a value may end with
    spaces (the run page's links keep them), and no name begins with one."""
    raw = (request.GET.get(PARAMETER) or "").lstrip()
    if not raw:
        return None
    try:
        return parse_filter(raw)
    except ValueError:
        return None


def rows(request: HttpRequest) -> QuerySet[RunAttribute, Any] | None:
    """The index rows of the runs the filter keeps (None: no valid filter)."""
    found = wanted(request)
    if found is None:
        return None
    return matching(*found, top_only=not children_shown(request))


def count_rows(
    request: HttpRequest, params: dict[str, Any], searched: bool
) -> QuerySet[RunAttribute, Any] | None:
    """The index rows whose count is the list's count, when the attribute is
    the list's only filter (``params``, the list's filter parameters; no
    search): one row per run, so the capped count reads the index alone."""
    if searched or set(params) - {PARAMETER}:
        return None
    return rows(request)


class AttributeFilter(InputFilter):
    """Runs whose search attribute has a value, typed as ``name:value``."""

    title = "search attribute (name:value)"
    parameter_name = PARAMETER
    field = ""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not (self.value() or "").lstrip():
            return queryset
        found = rows(request)
        if found is None:
            return queryset.none()
        return queryset.filter(id__in=found)


def links(attributes: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(name, value, the run list filtered by it) of each of a run's attributes."""
    base = reverse("admin:kumiflow_workflowrun_changelist")
    out = []
    for name, value in sorted((attributes or {}).items()):
        text = as_text(value)
        out.append((name, text, f"{base}?{urlencode({'attr': f'{name}:{text}'})}"))
    return out
