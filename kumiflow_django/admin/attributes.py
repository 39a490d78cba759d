"""The run list filtered by a search attribute: ``?attr=customer:C-17``.

The filter reads the attribute index (``RunAttribute``): one range of its
``(name, value, started_at)`` index, whatever the number of runs. A value
that is not ``name:value`` shows an empty list, not a server error.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse

from kumiflow_django.admin.base import InputFilter
from kumiflow_django.definition.attributes import as_text, parse_filter
from kumiflow_django.projections.attributes import matching


class AttributeFilter(InputFilter):
    """Runs whose search attribute has a value, typed as ``name:value``."""

    title = "search attribute (name:value)"
    parameter_name = "attr"
    field = ""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        # Only leading blanks go: a value may end with spaces (the run page's
        # links keep them), and no name begins with one.
        raw = (self.value() or "").lstrip()
        if not raw:
            return queryset
        try:
            name, value = parse_filter(raw)
        except ValueError:
            return queryset.none()
        return queryset.filter(id__in=matching(name, value))


def links(attributes: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(name, value, the run list filtered by it) of each of a run's attributes."""
    base = reverse("admin:kumiflow_workflowrun_changelist")
    out = []
    for name, value in sorted((attributes or {}).items()):
        text = as_text(value)
        out.append((name, text, f"{base}?{urlencode({'attr': f'{name}:{text}'})}"))
    return out
