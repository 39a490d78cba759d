"""The overview: the state of every workflow at a glance, fast on a million runs.

Every figure is read from an index, and none grows with the number of
finished runs in the store:

- runs per workflow and status: one statement of small counts, each capped
  at :data:`CAP` rows (an index range of ``(workflow, status)``); a count
  that reaches the cap reads "10,000+";
- starts, completions and failures per minute over the last hour and per
  hour over the last day: a count over an index range per interval
  (``started_at``, ``(status, finished_at)``), all in one statement (their
  cost grows with the runs of the last day, not with the store);
- the due backlog, its oldest item and the wake lateness: the ``wake_at``
  index range up to now;
- the outbox: capped counts by status, the delivery lag from the
  ``next_attempt_at`` index;
- the next cron fires, and the runs stalled or recovered after a worker died.

Every number links to the list behind it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.db.models import Field, Q, QuerySet, Value
from django.urls import get_script_prefix, get_urlconf, reverse
from django.utils import timezone

from kumiflow_django.admin.charts import Bar, bars
from kumiflow_django.admin.display import when
from kumiflow_django.definition.registry import registry
from kumiflow_django.engine import unserved
from kumiflow_django.projections.dispatches import Dispatch, DispatchStatus
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.projections.schedules import CronSchedule
from kumiflow_django.projections.tasks import StepTask
from kumiflow_django.projections.waits import ROOT, RunWait
from kumiflow_django.store import clock, db, leases, replica
from kumiflow_django.store import names as ev

#: Counts stop here: an exact count of a million rows is a scan.
CAP = 10_000
#: The statuses as the overview's columns, in the order an operator reads them.
STATUSES = [
    RunStatus.RUNNING,
    RunStatus.PENDING,
    RunStatus.WAITING,
    RunStatus.WAITING_EVENT,
    RunStatus.RETRY_SCHEDULED,
    RunStatus.FAILED,
    RunStatus.CANCELLED,
    RunStatus.COMPLETED,
]
OUTBOX_STATUSES = [
    DispatchStatus.PENDING,
    DispatchStatus.FAILED,
    DispatchStatus.DEAD,
    DispatchStatus.CANCELLED,
]


@dataclass(frozen=True)
class Figure:
    """A count and the list behind it."""

    value: int
    url: str
    capped: bool = False

    @property
    def text(self) -> str:
        return f"{CAP:,}+" if self.capped else f"{self.value:,}"


def capped_counts(querysets: Sequence[QuerySet[Any, Any]]) -> list[int]:
    """The rows of each queryset, each counted up to CAP + 1, in one statement."""
    if not querysets:
        return []
    connection = replica.read_connection()  # a page's reads: the replica if marked
    parts, params = [], []
    for i, qs in enumerate(querysets):
        # A constant, not the key: the count reads the index alone (a covering
        # scan), never the table's rows.
        inner = qs.order_by().annotate(kf_one=Value(1)).values("kf_one")[: CAP + 1]
        sql, inner_params = inner.query.get_compiler(connection=connection).as_sql()
        parts.append(f"SELECT {i} AS k, COUNT(*) AS n FROM ({sql}) kf{i}")  # noqa: S608
        params.extend(inner_params)
    counts = [0] * len(querysets)
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        for k, n in cursor.fetchall():
            counts[int(k)] = int(n)
    return counts


def _figure(n: int, url: str) -> Figure:
    return Figure(min(n, CAP), url, capped=n > CAP)


@functools.lru_cache(maxsize=16)
def _changelist(name: str, prefix: str, urlconf: Any) -> str:
    return reverse(f"admin:kumiflow_{name}_changelist", urlconf=urlconf)


def _list_url(name: str, params: dict[str, Any]) -> str:
    # A few hundred links per page: the list's address is looked up once.
    base = _changelist(name, get_script_prefix(), get_urlconf())
    return base + "?" + urlencode({k: _param(v) for k, v in params.items()})


def runs_url(**params: Any) -> str:
    # The overview counts child runs too: its links list them (the list hides them by default).
    return _list_url("workflowrun", {**params, "children": "yes"})


def dispatches_url(**params: Any) -> str:
    return _list_url("dispatch", params)


def _param(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="seconds")
    return str(value)


# -- runs per workflow and status ---------------------------------------------


def _column(name: str) -> str:
    """The quoted column of one of the run table's fields."""
    field = WorkflowRun._meta.get_field(name)
    assert isinstance(field, Field) and field.column is not None
    return str(db.connection().ops.quote_name(field.column))


def _table() -> str:
    return str(db.connection().ops.quote_name(str(WorkflowRun._meta.db_table)))


def equal_counts(conditions: Sequence[dict[str, str]]) -> list[int]:
    """The runs whose fields equal each condition's values, each counted up to
    CAP + 1 over an index range, in one statement (written here, not by the
    ORM: compiling a hundred querysets costs more than running them)."""
    if not conditions:
        return []
    connection = replica.read_connection()
    parts: list[str] = []
    params: list[str] = []
    for i, condition in enumerate(conditions):
        where = " AND ".join(f"{_column(f)} = %s" for f in condition)
        # Names come from the model, quoted; values are parameters.
        parts.append(
            f"SELECT {i} AS k, COUNT(*) AS n FROM (SELECT 1 AS one FROM "  # noqa: S608
            f"{_table()} WHERE {where} LIMIT {CAP + 1}) kf{i}"
        )
        params.extend(condition.values())
    counts = [0] * len(conditions)
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        for k, n in cursor.fetchall():
            counts[int(k)] = int(n)
    return counts


def status_table() -> dict[str, Any]:
    names = sorted(w.name for w in registry.current())
    conditions = [{"status": str(s)} for s in STATUSES]
    for name in names:
        conditions += [{"workflow": name, "status": str(s)} for s in STATUSES]
    counts = equal_counts(conditions)
    total = [
        _figure(n, runs_url(status__exact=s.value))
        for n, s in zip(counts[: len(STATUSES)], STATUSES, strict=True)
    ]
    rows = []
    idle = 0
    for i, name in enumerate(names):
        chunk = counts[(i + 1) * len(STATUSES) : (i + 2) * len(STATUSES)]
        if not any(chunk):  # a registered workflow without runs: counted, not listed
            idle += 1
            continue
        rows.append(
            (
                name,
                runs_url(workflow=name),
                [
                    _figure(n, runs_url(workflow=name, status__exact=s.value))
                    for n, s in zip(chunk, STATUSES, strict=True)
                ],
            )
        )
    return {
        "statuses": [s.label for s in STATUSES],
        "total": total,
        "rows": rows,
        "idle": idle,
    }


# -- throughput ---------------------------------------------------------------


def interval_counts(
    series: Sequence[tuple[str, str | None, datetime, int, int]],
) -> list[list[int]]:
    """For each series (a time column, a status or None, the start, the interval
    in seconds, the number of intervals): the runs in each interval. Every
    interval is a count over an index range (``started_at``, or ``(status,
    finished_at)``): no function of a row is computed, no row is read, and all
    of them are one statement."""
    connection = replica.read_connection()
    table = _table()
    status_column = _column("status")
    adapt = connection.ops.adapt_datetimefield_value
    columns: list[str] = []
    params: list[Any] = []
    for field, status, start, step, count in series:
        column = _column(field)
        where = f"{column} >= %s AND {column} < %s"
        if status is not None:
            where = f"{status_column} = %s AND {where}"
        for i in range(count):
            begin = start + timedelta(seconds=step * i)
            # Names come from the model, quoted; values are parameters.
            columns.append(f"(SELECT COUNT(*) FROM {table} WHERE {where})")  # noqa: S608
            params += [] if status is None else [status]
            params += [adapt(begin), adapt(begin + timedelta(seconds=step))]
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(columns), params)
        row = [int(n) for n in cursor.fetchone()]
    out, at = [], 0
    for *_, count in series:
        out.append(row[at : at + count])
        at += count
    return out


def _chart(
    values: list[int],
    start: datetime,
    step: int,
    *,
    css: str,
    title: str,
    url: Any,
) -> dict[str, Any]:
    series = []
    ticks = []
    tick_every = 15 if step == 60 else 6
    for i, n in enumerate(values):
        at = start + timedelta(seconds=step * i)
        local = timezone.localtime(at)
        label = local.strftime("%H:%M") if step == 60 else local.strftime("%d %b %H:00")
        series.append(Bar(n, f"{label} {local.tzname()}", url(at, at + timedelta(seconds=step))))
        if i % tick_every == 0:
            ticks.append((i, local.strftime("%H:%M")))
    total = sum(values)
    end = start + timedelta(seconds=step * len(values))
    return {
        "title": title,
        "svg": bars(series, css=css, title=title, ticks=ticks),
        "total": Figure(total, url(start, end)),
        "peak": max(values, default=0),
    }


def throughput(now: datetime) -> list[dict[str, Any]]:
    """Starts, completions and failures per minute (last hour) and per hour (last day)."""
    windows = []
    minute = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    for name, start, step, count in (
        ("the last hour, per minute", minute - timedelta(hours=1), 60, 60),
        ("the last day, per hour", hour - timedelta(days=1), 3600, 24),
    ):
        started, completed, failed = interval_counts(
            [
                ("started_at", None, start, step, count),
                ("finished_at", RunStatus.COMPLETED, start, step, count),
                ("finished_at", RunStatus.FAILED, start, step, count),
            ]
        )
        windows.append(
            {
                "name": name,
                "charts": [
                    _chart(
                        started,
                        start,
                        step,
                        css="kf-bar-started",
                        title="started",
                        url=lambda a, b: runs_url(started_at__gte=a, started_at__lt=b),
                    ),
                    _chart(
                        completed,
                        start,
                        step,
                        css="kf-bar-completed",
                        title="completed",
                        url=lambda a, b: runs_url(
                            status__exact="completed", finished_at__gte=a, finished_at__lt=b
                        ),
                    ),
                    _chart(
                        failed,
                        start,
                        step,
                        css="kf-bar-failed",
                        title="failed",
                        url=lambda a, b: runs_url(
                            status__exact="failed", finished_at__gte=a, finished_at__lt=b
                        ),
                    ),
                ],
            }
        )
    return windows


# -- backlog, outbox, cron, stalls ------------------------------------------------


def _age(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else max((now - moment).total_seconds(), 0.0)


#: The runs the "stalled now" figure looks at: the longest due (the resume
#: loop leases the earliest due first, so a dead worker's leases are there).
STALLED_WINDOW = 1000


def backlog(now: datetime) -> dict[str, Any]:
    """Runs due now (their wake time has come), and how late they are; all
    from the ``wake_at`` index (its range up to now)."""
    due = WorkflowRun.objects.filter(wake_at__lte=now).order_by("wake_at")
    count, unserved_count = capped_counts([due, unserved.waiting(now)])
    oldest = due.values_list("wake_at", flat=True).first()
    median = due.values_list("wake_at", flat=True)[min(count, CAP) // 2] if count else None
    held = due.values_list("lease_owner", "lease_until")[:STALLED_WINDOW]
    stalled = sum(1 for owner, until in held if leases.stalled(owner, until, now))
    return {
        "due": _figure(count, runs_url(attention="due")),
        "oldest": _age(oldest, now),
        "median_lateness": _age(median, now),
        "stalled": Figure(stalled, runs_url(attention="stalled")),
        "stalled_window": STALLED_WINDOW,
        "unserved": _figure(unserved_count, runs_url(attention="definition")),
    }


def waits(now: datetime) -> dict[str, Figure]:
    """Runs waiting for a person (at an approval) apart from runs waiting for
    other events (a carrier's webhook, a payment)."""
    waiting = WorkflowRun.objects.filter(status=RunStatus.WAITING_EVENT)
    approvals = RunWait.objects.filter(branch=ROOT, event_type=ev.APPROVAL_DECIDED)
    person = waiting.filter(id__in=approvals.values("run_id"))
    other = waiting.exclude(id__in=approvals.values("run_id"))
    people, others = capped_counts([person, other])
    return {
        "person": _figure(people, reverse("admin:kumiflow_approvals")),
        "other": _figure(others, runs_url(status=RunStatus.WAITING_EVENT)),
    }


def recovered_runs(now: datetime) -> QuerySet[WorkflowRun, WorkflowRun]:
    """Runs that finished in the last day after a stalled worker was taken over:
    the run's own lease ran out (another worker resumed it), or a task attempt
    of it was given up because its worker was lost, and tried again."""
    since = now - timedelta(days=1)
    lost = StepTask.objects.filter(error_type=ev.WORKER_LOST, updated_at__gte=since)
    return WorkflowRun.objects.filter(
        Q(recoveries__gt=0) | Q(id__in=lost.values("run_id")),
        status__in=[RunStatus.COMPLETED, RunStatus.FAILED],
        finished_at__gte=since,
    )


def recoveries(now: datetime) -> Figure:
    """The runs of :func:`recovered_runs`."""
    [n] = capped_counts([recovered_runs(now)])
    return _figure(n, runs_url(attention="recovered"))


def delivery_problems() -> Figure:
    """Completed runs with a dead or failing delivery: done, but not all of it."""
    bad = Dispatch.objects.filter(status__in=[DispatchStatus.DEAD, DispatchStatus.FAILED])
    [n] = capped_counts(
        [WorkflowRun.objects.filter(status=RunStatus.COMPLETED, id__in=bad.values("run_id"))]
    )
    return _figure(n, runs_url(attention="delivery"))


def outbox(now: datetime) -> dict[str, Any]:
    dispatches = Dispatch.objects.all()
    counts = capped_counts([dispatches.filter(status=s) for s in OUTBOX_STATUSES])
    due = (
        dispatches.filter(next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("next_attempt_at", flat=True)
        .first()
    )
    oldest_pending = (
        dispatches.filter(status=DispatchStatus.PENDING)
        .order_by("created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    return {
        "counts": [
            (s.label, _figure(n, dispatches_url(status__exact=s.value)))
            for s, n in zip(OUTBOX_STATUSES, counts, strict=True)
        ],
        "lag": _age(due, now),
        "oldest_pending": _age(oldest_pending, now),
    }


def cron(now: datetime) -> dict[str, Any]:
    schedules = CronSchedule.objects.all()
    upcoming = list(
        schedules.filter(enabled=True, next_fire_at__isnull=False).order_by("next_fire_at")[:6]
    )
    disabled = schedules.filter(enabled=False).count()  # one row per cron workflow
    return {
        "upcoming": [(s, when(s.next_fire_at, now=now)) for s in upcoming],
        "disabled": Figure(
            disabled,
            reverse("admin:kumiflow_cronschedule_changelist") + "?enabled__exact=0",
        ),
    }


def recent_failures(now: datetime) -> list[tuple[WorkflowRun, Any]]:
    runs = (
        WorkflowRun.objects.filter(status=RunStatus.FAILED)
        .order_by("-finished_at")
        .only("id", "workflow", "reason", "last_error", "finished_at", "cursor")[:8]
    )
    return [(run, when(run.finished_at, now=now)) for run in runs]


def context() -> dict[str, Any]:
    now = clock.now()
    return {
        "now": now,
        "table": status_table(),
        "throughput": throughput(now),
        "backlog": backlog(now),
        "recoveries": recoveries(now),
        "delivery_problems": delivery_problems(),
        "waits": waits(now),
        "outbox": outbox(now),
        "cron": cron(now),
        "failures": recent_failures(now),
    }
