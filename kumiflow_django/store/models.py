"""The event log: the one append-only table every other table is built from.

Also the manager every kumiflow-django model uses, so that each of them
lives in ``KUMIFLOW_DATABASE``.
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import Collection, Iterable, Iterator
from typing import Any, ClassVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils.translation import gettext_lazy as _

from kumiflow_django.store import limits, replica
from kumiflow_django.store.db import alias
from kumiflow_django.store.errors import ImmutableEvent


class EngineManager[M: models.Model](models.Manager[M]):
    """Reads and writes go to ``KUMIFLOW_DATABASE`` unless told ``using()``; in
    a replica-readable request (``store/replica.py``) the router decides, so
    that reads may go to the replica and writes still to the primary."""

    def get_queryset(self) -> models.QuerySet[M, M]:
        # What Manager.get_queryset() does, with the database chosen here (no clone).
        hints = self._hints  # type: ignore[attr-defined]
        using = self._db or (None if replica.routed() else alias())
        return self._queryset_class(  # type: ignore[attr-defined,no-any-return]
            model=self.model, using=using, hints=hints
        )


# Set only by the event store while it inserts, and by the erasure permit.
_write_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "kumiflow_event_write_allowed", default=False
)


@contextlib.contextmanager
def allow_writes() -> Iterator[None]:
    """Let this thread's ORM write events (the store's inserts, the erasure permit)."""
    token = _write_allowed.set(True)
    try:
        yield
    finally:
        _write_allowed.reset(token)


def _refuse(what: str) -> ImmutableEvent:
    return ImmutableEvent(
        f"the event log is append-only: {what} is refused. Append with "
        "kumiflow_django.append_event(); erase a stream with kumiflow_django.erase_stream()."
    )


class EventQuerySet(models.QuerySet["Event", "Event"]):
    def update(self, **kwargs: Any) -> int:
        raise _refuse("QuerySet.update()")

    def bulk_update(self, *args: Any, **kwargs: Any) -> int:
        raise _refuse("QuerySet.bulk_update()")

    def delete(self) -> tuple[int, dict[str, int]]:
        if not _write_allowed.get():
            raise _refuse("QuerySet.delete()")
        return super().delete()

    def bulk_create(  # type: ignore[override]
        self,
        objs: Iterable[Event],
        batch_size: int | None = None,
        ignore_conflicts: bool = False,
        update_conflicts: bool = False,
        update_fields: Collection[str] | None = None,
        unique_fields: Collection[str] | None = None,
    ) -> list[Event]:
        if not _write_allowed.get() or ignore_conflicts or update_conflicts:
            raise _refuse("QuerySet.bulk_create()")
        # django-stubs cannot bind the covariant model type inside an override.
        return super().bulk_create(objs, batch_size=batch_size)  # type: ignore[arg-type,return-value]

    def for_stream(self, stream_id: str, tenant: str) -> EventQuerySet:
        return self.filter(stream_id=stream_id, tenant_id=tenant).order_by("version")

    def of_streams(self, streams: Iterable[tuple[str, str]]) -> EventQuerySet:
        """The events of these streams, each a ``(tenant, stream id)``: a stream id
        names a stream only with its tenant (one ``IN`` list per tenant)."""
        by_tenant: dict[str, list[str]] = {}
        for tenant, stream_id in streams:
            by_tenant.setdefault(tenant, []).append(stream_id)
        if not by_tenant:
            return self.none()
        condition = models.Q()
        for tenant, ids in by_tenant.items():
            condition |= models.Q(tenant_id=tenant, stream_id__in=ids)
        return self.filter(condition)

    def last_position(self) -> int:
        """The highest position of these events (0 if none): of the whole
        log, where what happens next begins (a run's ``since``, a bulk
        operation's ``log_position``), by the log's order, not by a clock."""
        return int(self.aggregate(m=models.Max("position"))["m"] or 0)


class Event(models.Model):
    """One event: a fact that happened, in a stream, at a version."""

    position = models.BigAutoField(_("position"), primary_key=True)
    event_id = models.UUIDField(_("event id"), default=uuid.uuid4, unique=True, editable=False)
    tenant_id = models.CharField(_("tenant"), max_length=limits.TENANT)
    stream_type = models.CharField(_("stream type"), max_length=limits.STREAM_TYPE, blank=True)
    stream_id = models.CharField(_("stream id"), max_length=limits.STREAM_ID)
    version = models.PositiveIntegerField(_("version"))
    type = models.CharField(_("type"), max_length=limits.EVENT_TYPE)
    schema_version = models.PositiveSmallIntegerField(_("schema version"), default=1)
    payload = models.JSONField(_("payload"), default=dict, encoder=DjangoJSONEncoder)
    metadata = models.JSONField(_("metadata"), default=dict, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(_("created at"))
    created_by = models.CharField(
        _("created by"), max_length=limits.CREATED_BY, blank=True, default=""
    )

    objects: ClassVar[EventQuerySet] = EngineManager.from_queryset(EventQuerySet)()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("event")
        verbose_name_plural = _("events")
        ordering = ["position"]
        constraints = [
            # One version per stream, and a stream is (tenant, stream id): the
            # same id in two tenants is two streams. The version guard of every
            # append, and the index of every read of one stream.
            models.UniqueConstraint(
                fields=["tenant_id", "stream_id", "version"],
                name="kumiflow_event_tenant_stream_version_uq",
            ),
            models.CheckConstraint(
                condition=models.Q(version__gte=1), name="kumiflow_event_version_gte_1"
            ),
        ]
        indexes = [
            # Reads the log of one tenant from a position, optionally by type
            # (awaited-event look-back, projections).
            models.Index(fields=["tenant_id", "type", "position"], name="kumiflow_event_type_idx"),
            models.Index(fields=["tenant_id", "position"], name="kumiflow_event_tenant_idx"),
        ]

    def __str__(self) -> str:
        return f"#{self.position} {self.type} ({self.stream_id} v{self.version})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not (self._state.adding and _write_allowed.get()):
            raise _refuse("saving an event")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise _refuse("deleting an event")
