"""Pieces every kumiflow admin page shares: read-only, fast lists, filters."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import ngettext

from kumiflow_django.conf import settings

COLOURS = {
    "queued": "#a16207",
    "pending": "#6b7280",
    "running": "#2563eb",
    "waiting": "#0891b2",
    "waiting_event": "#7c3aed",
    "retry_scheduled": "#d97706",
    "completed": "#16a34a",
    "delivered": "#16a34a",
    "failed": "#dc2626",
    "dead": "#dc2626",
    "cancelled": "#4b5563",
    "paused": "#b45309",
}


def badge(status: str, label: str) -> SafeString:
    return format_html(
        '<span class="kf-badge" style="background:{};color:#fff;padding:1px 7px;'
        'border-radius:9px;font-size:11px;white-space:nowrap">{}</span>',
        COLOURS.get(status, "#6b7280"),
        label,
    )


def pretty(value: Any) -> SafeString:
    """JSON as an escaped, capped ``<pre>`` block."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    cap = settings.ADMIN_PAYLOAD_CHARS
    if len(text) > cap:
        text = text[:cap] + f"\n… ({len(text) - cap} more characters)"
    return format_html('<pre class="kf-json">{}</pre>', text)


class CappedPaginator(Paginator):
    """Counts at most CAP rows: a full COUNT(*) over a million runs is slow."""

    CAP = 10_000

    @cached_property
    def count(self) -> int:
        rows: Any = getattr(self.object_list, "count_rows", None)
        if rows is None:
            rows = self.object_list
        # Without the list's ordering: how many of CAP + 1 rows exist does not
        # depend on their order, and an ordered LIMIT makes the planner walk
        # the ordering's index, probing each row against the filters (a run
        # list filtered by a common search attribute: 3x slower).
        if getattr(rows, "order_by", None) is not None:
            rows = rows.order_by()
        return int(rows[: self.CAP + 1].count())


#: What ``field_value`` answers for a value the field cannot hold.
UNFIT = object()


def field_value(field: Any, raw: str) -> Any:
    """``raw`` as a value of ``field``, converted and validated by the field
    itself (a UUID, an integer in the column's range, a string that fits), or
    ``UNFIT``: no row can hold it, so a filter on it matches nothing, and a
    query with it could fail (PostgreSQL refuses a NUL character: a 500)."""
    if "\x00" in raw:
        return UNFIT
    try:
        return field.clean(raw, None)
    except ValidationError:
        return UNFIT


class CheckedChangeList(ChangeList):
    """Django's change list, showing no rows for a filter value with a NUL
    character: Django's own field filters pass it to the query. (Its search
    box refuses one itself.)"""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        queryset = super().get_queryset(request, exclude_parameters)
        params = self.get_filters_params()
        if any("\x00" in value for values in params.values() for value in values):
            return queryset.none()
        return queryset


class ReadOnlyAdmin(admin.ModelAdmin):
    paginator = CappedPaginator
    show_full_result_count = False
    list_per_page = 50
    #: The operator actions of one object, by their URL name (see ``admin.confirm``).
    operations: ClassVar[dict[str, Any]] = {}

    class Media:
        css = {"all": ["kumiflow/console.css"]}
        js = ["kumiflow/console.js"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """A page that only shows reads outside a transaction, as Django 6.1
        does for GET (older versions may open one on the primary for every
        method), so that it may read a replica (``kumiflow_django.routers``)."""
        if request.method in ("GET", "HEAD"):
            show = self._changeform_view  # type: ignore[attr-defined]
            return show(request, object_id, form_url, extra_context)  # type: ignore[no-any-return]
        return super().changeform_view(request, object_id, form_url, extra_context)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return CheckedChangeList

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        """The object, or None (Django's "does not exist") for an id the key
        cannot hold, before any query is made with it."""
        opts = self.model._meta
        field = opts.pk if from_field is None else opts.get_field(from_field)
        if field_value(field, object_id) is UNFIT:
            return None
        return super().get_object(request, object_id, from_field)

    def object_or_404(self, request: HttpRequest, object_id: str) -> Any:
        obj = self.get_object(request, unquote(object_id))  # None for a malformed id too
        if obj is None:
            raise Http404("no such object")
        return obj

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.concrete_fields] + list(self.readonly_fields)

    def user_can(self, request: HttpRequest, codename: str) -> bool:
        return bool(request.user.has_perm(f"{self.model._meta.app_label}.{codename}"))

    def report(
        self,
        request: HttpRequest,
        verb: str,
        done: int,
        skipped: list[str],
    ) -> None:
        """One message for what an action did, one listing what it skipped and why."""
        noun = self.model._meta
        if done:
            self.message_user(
                request,
                ngettext("%(n)d %(name)s %(verb)s.", "%(n)d %(names)s %(verb)s.", done)
                % {
                    "n": done,
                    "name": noun.verbose_name,
                    "names": noun.verbose_name_plural,
                    "verb": verb,
                },
                messages.SUCCESS,
            )
        if skipped:
            self.message_user(
                request,
                f"Skipped {len(skipped)}: " + "; ".join(skipped[:20]),
                messages.WARNING,
            )


def apply_each(
    queryset: QuerySet[Any], operation: Callable[[Any], Any], errors: tuple[type[Exception], ...]
) -> tuple[int, list[str]]:
    done, skipped = 0, []
    for obj in queryset:
        try:
            operation(obj)
        except errors as exc:
            skipped.append(f"{obj.pk}: {exc}")
        else:
            done += 1
    return done, skipped


class FieldFilter(admin.SimpleListFilter):
    """A filter on one model field: a value the field cannot hold (not a UUID,
    too long, a NUL character) shows an empty list, not a server error."""

    field: str = ""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        raw = (self.value() or "").strip()
        if not raw:
            return queryset
        value = field_value(queryset.model._meta.get_field(self.field), raw)
        if value is UNFIT:
            return queryset.none()
        return queryset.filter(**{self.field: value})


class InputFilter(FieldFilter):
    """A filter with a text box: its choices would need a query over the whole table."""

    template = "kumiflow/input_filter.html"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, str]]:
        return [("", "")]  # the filter must have a choice to be shown

    def choices(self, changelist: Any) -> Iterator[Any]:
        query = {
            k: v for k, v in changelist.get_filters_params().items() if k != self.parameter_name
        }
        yield {
            "parameter_name": self.parameter_name,
            "value": self.value() or "",
            "others": query,
            "clear_url": changelist.get_query_string(remove=[self.parameter_name]),
        }


def model_link(obj: Model, text: str) -> SafeString:
    url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, text)
