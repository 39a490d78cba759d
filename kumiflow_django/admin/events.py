"""The event log, read-only: nothing here edits or deletes an event."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString

from kumiflow_django.admin.base import InputFilter, ReadOnlyAdmin, pretty
from kumiflow_django.store.models import Event


class StreamFilter(InputFilter):
    title = "stream id"
    parameter_name = "stream"
    field = "stream_id"


class TypeFilter(InputFilter):
    title = "event type"
    parameter_name = "type"
    field = "type"


class TenantFilter(InputFilter):
    title = "tenant"
    parameter_name = "tenant"
    field = "tenant_id"


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["position", "type", "stream_id", "version", "tenant_id", "created_at"]
    list_filter = [StreamFilter, TypeFilter, TenantFilter]
    search_fields = ["stream_id"]
    search_help_text = "A stream id, an event id or a position."
    ordering = ["-position"]
    show_facets = admin.ShowFacets.NEVER
    fields = [
        "position",
        "event_id",
        "type",
        "schema_version",
        "tenant_id",
        "stream_type",
        "stream_id",
        "version",
        "payload_pretty",
        "metadata_pretty",
        "created_at",
        "created_by",
    ]
    readonly_fields = ["payload_pretty", "metadata_pretty"]

    @admin.display(description="payload")
    def payload_pretty(self, event: Event) -> SafeString:
        return pretty(event.payload)

    @admin.display(description="metadata")
    def metadata_pretty(self, event: Event) -> SafeString:
        return pretty(event.metadata)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(stream_id=term)
        if term.isdigit():
            condition |= Q(position=int(term))
        try:
            import uuid

            condition |= Q(event_id=uuid.UUID(term))
        except ValueError:
            pass
        return queryset.filter(condition), False
