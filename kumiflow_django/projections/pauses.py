"""Paused scopes: a workflow or a tenant an operator paused, one row per scope,
a projection of its stream (``pause:workflow:<name>``, ``pause:tenant:<id>``).

The claim of due runs (:meth:`WorkflowRunQuerySet.due`) leaves out the runs
of a paused scope, and a run is held (:func:`held`) when it or its scope is
paused: no segment of it runs until it is resumed. The row stays after a
resume (``paused=False``): its stream goes on, and the log says who paused
and resumed it, when and why.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from kumiflow_django.projections.stream import Change, Stream, write_one
from kumiflow_django.store import clock, limits, sql
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl
from kumiflow_django.store.models import EngineManager, Event

if TYPE_CHECKING:
    from django.db.models import QuerySet


class ScopeKind(models.TextChoices):
    WORKFLOW = "workflow", _("workflow")
    TENANT = "tenant", _("tenant")


class PausedScope(models.Model):
    #: The scope's stream id: ``pause:<kind>:<name>``.
    id = models.CharField(_("scope"), max_length=200, primary_key=True)
    kind = models.CharField(_("kind"), max_length=10, choices=ScopeKind.choices)
    name = models.CharField(_("name"), max_length=limits.WORKFLOW_NAME)
    paused = models.BooleanField(_("paused"), default=True)
    reason = models.CharField(_("reason"), max_length=limits.OPERATOR_REASON, blank=True)
    by = models.CharField(_("by"), max_length=limits.OPERATOR, blank=True)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)
    version = models.PositiveIntegerField(_("stream version"))
    updated_at = models.DateTimeField(_("updated at"))

    objects: ClassVar[models.Manager[PausedScope]] = EngineManager()

    class Meta:
        verbose_name = _("paused scope")
        verbose_name_plural = _("paused scopes")
        permissions = [("pause_pausedscope", "Can pause and resume workflows and tenants")]
        indexes = [
            models.Index(fields=["kind", "paused", "name"], name="kumiflow_pause_kind_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({'paused' if self.paused else 'resumed'})"


def stream_id(kind: str, name: str) -> str:
    return f"{ev.PAUSE_STREAM_PREFIX}{kind}:{name}"


# -- the fold ---------------------------------------------------------------


def _paused(scope: PausedScope, event: Event) -> None:
    p: pl.ScopePaused = event.payload
    scope.paused = True
    scope.reason = p.get("reason", "")
    scope.by = p.get("by", "")
    scope.paused_at = event.created_at


def _resumed(scope: PausedScope, event: Event) -> None:
    scope.paused = False


FOLD: dict[str, Callable[[PausedScope, Event], None]] = {
    ev.SCOPE_PAUSED: _paused,
    ev.SCOPE_RESUMED: _resumed,
}


def apply(scope: PausedScope | None, event: Event) -> PausedScope:
    """The scope row after ``event``."""
    if scope is None:
        if event.type != ev.SCOPE_PAUSED:
            raise ValueError(f"event {event.type} precedes scope-paused")
        p: pl.ScopePaused = event.payload
        scope = PausedScope(id=event.stream_id, kind=p["kind"], name=p["name"])
    scope.version = event.version
    scope.updated_at = event.created_at
    handler = FOLD.get(event.type)
    if handler is not None:
        handler(scope, event)
    return scope


#: The pause streams.
PAUSES = Stream(ev.PAUSE_STREAM, PausedScope, apply)


def append(
    scope: PausedScope | None,
    kind: str,
    name: str,
    tenant: str,
    type_: str,
    payload: pl.Payload,
    *,
    created_by: str = "",
) -> PausedScope:
    """Append one event to a scope's stream (``scope`` None: a new one), fold it
    and write it, in the caller's transaction."""
    change = Change(PAUSES, stream_id(kind, name), tenant, scope, now=clock.now())
    change.add(type_, payload, created_by=created_by)
    return write_one(change)


# -- who is held ------------------------------------------------------------


def paused_names(kind: str) -> QuerySet[PausedScope, str]:
    """The names of the paused scopes of ``kind``, as a subquery."""
    return PausedScope.objects.filter(kind=kind, paused=True).values_list("name", flat=True)


@functools.cache
def _holding_sql(using: str) -> str:
    """The first paused scope that holds runs of a workflow in a tenant,
    built once (``store.sql``): the check runs under every woken run's lock,
    and the ORM's compiler costs more than the database there."""
    meta = PausedScope._meta

    def c(name: str) -> str:
        return sql.column(meta.get_field(name), using, table=True)  # type: ignore[arg-type]

    kind, name = c("kind"), c("name")
    # Table and column names come from the model, quoted; values are parameters.
    return (
        f"SELECT {kind} FROM {sql.table(PausedScope, using)} WHERE ({c('paused')} = %s AND "  # noqa: S608
        f"(({kind} = %s AND {name} = %s) OR ({kind} = %s AND {name} = %s))) "
        f"ORDER BY {c('id')} ASC LIMIT 1"
    )


def scope_paused(workflow: str, tenant: str) -> str | None:
    """The kind of the paused scope that holds runs of ``workflow`` in
    ``tenant`` ("workflow" or "tenant"), or None. One indexed read (the
    kind, name index), by the scope's key: the workflow's scope first when
    both are paused."""
    using = PausedScope._default_manager.get_queryset().db
    paused = sql.prep(PausedScope._meta.get_field("paused"), True, using)
    params = [paused, ScopeKind.WORKFLOW.value, workflow, ScopeKind.TENANT.value, tenant]
    kind_field = PausedScope._meta.get_field("kind")
    rows = sql.fetch(_holding_sql(using), params, (kind_field,), using=using)
    return str(rows[0][0]) if rows else None


#: How long a process trusts its last read of the paused scopes for a start
#: (:func:`start_paused`): an inline start obeys a pause committed by another
#: process within this many seconds. The claim and the resume never rely on it.
START_CACHE_SECONDS = 1.0
_cache: tuple[float, frozenset[tuple[str, str]]] | None = None
_cache_lock = threading.Lock()


def start_paused(workflow: str, tenant: str) -> str | None:
    """:func:`scope_paused` for a start, from a read of every paused scope at
    most :data:`START_CACHE_SECONDS` old (a start costs no query of its own:
    there are few paused scopes, and most of the time none)."""
    global _cache
    now = time.monotonic()
    with _cache_lock:
        cached = _cache
    if cached is None or now - cached[0] > START_CACHE_SECONDS:
        rows = PausedScope.objects.filter(paused=True).values_list("kind", "name")
        cached = (now, frozenset(rows))
        with _cache_lock:
            _cache = cached
    scopes = cached[1]
    if (ScopeKind.WORKFLOW, workflow) in scopes:
        return ScopeKind.WORKFLOW
    if (ScopeKind.TENANT, tenant) in scopes:
        return ScopeKind.TENANT
    return None


def forget_scopes() -> None:
    """Read the paused scopes again at the next start (a pause or resume in
    this process: before and after its commit)."""
    global _cache
    with _cache_lock:
        _cache = None
