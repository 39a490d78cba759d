"""Who writes which column of the run table (``projections/runs.py``).

Every INSERT and UPDATE of ``WorkflowRun`` is recorded (with the code that
issued it) while the engine goes through a start, a timer, a wake, an awaited
event, a task, a child, a cancel, a retry, flow control's queue, park and
admission, a compensation and a rebuild. Then:

- rows are inserted only by the fold's write path (``projections.stream``) or
  the rebuild's replay;
- the fold's write path touches the scheduler's lease only to end it;
- every other write is the scheduler's (a known writer) and sets only
  ``SCHEDULER_COLUMNS`` and ``PARKED_COLUMNS``.

Writes that still break the rule are in :data:`KNOWN_VIOLATIONS`, each named;
an entry that no longer happens fails the test, so the list can only shrink.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from kumiflow_django import (
    Limit,
    append_event,
    cancel_run,
    define_workflow,
    on_event,
    retry_run,
    set_flow_limit,
    start_workflow,
    wake_run,
)
from kumiflow_django import steps as s
from kumiflow_django.flow.admission import OVERRIDE_TTL
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.projections import runs
from kumiflow_django.projections.rebuild import rebuild_all
from kumiflow_django.store import db
from kumiflow_django.testing import run_until_idle
from testproject.shop.tasks import double

pytestmark = pytest.mark.django_db

PACKAGE = Path(runs.__file__).resolve().parent.parent
TABLE = WorkflowRun._meta.db_table
_QUOTED = r"[`\"]?"
_UPDATE = re.compile(
    rf"^\s*UPDATE\s+{_QUOTED}{TABLE}{_QUOTED}\s+SET\s+(?P<set>.*?)\s+WHERE\s", re.S | re.I
)
_INSERT = re.compile(rf"^\s*INSERT\s+INTO\s+{_QUOTED}{TABLE}{_QUOTED}\s*\((?P<cols>[^)]*)\)", re.I)
_ASSIGNED = re.compile(r"[`\"](\w+)[`\"]\s*=\s*(%s|NULL)?")

#: The fold's write path: a ``Change`` written by ``projections.stream``, and
#: the rebuild's replay of the log through the same fold.
FOLD_PATH = {
    ("projections/stream.py", "write"),
    ("projections/stream.py", "_update"),
    ("projections/rebuild.py", "_replay"),
}

#: The scheduler: the code that may write SCHEDULER_COLUMNS and PARKED_COLUMNS.
SCHEDULER = {
    ("workers/resume.py", "lease"): "the resume loop leases due runs (its claim)",
    ("workers/resume.py", "_release"): "and gives back a lease it did not use",
    ("flow/gates.py", "park"): "a due queued run still held waits again",
    ("flow/gates.py", "wake"): "a freed slot makes the next parked runs due",
    ("flow/limits.py", "_wake_scope"): "a changed limit re-checks the parked runs",
    ("projections/rebuild.py", "_recheck_queued"): "a rebuilt table re-checks queued runs",
}

#: Writes of fold-owned columns outside the fold's write path, still to fix.
KNOWN_VIOLATIONS: dict[tuple[str, str], frozenset[str]] = {}


@dataclass(frozen=True)
class Write:
    kind: str  # "insert" or "update"
    columns: dict[str, Any]  # column: value (an INSERT: the columns only, values None)
    writer: tuple[str, str]  # the innermost frame of the package, outside store/sql.py
    fold: bool  # written by the fold's write path

    def __str__(self) -> str:
        where = "fold" if self.fold else ":".join(self.writer)
        return f"{self.kind} by {where}: {sorted(self.columns)}"


def _frames() -> Iterator[tuple[str, str]]:
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(PACKAGE):
            yield path.relative_to(PACKAGE).as_posix(), frame.f_code.co_name
        frame = frame.f_back  # type: ignore[assignment]


class Recorder:
    """An ``execute_wrapper`` that keeps every write to the run table."""

    def __init__(self) -> None:
        self.writes: list[Write] = []

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        given = list(params or ())
        for part in _parts(sql):
            count = part.count("%s")
            self.record(part, given[:count])
            given = given[count:]
        return execute(sql, params, many, context)

    def record(self, sql: str, params: Any) -> None:
        update = _UPDATE.match(sql)
        insert = None if update else _INSERT.match(sql)
        if update or insert:
            frames = [f for f in _frames() if f[0] != "store/sql.py"]
            # The innermost frame: a scheduler's write made inside a Change's
            # announcement of its events is the scheduler's, not the fold's.
            writer = frames[0] if frames else ("?", "?")
            fold = writer in FOLD_PATH
            if update:
                given = iter(params or ())
                columns = {
                    name: next(given) if value == "%s" else value or "?"
                    for name, value in _ASSIGNED.findall(update["set"])
                }
                columns = {k: None if v == "NULL" else v for k, v in columns.items()}
                self.writes.append(Write("update", columns, writer, fold))
            else:
                assert insert is not None
                names = re.findall(r"\w+", insert["cols"])
                self.writes.append(Write("insert", dict.fromkeys(names), writer, fold))


#: A write of several statements in one (``sql.write_together``): ``WITH w0 AS
#: (<statement>), w1 AS (<statement>) SELECT ...``.
_FUSED_PART = re.compile(r"(?:^WITH |\), )w\d+ AS \(")
_FUSED_END = re.compile(r"(?: RETURNING 1)?\) SELECT (?:ARRAY|\(SELECT COUNT).*$", re.S)


def _parts(sql: str) -> list[str]:
    """The statements of ``sql``: itself, or those of a fused write."""
    if not sql.startswith("WITH w0 AS ("):
        return [sql]
    parts = _FUSED_PART.split(sql)[1:]
    parts[-1] = _FUSED_END.sub("", parts[-1])
    return [re.sub(r" RETURNING (1|\S+)$", "", part) for part in parts]


def reload(run: WorkflowRun) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=run.pk)


def scenarios(clock: Any, registry: Any) -> None:
    """One of each: the ways a run's row is written."""
    # start, timer, operator wake, complete
    define_workflow("nap", steps=[s.wait("PT1H"), s.return_("rested")])
    napping = start_workflow("nap")
    wake_run(napping.id, by="ops", reason="now")
    run_until_idle()
    assert reload(napping).status == RunStatus.COMPLETED

    # an awaited event wakes its run inline
    define_workflow(
        "order",
        trigger=on_event("order.placed"),
        steps=[
            s.wait_for_event(
                "payment.received",
                match={"payload.order_id": lambda ctx: ctx.event.payload["order_id"]},
                timeout="P3D",
                name="payment",
            ),
            s.return_(lambda ctx: ctx.steps["payment"]),
        ],
    )
    append_event("order-1", "order.placed", {"order_id": 1})
    append_event("pay-1", "payment.received", {"order_id": 1})

    # a deploy carries a run on to another definition (definition-switched)
    define_workflow("deployed", steps=[s.wait("PT1H"), s.return_("v1")])
    deployed = start_workflow("deployed")
    registry.unregister("deployed")
    v2 = define_workflow("deployed", steps=[s.wait("PT1H"), s.return_("v2")])
    clock.advance(hours=1)
    run_until_idle()
    assert (reload(deployed).result, reload(deployed).fingerprint) == ("v2", v2.fingerprint)

    # a task step
    define_workflow("doubling", steps=[s.task("doubled", double, args=[21]), s.return_("ok")])
    doubling = start_workflow("doubling")
    run_until_idle()
    assert reload(doubling).status == RunStatus.COMPLETED

    # a child that ends in a later segment settles its waiting parent
    define_workflow("leaf", steps=[s.wait("PT1M"), s.return_("leaf")])
    define_workflow("parent", steps=[s.child("leaf", "leaf"), s.return_("done")])
    parent = start_workflow("parent")
    clock.advance(minutes=1)
    run_until_idle()
    assert reload(parent).status == RunStatus.COMPLETED

    # cancel cascades to a child
    define_workflow("long-leaf", steps=[s.wait("P1D")])
    define_workflow("long-parent", steps=[s.child("leaf", "long-leaf")])
    long_parent = start_workflow("long-parent")
    run_until_idle()
    cancel_run(long_parent.id, by="ops", reason="no longer needed")

    # a failed run retried
    broken = {"yes": True}

    def flaky(ctx: Any) -> str:
        if broken["yes"]:
            raise RuntimeError("the partner API is down")
        return "ok"

    define_workflow("flaky", steps=[s.wait("PT1M"), s.call("out", flaky), s.return_("ok")])
    flaky_run = start_workflow("flaky")
    clock.advance(minutes=1)
    run_until_idle()
    assert reload(flaky_run).status == RunStatus.FAILED
    broken["yes"] = False
    retry_run(flaky_run.id, by="ops", reason="fixed")
    run_until_idle()
    assert reload(flaky_run).status == RunStatus.COMPLETED

    # flow control: queued behind a full key, re-checked and parked again after
    # a limit change, admitted when the slot frees
    define_workflow(
        "one-at-a-time",
        concurrency=Limit(key="all", max=1),
        steps=[s.wait("PT1H"), s.return_("ok")],
    )
    lined_up = [start_workflow("one-at-a-time") for _ in range(3)]
    assert [reload(r).status for r in lined_up] == ["waiting", "queued", "queued"]
    set_flow_limit("one-at-a-time", max_active=1, by="ops", reason="same")
    clock.advance(seconds=OVERRIDE_TTL + 2)
    run_until_idle()  # checked again, parked again
    assert [reload(r).status for r in lined_up] == ["waiting", "queued", "queued"]
    clock.advance(hours=1)
    run_until_idle()
    clock.advance(hours=1)
    run_until_idle()
    clock.advance(hours=1)
    run_until_idle()
    assert [reload(r).status for r in lined_up] == ["completed"] * 3

    # compensation after a failure
    define_workflow(
        "trip",
        steps=[
            s.compute("flight", lambda ctx: "FL1", compensate=[s.wait("PT1M")]),
            s.wait("PT1M"),
            s.compute("payment", lambda ctx: 1 / 0),
        ],
    )
    trip = start_workflow("trip")
    clock.advance(minutes=1)
    run_until_idle()
    clock.advance(minutes=1)
    run_until_idle()
    assert reload(trip).status == RunStatus.FAILED and reload(trip).compensation

    # a queued run left for the rebuild's recheck, then the rebuild
    define_workflow("held", concurrency=Limit(key="k", max=1), steps=[s.wait("P1D")])
    start_workflow("held")
    start_workflow("held")
    rebuild_all()


def test_the_fold_and_the_scheduler_write_only_their_own_columns(registry, clock):
    recorder = Recorder()
    with connections[db.alias()].execute_wrapper(recorder):
        scenarios(clock, registry)
    writes = recorder.writes
    seen = {w.writer for w in writes if not w.fold} | {("fold", w.kind) for w in writes if w.fold}
    # the scenarios reach every writer this test knows of
    assert set(SCHEDULER) | set(KNOWN_VIOLATIONS) | {("fold", "insert"), ("fold", "update")} <= (
        seen
    ), seen

    scheduler = runs.SCHEDULER_COLUMNS | runs.PARKED_COLUMNS
    problems = []
    for write in writes:
        columns = set(write.columns)
        if write.kind == "insert":
            if not write.fold:
                problems.append(f"a run row inserted outside the fold: {write}")
        elif write.fold:
            lease = {c: write.columns[c] for c in columns & runs.SCHEDULER_COLUMNS}
            if any(value not in ("", None) for value in lease.values()):
                problems.append(f"the fold's write sets a lease {lease}: {write}")
        elif write.writer in KNOWN_VIOLATIONS:
            if not columns <= KNOWN_VIOLATIONS[write.writer] | scheduler:
                problems.append(f"a known violation writes more than it did: {write}")
        elif write.writer not in SCHEDULER:
            problems.append(f"an unknown writer of the run table: {write}")
        elif not columns <= scheduler:
            problems.append(f"the scheduler writes fold-owned {columns - scheduler}: {write}")
    assert problems == []


def test_every_declared_column_exists_and_every_run_event_has_a_handler():
    from kumiflow_django.store import names as ev

    assert set(runs.FOLD) == set(ev.RUN_EVENTS)
    columns = {f.column for f in WorkflowRun._meta.concrete_fields}
    assert columns >= runs.SCHEDULER_COLUMNS | runs.PARKED_COLUMNS
    assert "status" in runs.FOLD_COLUMNS and "version" in runs.FOLD_COLUMNS
