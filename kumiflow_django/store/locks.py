"""Named locks held by one process across many transactions: a row with a lease.

Retention deletes in many short transactions, and only one process may do
so at a time. A session lock of the database (PostgreSQL's advisory locks,
MariaDB's ``GET_LOCK``) would end with its connection, but SQLite has none,
and behind a transaction-pooling PgBouncer a session lock stays on whichever
server connection took it. A row works the same everywhere:

- :func:`acquire` takes the row when it is free or its lease has run out;
- the holder calls :func:`renew` inside each of its transactions: the
  ``UPDATE`` also locks the row until that transaction commits, so a holder
  whose lease ran out (and was taken over) finds out before it writes
  anything, never after;
- :func:`release` frees it; a process that dies leaves the row to expire.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import ClassVar

from django.db import IntegrityError, models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from kumiflow_django.store import clock, db, limits
from kumiflow_django.store.models import EngineManager
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.store.locks")


class LockHeld(Exception):
    """Another process holds the lock (and its lease has not run out)."""

    def __init__(self, name: str, owner: str, expires_at: datetime | None) -> None:
        self.name, self.owner, self.expires_at = name, owner, expires_at
        until = f" until {expires_at:%Y-%m-%d %H:%M:%S %Z}" if expires_at else ""
        super().__init__(f"lock {name!r} is held by {owner}{until}")


class ProcessLock(models.Model):
    """One named lock. Operational, not projected from the log."""

    name = models.CharField(_("name"), max_length=100, primary_key=True)
    owner = models.CharField(_("held by"), max_length=limits.LEASE_OWNER, blank=True)
    acquired_at = models.DateTimeField(_("acquired at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)

    objects: ClassVar[models.Manager[ProcessLock]] = EngineManager()

    class Meta:
        verbose_name = _("process lock")
        verbose_name_plural = _("process locks")

    def __str__(self) -> str:
        return f"{self.name} ({self.owner or 'free'})"


def acquire(name: str, owner: str, seconds: float) -> None:
    """Take the lock for ``seconds``, or raise :class:`LockHeld`."""
    now = clock.now()
    with db.atomic():
        try:
            with db.atomic():
                ProcessLock.objects.create(name=name)
        except IntegrityError:
            pass  # it exists: taken below if it is free
        taken = (
            ProcessLock.objects.filter(name=name)
            .filter(Q(owner="") | Q(owner=owner) | Q(expires_at__lte=now) | Q(expires_at=None))
            .update(owner=owner, acquired_at=now, expires_at=now + timedelta(seconds=seconds))
        )
        if not taken:
            held = ProcessLock.objects.get(name=name)
            raise LockHeld(name, held.owner, held.expires_at)
    logger.info("lock %s taken by %s", name, owner)


def renew(name: str, owner: str, seconds: float) -> bool:
    """Extend the lease, inside the caller's transaction; False if another
    process took the lock over (a lease that ran out but was not taken is
    still ours: a taker would have had to change the row)."""
    expires = clock.now() + timedelta(seconds=seconds)
    return bool(ProcessLock.objects.filter(name=name, owner=owner).update(expires_at=expires))


def release(name: str, owner: str) -> None:
    """Free the lock if it is still ours."""
    with db.atomic():
        ProcessLock.objects.filter(name=name, owner=owner).update(owner="", expires_at=clock.now())
    logger.info("lock %s released by %s", name, owner)
