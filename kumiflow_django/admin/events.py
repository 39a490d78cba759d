"""The event log, read-only: nothing here edits or deletes an event.

The list hides the engine's own events (``kumiflow.…``: a run's suspensions,
resumptions, deliveries) unless a stream is chosen or they are asked for:
what remains are the events your code appended. The type filter takes the
start of a type (``order.`` lists every order event).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from kumiflow_django.admin.base import UNFIT, InputFilter, ReadOnlyAdmin, field_value, pretty
from kumiflow_django.admin.display import when_short
from kumiflow_django.store.log import RESERVED_PREFIX
from kumiflow_django.store.models import Event


class StreamFilter(InputFilter):
    title = "stream id"
    parameter_name = "stream"
    field = "stream_id"


class TypeFilter(InputFilter):
    """Events whose type starts with the text given."""

    title = "event type (or its start)"
    parameter_name = "type"
    field = "type"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        raw = (self.value() or "").strip()
        if not raw:
            return queryset
        if field_value(queryset.model._meta.get_field(self.field), raw) is UNFIT:
            return queryset.none()
        return queryset.filter(type__startswith=raw)


class TenantFilter(InputFilter):
    title = "tenant"
    parameter_name = "tenant"
    field = "tenant_id"


class EngineFilter(admin.SimpleListFilter):
    """The engine's events: hidden unless a stream is chosen or searched for (a
    run's stream holds nothing else), shown, or shown alone."""

    title = "engine events"
    parameter_name = "engine"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("shown", "shown"), ("only", "only")]

    def choices(self, changelist: Any) -> Any:
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "hidden (unless a stream is chosen)",
        }
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        engine = Q(type__startswith=RESERVED_PREFIX)
        if self.value() == "only":
            return queryset.filter(engine)
        chosen = (
            request.GET.get(StreamFilter.parameter_name) or request.GET.get("q") or ""
        ).strip()
        if self.value() == "shown" or chosen:
            return queryset
        return queryset.exclude(engine)


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["position", "what", "stream", "created"]
    list_filter = [StreamFilter, TypeFilter, TenantFilter, EngineFilter]
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

    @admin.display(description="type", ordering="type")
    def what(self, event: Event) -> SafeString:
        by = format_html('<span class="kf-sub">by {}</span>', event.created_by)
        return format_html("{}{}", event.type, by if event.created_by else "")

    @admin.display(description="stream", ordering="stream_id")
    def stream(self, event: Event) -> SafeString:
        return format_html(
            '<span class="kf-key" title="{}">{}</span><span class="kf-sub">v{} · {}</span>',
            event.stream_id,
            event.stream_id,
            event.version,
            event.tenant_id,
        )

    @admin.display(description="created", ordering="position")
    def created(self, event: Event) -> SafeString | str:
        return when_short(event.created_at)

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
            condition |= Q(event_id=uuid.UUID(term))
        except ValueError:
            pass
        return queryset.filter(condition), False
