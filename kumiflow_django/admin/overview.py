"""The overview: the state of every workflow at a glance, fast on a million runs.

Every figure is read from an index, and none grows with the number of
finished runs in the store:

- runs per workflow and status: one statement of small counts, each capped
  at :data:`CAP` rows (an index range of ``(workflow, status)``); a count
  that reaches the cap reads "10,000+";
- starts, completions and failures per minute over the last hour and per
  hour over the last day: grouped in the database over the index ranges of
  ``started_at`` and ``(status, finished_at)`` (their cost grows with the
  runs of the last day, not with the store);
- the due backlog, its oldest item and the wake lateness: the ``wake_at``
  index range up to now;
- the outbox: capped counts by status, the delivery lag from the
  ``next_attempt_at`` index;
- the next cron fires, and the runs stalled or recovered after a worker died.

Every number links to the list behind it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.db.models import BigIntegerField, Count, Func, QuerySet
from django.urls import reverse
from django.utils import timezone

from kumiflow_django.admin.charts import Bar, bars
from kumiflow_django.admin.display import when
from kumiflow_django.definition.registry import registry
from kumiflow_django.projections.dispatches import Dispatch, DispatchStatus
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.projections.schedules import CronSchedule
from kumiflow_django.store import clock, db

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


class Bucket(Func):
    """The number of the ``seconds``-long interval since the epoch that a time
    falls in: an integer on every database, computed without a function call
    per row into Python (Django's ``Trunc`` on SQLite is one)."""

    output_field = BigIntegerField()

    def __init__(self, expression: Any, seconds: int) -> None:
        super().__init__(expression)
        self.seconds = int(seconds)

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> Any:  # type: ignore[override]
        column, params = compiler.compile(self.source_expressions[0])
        n = self.seconds
        if connection.vendor == "postgresql":
            sql = f"(CAST(EXTRACT(EPOCH FROM {column}) AS BIGINT) / {n})"
        elif connection.vendor == "mysql":
            sql = f"(TIMESTAMPDIFF(SECOND, '1970-01-01 00:00:00', {column}) DIV {n})"
        else:  # SQLite: julianday, rounded to milliseconds (a double's precision)
            sql = (
                f"(CAST(ROUND((julianday({column}) - 2440587.5) * 86400000) AS INTEGER) "
                f"/ {n * 1000})"
            )
        return sql, params


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
    connection = db.connection()
    parts, params = [], []
    for i, qs in enumerate(querysets):
        inner = qs.order_by().values("pk")[: CAP + 1]
        sql, inner_params = inner.query.get_compiler(using=db.alias()).as_sql()
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


def runs_url(**params: Any) -> str:
    query = {k: _param(v) for k, v in params.items()}
    return reverse("admin:kumiflow_workflowrun_changelist") + "?" + urlencode(query)


def dispatches_url(**params: Any) -> str:
    query = {k: _param(v) for k, v in params.items()}
    return reverse("admin:kumiflow_dispatch_changelist") + "?" + urlencode(query)


def _param(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="seconds")
    return str(value)


# -- runs per workflow and status ---------------------------------------------


def status_table() -> dict[str, Any]:
    names = sorted(w.name for w in registry.current())
    runs = WorkflowRun.objects.all()
    querysets = [runs.filter(status=s) for s in STATUSES]
    for name in names:
        querysets += [runs.filter(workflow=name, status=s) for s in STATUSES]
    counts = capped_counts(querysets)
    total = [
        _figure(n, runs_url(status__exact=s.value))
        for n, s in zip(counts[: len(STATUSES)], STATUSES, strict=True)
    ]
    rows = []
    for i, name in enumerate(names):
        chunk = counts[(i + 1) * len(STATUSES) : (i + 2) * len(STATUSES)]
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
    return {"statuses": [s.label for s in STATUSES], "total": total, "rows": rows}


# -- throughput ---------------------------------------------------------------


def _series(
    qs: QuerySet[Any, Any], field: str, start: datetime, step: int, count: int, by_status: bool
) -> dict[str, list[int]]:
    """Counts per ``step``-second bucket from ``start``, per status if ``by_status``."""
    end = start + timedelta(seconds=step * count)
    first = int(start.timestamp()) // step
    rows = (
        qs.filter(**{f"{field}__gte": start, f"{field}__lt": end})
        .annotate(kf_bucket=Bucket(field, step))
        .values(*(["status"] if by_status else []), "kf_bucket")
        .annotate(n=Count("pk"))
        .order_by()
    )
    out: dict[str, list[int]] = {}
    for row in rows:
        key = row["status"] if by_status else "all"
        values = out.setdefault(key, [0] * count)
        index = int(row["kf_bucket"]) - first
        if 0 <= index < count:
            values[index] += int(row["n"])
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
        runs = WorkflowRun.objects.all()
        started = _series(runs, "started_at", start, step, count, by_status=False)
        finished = _series(
            runs.filter(status__in=[RunStatus.COMPLETED, RunStatus.FAILED]),
            "finished_at",
            start,
            step,
            count,
            by_status=True,
        )
        empty = [0] * count
        windows.append(
            {
                "name": name,
                "charts": [
                    _chart(
                        started.get("all", empty),
                        start,
                        step,
                        css="kf-bar-started",
                        title="started",
                        url=lambda a, b: runs_url(started_at__gte=a, started_at__lt=b),
                    ),
                    _chart(
                        finished.get(RunStatus.COMPLETED, empty),
                        start,
                        step,
                        css="kf-bar-completed",
                        title="completed",
                        url=lambda a, b: runs_url(
                            status__exact="completed", finished_at__gte=a, finished_at__lt=b
                        ),
                    ),
                    _chart(
                        finished.get(RunStatus.FAILED, empty),
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


def backlog(now: datetime) -> dict[str, Any]:
    """Runs due now (their wake time has come), and how late they are."""
    due = WorkflowRun.objects.filter(wake_at__lte=now)
    late = list(due.order_by("wake_at").values_list("wake_at", flat=True)[: CAP + 1])
    stalled = due.filter(lease_until__lt=now).exclude(lease_owner="")
    [stalled_count] = capped_counts([stalled])
    ages = sorted(_age(at, now) or 0.0 for at in late[:CAP])
    median = ages[len(ages) // 2] if ages else None
    return {
        "due": _figure(len(late), runs_url(attention="due")),
        "oldest": _age(late[0], now) if late else None,
        "median_lateness": median,
        "stalled": _figure(stalled_count, runs_url(attention="stalled")),
    }


def recoveries(now: datetime) -> Figure:
    """Runs that finished in the last day after another worker took them over
    from a stalled one (their lease ran out)."""
    since = now - timedelta(days=1)
    [n] = capped_counts(
        [
            WorkflowRun.objects.filter(
                status__in=[RunStatus.COMPLETED, RunStatus.FAILED],
                finished_at__gte=since,
                recoveries__gt=0,
            )
        ]
    )
    return _figure(n, runs_url(attention="recovered"))


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
        "outbox": outbox(now),
        "cron": cron(now),
        "failures": recent_failures(now),
    }
