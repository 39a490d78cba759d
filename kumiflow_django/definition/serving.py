"""Which definitions the live worker processes serve: one heartbeat row per process.

In a rolling deploy old and new worker processes run side by side, each
with the definitions of its own code. A run is pinned to the definition it
started on (its fingerprint), so a process must know which fingerprints the
others serve before it claims a run whose definition it lacks: the run is
then left for one that has it, instead of failed.

Each ``kumiflow_worker`` writes a :class:`WorkerProcess` row when it starts
(every registered version of every workflow, as fingerprints), refreshes its
``last_seen`` every third of :func:`stale_after`, and deletes it when it stops
cleanly; a row not refreshed for :func:`stale_after` is a process that died,
and the next heartbeat of any worker prunes it.

The fingerprints are a JSON list on the row, not a child table: the question
"is fingerprint F served by a live worker" is asked of all live rows at once
(a handful, one per process), read in one query and answered in Python; the
answer goes into the due query as a ``fingerprint IN (…)`` list. Nothing
queries the heartbeat table by fingerprint.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from kumiflow_django.conf import settings
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.snapshots import DefinitionSnapshot, remember
from kumiflow_django.store import clock, db, limits
from kumiflow_django.store.models import EngineManager
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.definition.serving")


class WorkerProcess(models.Model):
    """A live ``kumiflow_worker`` process and the definitions it serves."""

    worker_id = models.CharField(_("worker"), max_length=limits.LEASE_OWNER, primary_key=True)
    host = models.CharField(_("host"), max_length=255)
    pid = models.PositiveIntegerField(_("process id"))
    started_at = models.DateTimeField(_("started at"))
    last_seen = models.DateTimeField(_("last seen"))
    #: ``[{"workflow", "version", "fingerprint", "current"}, …]``: every
    #: registered version; ``current`` marks the one that starts new runs.
    definitions = models.JSONField(_("definitions served"), default=list)

    objects: ClassVar[models.QuerySet[WorkerProcess, WorkerProcess]] = EngineManager.from_queryset(
        models.QuerySet
    )()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("worker process")
        verbose_name_plural = _("worker processes")
        indexes = [models.Index(fields=["last_seen"], name="kumiflow_worker_seen_idx")]

    def __str__(self) -> str:
        return self.worker_id

    @property
    def fingerprints(self) -> list[str]:
        return [d["fingerprint"] for d in self.definitions]


def stale_after() -> float:
    """Seconds after which a heartbeat row without news is a dead process
    (``KUMIFLOW_WORKER_STALE_SECONDS``; None: ``KUMIFLOW_LEASE_SECONDS``)."""
    value = settings.WORKER_STALE_SECONDS
    return float(value if value is not None else settings.LEASE_SECONDS)


def heartbeat_interval() -> float:
    """Seconds between two heartbeats: three of them fit in the staleness."""
    return stale_after() / 3


def served_here() -> list[dict[str, Any]]:
    """The definitions this process has registered, as the heartbeat row lists them."""
    return [
        {
            "workflow": workflow.name,
            "version": workflow.version or "",
            "fingerprint": workflow.fingerprint,
            "current": workflow is registry.get(workflow.name),
        }
        for workflow in registry.all_versions()
    ]


def live(now: datetime | None = None) -> models.QuerySet[WorkerProcess, WorkerProcess]:
    """The heartbeat rows refreshed within :func:`stale_after`."""
    now = now or clock.now()
    return WorkerProcess.objects.filter(last_seen__gt=now - timedelta(seconds=stale_after()))


def prune(now: datetime | None = None) -> int:
    """Delete the rows of processes that stopped sending heartbeats."""
    now = now or clock.now()
    stale = WorkerProcess.objects.filter(last_seen__lte=now - timedelta(seconds=stale_after()))
    deleted, _ = stale.delete()
    if deleted:
        logger.info("pruned %s stale worker process row(s)", deleted)
    return deleted


@db.retrying
def beat(worker_id: str, *, started_at: datetime | None = None) -> None:
    """Write or refresh this process's row (and prune the stale ones).

    At start (``started_at`` given) the definitions' snapshots are stored too:
    a snapshot's ``created_at`` is then when a process first had that
    definition, which orders a workflow's definitions by deploy
    (:func:`Served.claimable`). Their inserts can meet an appender's, which
    stores the snapshot of the run it starts (on MariaDB, a deadlock of two
    ``INSERT IGNORE`` of the snapshot table): the beat is run again then, not
    the worker brought down at its start."""
    now = clock.now()
    if started_at is not None:
        # Each snapshot in a transaction of its own, before the row: building
        # them is the costly part, and no lock waits for it.
        for workflow in registry.all_versions():
            remember(workflow)
    definitions = served_here()
    with db.atomic():
        updated = WorkerProcess.objects.filter(pk=worker_id).update(
            last_seen=now, definitions=definitions
        )
        if not updated:
            WorkerProcess.objects.create(
                worker_id=worker_id,
                host=socket.gethostname()[:255],
                pid=os.getpid(),
                started_at=started_at or now,
                last_seen=now,
                definitions=definitions,
            )
    prune(now)


def leave(worker_id: str) -> None:
    """Delete this process's row: it stops serving now, not when it goes stale."""
    WorkerProcess.objects.filter(pk=worker_id).delete()


@dataclass(frozen=True)
class Served:
    """What the live worker processes serve, read once (a due query's view)."""

    #: Fingerprints served by a live worker process.
    fingerprints: frozenset[str]
    #: Workflow -> fingerprints that a live process starts new runs on.
    current: dict[str, frozenset[str]]

    @classmethod
    def read(cls, now: datetime | None = None) -> Served:
        fingerprints: set[str] = set()
        current: dict[str, set[str]] = {}
        for definitions in live(now).values_list("definitions", flat=True):
            for d in definitions or ():
                fingerprints.add(d["fingerprint"])
                if d.get("current"):
                    current.setdefault(d["workflow"], set()).add(d["fingerprint"])
        return cls(frozenset(fingerprints), {w: frozenset(f) for w, f in current.items()})


def claimable(served: Served, *, takeover: bool = True) -> tuple[frozenset[str], frozenset[str]]:
    """The fingerprints this process may resume runs of, and the workflows
    whose queued runs it may start (they start on the current definition).

    Its own fingerprints; and, of the workflows it has, the older definitions
    no live worker serves (their workers are gone: this process takes their
    runs over). Older: first stored before this process's current definition
    of the workflow (snapshots are stored when a worker starts and when a run
    starts on a definition). A definition stored later than ours was deployed
    after ours: its runs wait for a process that has it, never for us.
    ``takeover=False``: its own fingerprints only.
    """
    mine = {w.fingerprint for w in registry.all_versions()}
    workflows = frozenset(w.name for w in registry.current())
    if not takeover:
        return frozenset(mine), workflows
    rows = DefinitionSnapshot.objects.filter(workflow__in=workflows).values_list(
        "fingerprint", "workflow", "created_at"
    )
    known = {fp: (workflow, created) for fp, workflow, created in rows}
    taken: set[str] = set()
    for fp, (workflow, created) in known.items():
        if fp in mine or fp in served.fingerprints:
            continue
        ours = known.get(registry.get(workflow).fingerprint)
        if ours is None or created <= ours[1]:
            taken.add(fp)
    return frozenset(mine | taken), workflows


def here(workflow: str, fingerprint: str, *, queued: bool = False) -> bool:
    """Whether this process may resume a run of ``workflow`` on ``fingerprint``
    now (a queued run: whether it has the workflow at all); else the run is
    left for a process that has its definition."""
    if not registry.is_registered(workflow):
        return False
    if queued or any(w.fingerprint == fingerprint for w in registry.all_versions()):
        return True
    fingerprints, _ = claimable(Served.read())
    return fingerprint in fingerprints
