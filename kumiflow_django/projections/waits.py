"""Waits: the events a waiting run awaits, one ``RunWait`` row each.

Every wait is stored here, one way: a run suspended in ``wait_for_event``
has one row (its branch is :data:`ROOT`, the empty path), a run whose
parallel branches wait for several events has one row per awaited event.
Each row carries the correlation key of its match, so that an appended event
finds its waiting runs through one index. The rows are a projection of the
run's last suspension (``step.waiting-for-event``, ``step.waiting-branches``,
or the ``run-retried`` that restored one): written with the segment that
suspends the run, removed with the one that resumes or ends it (:func:`sync`),
rebuilt from the log by ``kumiflow_rebuild``.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, NamedTuple

from django.db import models
from django.utils.translation import gettext_lazy as _

from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.store import db, limits, sql
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import EngineManager, Event

#: The branch of a run's own (top-level) wait: the path of no branch.
ROOT = ""


class RunWait(models.Model):
    # A relation for the join of the wake-up's look-up (the waiting run's
    # version and lock-order columns in the same statement), not a constraint:
    # the rows are a projection, deleted and rebuilt beside the runs.
    run = models.ForeignKey(
        WorkflowRun,
        verbose_name=_("run"),
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    tenant_id = models.CharField(_("tenant"), max_length=limits.TENANT)
    branch = models.CharField(_("branch"), max_length=limits.STEP_PATH)
    event_type = models.CharField(_("awaited event type"), max_length=limits.EVENT_TYPE)
    correlation_key = models.CharField(_("correlation key"), max_length=64)
    match = models.JSONField(_("awaited match"), default=dict)
    after = models.BigIntegerField(_("awaits events after"))
    # Positions at or below ``after`` whose events the wait had not seen (in
    # flight when an earlier wait of the run took a later event): they count
    # as after it; null: the run's start gaps apply.
    gaps = models.JSONField(_("awaited gaps"), null=True, blank=True)

    objects: ClassVar[EngineManager[RunWait]] = EngineManager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("wait")
        verbose_name_plural = _("waits")
        indexes = [
            # Waits for an event like this one (and the admin's search by
            # correlation value, hence the key first).
            models.Index(
                fields=["correlation_key", "event_type", "tenant_id"],
                name="kumiflow_wait_awaiting_idx",
            ),
            models.Index(fields=["run"], name="kumiflow_wait_run_idx"),
        ]

    def __str__(self) -> str:
        where = f"branch {self.branch}" if self.branch else "its own step"
        return f"run {self.run_id} ({where}) awaits {self.event_type}"


def waits_events(run: WorkflowRun) -> bool:
    """Whether the run has ``RunWait`` rows: it waits for an event (its own
    wait, or its branches')."""
    return run.status == RunStatus.WAITING_EVENT or run.branch_waits > 0


Key = tuple[str, str, str, str]


def _key(data: Any) -> Key:
    return (
        data["branch"],
        data["event_type"],
        data["correlation_key"],
        f"{data['after']}:{data.get('gaps')}",
    )


def _own(awaited: Any) -> dict[str, Any]:
    """The run's own wait (a ``step.waiting-for-event`` or a restored one) as a row."""
    row = {k: awaited[k] for k in ("event_type", "correlation_key", "match", "after")}
    if awaited.get("gaps") is not None:
        row["gaps"] = awaited["gaps"]
    return {"branch": ROOT, **row}


def waits_of(event: Event) -> list[dict[str, Any]]:
    """The waits a run event leaves: those of a suspension, or of the
    suspension a retry restores; none for any other event."""
    if event.type == ev.RUN_RETRIED:
        restore = event.payload["restore"]
        found = list(restore.get("waits") or [])
        if restore.get("awaited") and restore.get("status") == RunStatus.WAITING_EVENT:
            found.append(_own(restore["awaited"]))
        return found
    if event.type == ev.STEP_WAITING_FOR_EVENT:
        return [_own(event.payload)]
    if event.type != ev.STEP_WAITING_BRANCHES:
        return []
    return list(event.payload.get("waits") or [])


def sync(run_id: uuid.UUID, tenant: str, waits: Iterable[dict[str, Any]], *, had: bool) -> None:
    """Make the run's rows the given waits (``had``: the run may have rows now)."""
    wanted = {_key(w): w for w in waits}
    if not wanted:  # the run waits no more (resumed, ended): one statement
        if had:
            _delete_all(run_id)
        return
    existing: dict[Key, int] = {}
    if had and all(key[0] == ROOT for key in wanted):
        # Its own wait after another (sequential waits): replaced, two statements.
        _delete_all(run_id)
    elif had:
        for row in RunWait.objects.filter(run_id=run_id).values(
            "id", "branch", "event_type", "correlation_key", "after", "gaps"
        ):
            existing[_key(row)] = row["id"]
    stale = [pk for key, pk in existing.items() if key not in wanted]
    if stale:
        RunWait.objects.filter(pk__in=stale).delete()
    new = [
        RunWait(
            run_id=run_id,
            tenant_id=tenant,
            branch=w["branch"],
            event_type=w["event_type"],
            correlation_key=w["correlation_key"],
            match=w["match"],
            after=w["after"],
            gaps=w.get("gaps"),
        )
        for key, w in wanted.items()
        if key not in existing
    ]
    if new:
        RunWait.objects.bulk_create(new)


def _delete_all(run_id: uuid.UUID) -> None:
    """Delete the run's rows in one built statement (no row refers to a wait:
    the ORM's delete would build its query each time, and collect first)."""
    sql.delete(RunWait, using=db.alias(), run_id=run_id)


def own_waits(runs: Iterable[WorkflowRun]) -> dict[uuid.UUID, RunWait]:
    """The waits of those of ``runs`` suspended in ``wait_for_event`` (their
    row of the root branch), by run, in one query (none if no run waits so)."""
    ids = [run.id for run in runs if run.status == RunStatus.WAITING_EVENT]
    if not ids:
        return {}
    rows = RunWait.objects.filter(run_id__in=ids, branch=ROOT).order_by("id")
    return {row.run_id: row for row in rows}


def own_wait(run: WorkflowRun) -> RunWait | None:
    """The wait of a run suspended in ``wait_for_event``, or None."""
    return own_waits([run]).get(run.id)


# -- the wake-up's look-up ----------------------------------------------------


class Awaited(NamedTuple):
    """What an appended event may satisfy: the waits of ``tenant`` for one
    of ``types``, each ``(awaited event type, its correlation keys)``."""

    tenant: str
    types: Sequence[tuple[str, Sequence[str]]]


#: The columns :func:`awaiting` reads beside the wait's run: where the run is
#: in the lock order and its version (of the run), then the wait.
_OF_RUN = ("depth", "parent_id", "parent_waits", "version")
_OF_WAIT = ("event_type", "match", "after", "gaps")


@functools.lru_cache(maxsize=256)
def _awaiting_sql(shape: tuple[int, ...], using: str) -> tuple[str, tuple[Any, ...]]:
    """The look-up of :func:`awaiting` for conditions of ``shape`` (the
    number of keys of each), built once per shape."""
    run, wait = WorkflowRun._meta, RunWait._meta

    def w(name: str) -> str:
        return sql.column(wait.get_field(name), using, table=True)  # type: ignore[arg-type]

    def r(name: str) -> str:
        return sql.column(run.get_field(name), using, table=True)  # type: ignore[arg-type]

    fields: tuple[Any, ...] = (wait.get_field("run"), *(run.get_field(c) for c in _OF_RUN))
    fields += tuple(wait.get_field(c) for c in _OF_WAIT)
    selected = ", ".join([w("run"), *(r(c) for c in _OF_RUN), *(w(c) for c in _OF_WAIT)])
    conditions = " OR ".join(
        f"({w('event_type')} = %s AND {w('correlation_key')} IN ({', '.join(['%s'] * n)}))"
        for n in shape
    )
    # Table and column names come from the models, quoted; values are parameters.
    statement = (
        f"SELECT {selected} FROM {sql.table(RunWait, using)} INNER JOIN "  # noqa: S608
        f"{sql.table(WorkflowRun, using)} ON ({w('run')} = {r('id')}) "
        f"WHERE ({conditions}) AND {w('tenant_id')} = %s AND {r('status')} IN (%s, %s) "
        f"ORDER BY {r('started_at')} ASC, {w('run')} ASC, {w('id')} ASC"
    )
    return statement, fields


def awaiting(awaited: Awaited) -> list[tuple[Any, ...]]:
    """The waits ``awaited`` whose runs wait (``waiting_event``, or
    ``waiting`` in their branches): each its run's id, what the lock order
    needs of the run and its version, then the wait's type, match, cut-off
    and gaps. One statement on the waits' correlation index, joined to each
    run's row by its primary key, in the order of the runs' starts.

    No cut-off in SQL: an event that commits late may have a position below
    a wait's cut-off and still count (a gap of its start); the caller
    decides. The statement is built once per shape (``store.sql``): the
    ORM's compiler cost more than the database here, once per append."""
    # As a filter's ``__in`` sends them: each key once.
    conditions = [(type_, list(dict.fromkeys(keys))) for type_, keys in awaited.types if keys]
    if not conditions:
        return []
    using = RunWait._default_manager.get_queryset().db
    statement, fields = _awaiting_sql(tuple(len(keys) for _, keys in conditions), using)
    params: list[Any] = []
    for type_, keys in conditions:
        params += [type_, *keys]
    params += [awaited.tenant, RunStatus.WAITING_EVENT.value, RunStatus.WAITING.value]
    return sql.fetch(statement, params, fields, using=using)
