"""The rows flow control keeps: one per key, one per rate window, operator limits.

Operational state, not projections of the log: a ``FlowKey`` is the row
every admission for its key locks (the mutex that makes "at most N" exact
across workers), a ``RateBucket`` counts one window's admissions, and a
``FlowLimit`` is an operator's override of a declared limit or rate,
changed through :func:`kumiflow_django.set_flow_limit`.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from kumiflow_django.store import limits
from kumiflow_django.store.models import EngineManager


class FlowKey(models.Model):
    """A key of a limited scope. Admissions lock it; ``held`` counts the runs or
    attempts parked until a slot frees (an upper bound: the waker resets it
    when it finds fewer)."""

    #: What the key limits: runs or task attempts (a scope may limit both,
    #: each counted on its own), or a debounce's burst.
    kind = models.CharField(_("kind"), max_length=10, default="run")
    scope = models.CharField(_("scope"), max_length=limits.FLOW_SCOPE)
    key = models.CharField(_("key"), max_length=limits.FLOW_KEY)
    held = models.PositiveIntegerField(_("parked"), default=0)
    created_at = models.DateTimeField(_("created at"))

    objects: ClassVar[models.Manager[FlowKey]] = EngineManager()

    class Meta:
        verbose_name = _("flow key")
        verbose_name_plural = _("flow keys")
        constraints = [
            models.UniqueConstraint(fields=["kind", "scope", "key"], name="kumiflow_flowkey_uq"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.scope} / {self.key}"


class RateBucket(models.Model):
    """Admissions of one key in its current window (a fixed window aligned to
    the epoch); a throttle keeps its last start here, and the events it skipped."""

    scope = models.CharField(_("scope"), max_length=limits.FLOW_SCOPE)
    key = models.CharField(_("key"), max_length=limits.FLOW_KEY)
    window_start = models.DateTimeField(_("window start"))
    count = models.PositiveIntegerField(_("admitted in the window"), default=0)
    #: A throttle: how many events it skipped, and the positions of the last ones.
    skipped = models.PositiveIntegerField(_("skipped"), default=0)
    skipped_positions = models.JSONField(_("last skipped events"), default=list)

    objects: ClassVar[models.Manager[RateBucket]] = EngineManager()

    class Meta:
        verbose_name = _("rate bucket")
        verbose_name_plural = _("rate buckets")
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="kumiflow_ratebucket_uq"),
        ]

    def __str__(self) -> str:
        return f"{self.scope} / {self.key}: {self.count}"


class FlowLimit(models.Model):
    """An operator's override of a scope's declared limit or rate: takes effect
    at the next admission, without a deploy. Empty fields keep the declared value."""

    scope = models.CharField(_("scope"), max_length=limits.FLOW_SCOPE)
    max_active = models.PositiveIntegerField(_("max active per key"), null=True, blank=True)
    rate_limit = models.PositiveIntegerField(_("admissions per window"), null=True, blank=True)
    changed_by = models.CharField(_("changed by"), max_length=limits.OPERATOR, blank=True)
    changed_at = models.DateTimeField(_("changed at"))

    objects: ClassVar[models.Manager[FlowLimit]] = EngineManager()

    class Meta:
        verbose_name = _("flow limit override")
        verbose_name_plural = _("flow limit overrides")
        constraints = [
            # A named constraint, not unique=True: MariaDB warns of unique
            # fields over 255 characters (mysql.W003); 401 x 4 bytes fits its index.
            models.UniqueConstraint(fields=["scope"], name="kumiflow_flowlimit_scope_uq"),
            models.CheckConstraint(
                condition=models.Q(max_active__isnull=True) | models.Q(max_active__gte=1),
                name="kumiflow_flowlimit_max_gte_1",
            ),
            models.CheckConstraint(
                condition=models.Q(rate_limit__isnull=True) | models.Q(rate_limit__gte=1),
                name="kumiflow_flowlimit_rate_gte_1",
            ),
        ]

    def __str__(self) -> str:
        return self.scope
