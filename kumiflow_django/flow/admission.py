"""Flow control's rules, for runs and task attempts alike.

Everything is decided in the caller's transaction, under a row lock of the
key (``FlowKey``), so "at most N per key" holds across any number of
workers and processes:

- **concurrency**: the active items of the key are *counted* under the lock
  (no counter that a lost release could leave wrong). A full key parks the
  item (``wake_at``/``next_attempt_at`` NULL, ``held_by="concurrency"``) and
  adds it to the key's ``held`` count; whoever frees a slot (an item that
  ends, :func:`release`) wakes the first parked items in order of priority
  and start. A new item that finds parked ones queues behind them.
- **rate**: a fixed window per key (``RateBucket``), locked and counted;
  beyond the rate the item waits for the next window (a timer): nothing is
  dropped.

The one interface, for both kinds: an :class:`Item` (a run being started, a
queued run that is due, a task attempt about to start) is admitted by
:func:`admit`, which answers with an :class:`Admission` (and parks the row
of an item that has one); :func:`release` gives back the slot of an item
that stopped being active; :func:`take` makes an item active without
asking (``retry_run``, an operator's decision). What "active" and "parked"
mean for each kind is :mod:`kumiflow_django.flow.gates`'s; the safety net
under the wakes is :class:`StrandedSweep`; the invariant the count relies
on is :func:`violations`.

Admitting is the caller's next write (the run or attempt becomes active in
the same transaction), so a rolled-back admission takes no slot. Locks are
taken in the package's order (docs/architecture.md): a key's row after the
run and task rows, several keys in sorted order, then rate buckets.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Exists, OuterRef

from kumiflow_django.definition.durations import isoformat, parse_duration
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.flow.gates import (
    ACTIVE,
    CONCURRENCY,
    DEBOUNCE,
    RATE,
    RUNS,
    TASKS,
    Gate,
)
from kumiflow_django.flow.models import FlowKey, FlowLimit, RateBucket
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.projections.tasks import StepTask
from kumiflow_django.store import clock, db, sql
from kumiflow_django.store.db import for_update
from kumiflow_django.store.telemetry import get_logger

__all__ = [
    "CONCURRENCY",
    "DEBOUNCE",
    "RATE",
    "Admission",
    "Concurrency",
    "Hold",
    "Item",
    "RateSpec",
    "StrandedSweep",
    "Unwritten",
    "admit",
    "counted_until_written",
    "hold_text",
    "holds_slot",
    "lock_batch",
    "lock_bucket",
    "lock_key",
    "release",
    "take",
    "violations",
    "wake_stranded",
    "written",
]

logger = get_logger("kumiflow_django.flow")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: A run whose workflow lost its limit keeps its key: every parked run is woken.
UNLIMITED = 2**31 - 1


# -- what is admitted, and what admission says ---------------------------------


@dataclass(frozen=True)
class Concurrency:
    scope: str
    key: str
    max: int


@dataclass(frozen=True)
class RateSpec:
    scope: str
    key: str
    limit: int
    period: timedelta


@dataclass(frozen=True)
class Hold:
    """Why an item is not admitted, and until when (None: until a slot frees)."""

    why: str
    until: datetime | None
    detail: str

    def payload(self) -> dict[str, Any]:
        """As ``run-started`` records it (``flow.held``)."""
        held: dict[str, Any] = {"why": self.why}
        if self.until is not None:
            held["until"] = isoformat(self.until)
        if self.detail:
            held["detail"] = self.detail
        return held


@dataclass(frozen=True)
class Admission:
    """What :func:`admit` decided: admitted (``hold`` None) or held, and why."""

    hold: Hold | None
    #: Admitted with nothing parked behind its key: an item that also ends in
    #: this transaction (which holds the key's lock until it commits) need not
    #: wake anything.
    quiet: bool = False


@dataclass(frozen=True)
class Item[R: (WorkflowRun, StepTask)]:
    """A run or a task attempt as flow control sees it: its kind, its row
    (None: a run being started, whose row its start writes), its limits."""

    gate: Gate[R]
    pk: Any
    row: R | None
    concurrency: Concurrency | None
    rate: RateSpec | None

    @property
    def new(self) -> bool:
        """Never parked behind its key (a start, a first attempt, a debounced
        or rate-held run): it queues behind the key's parked items instead
        of overtaking them."""
        return self.row is None or self.row.held_by != CONCURRENCY

    @staticmethod
    def run_start(
        run_id: uuid.UUID, workflow: Workflow, flow: Mapping[str, Any]
    ) -> Item[WorkflowRun]:
        """A run being started, with the keys its ``run-started`` records."""
        return Item(
            RUNS,
            run_id,
            None,
            _run_concurrency(workflow, flow.get("scope", ""), flow.get("key", "")),
            _run_rate(workflow, flow.get("rate_key", "")),
        )

    @staticmethod
    def run(run: WorkflowRun, workflow: Workflow | None = None) -> Item[WorkflowRun]:
        """A run with a row; ``workflow``: the definition a queued run starts on
        (by default the one it runs on, else its workflow's current one)."""
        if workflow is None and (run.flow_key or run.rate_key):
            workflow = registry.find(run.workflow, run.workflow_version or None)
            if workflow is None and registry.is_registered(run.workflow):
                workflow = registry.get(run.workflow)
        return Item(
            RUNS,
            run.id,
            run,
            _run_concurrency(workflow, run.flow_scope, run.flow_key),
            _run_rate(workflow, run.rate_key) if workflow is not None else None,
        )

    @staticmethod
    def attempt(task: StepTask) -> Item[StepTask]:
        """A task's next attempt, with the limits its ``task.requested`` recorded."""
        flow = task.flow or {}
        concurrency = None
        if task.flow_key and "max" in flow:
            concurrency = Concurrency(task.flow_scope, task.flow_key, int(flow["max"]))
        rate = None
        if flow.get("rate"):
            r = flow["rate"]
            rate = RateSpec(r["scope"], r["key"], int(r["limit"]), parse_duration(r["per"]))
        return Item(TASKS, task.id, task, concurrency, rate)


def scope_of(workflow: Workflow) -> str:
    """The scope a workflow's concurrency key counts in (default: its name)."""
    limit = workflow.concurrency
    return (limit.scope if limit is not None else None) or workflow.name


def _rate_scope_of(workflow: Workflow) -> str:
    rate = workflow.rate
    return (rate.scope if rate is not None else None) or workflow.name


def _run_concurrency(workflow: Workflow | None, scope: str, key: str) -> Concurrency | None:
    if not key:
        return None
    limit = workflow.concurrency if workflow is not None else None
    return Concurrency(scope, key, limit.max if limit is not None else UNLIMITED)


def _run_rate(workflow: Workflow, key: str) -> RateSpec | None:
    rate = workflow.rate
    if rate is None or not key:
        return None
    return RateSpec(_rate_scope_of(workflow), key, rate.limit, rate.period)


# -- runs admitted in this transaction whose row is not written yet ---------------


@dataclass(frozen=True)
class Unwritten:
    """A run admitted in this transaction whose row is not written yet: it
    counts as active for starts nested in its segment (an event it appends).
    ``quiet``: nothing parked behind its key since (replaced, never changed,
    when something does)."""

    run_id: uuid.UUID
    scope: str
    key: str
    quiet: bool = True


_unwritten: contextvars.ContextVar[tuple[Unwritten, ...]] = contextvars.ContextVar(
    "kumiflow_flow_unwritten", default=()
)


def unwritten(item: Item[WorkflowRun], admitted: Admission) -> Unwritten | None:
    """What to count until the admitted run's row is written (None: nothing)."""
    if admitted.hold is not None or item.concurrency is None:
        return None
    quiet = admitted.quiet and item.row is None
    return Unwritten(item.pk, item.concurrency.scope, item.concurrency.key, quiet)


@contextlib.contextmanager
def counted_until_written(entry: Unwritten | None) -> Iterator[None]:
    """Count ``entry`` as active until its run's segment is written (or not)."""
    if entry is None:
        yield
        return
    _unwritten.set((*_unwritten.get(), entry))
    try:
        yield
    finally:
        _drop(entry.run_id)


def written(run_id: uuid.UUID) -> bool:
    """The run's row is written (counted from it now): stop counting it.
    Returns whether it was still quiet."""
    found = [entry for entry in _unwritten.get() if entry.run_id == run_id]
    _drop(run_id)
    return bool(found) and found[0].quiet


def _drop(run_id: uuid.UUID) -> None:
    entries = _unwritten.get()
    if any(entry.run_id == run_id for entry in entries):
        _unwritten.set(tuple(entry for entry in entries if entry.run_id != run_id))


def _unwritten_count(gate: Gate[Any], scope: str, key: str) -> int:
    if gate is not RUNS:
        return 0
    return sum(1 for entry in _unwritten.get() if (entry.scope, entry.key) == (scope, key))


def _parked_behind(gate: Gate[Any], scope: str, key: str) -> None:
    entries = _unwritten.get()
    if gate is RUNS and any((e.scope, e.key) == (scope, key) and e.quiet for e in entries):
        _unwritten.set(
            tuple(
                replace(e, quiet=False) if (e.scope, e.key) == (scope, key) else e for e in entries
            )
        )


def _active(gate: Gate[Any], scope: str, key: str) -> int:
    """The key's active items: rows, and runs admitted here not written yet."""
    return gate.active(scope, key) + _unwritten_count(gate, scope, key)


# -- operator overrides -------------------------------------------------------

#: Overrides are read once per this many seconds per process (and at once in
#: the process that changes them): an admission costs no extra query.
OVERRIDE_TTL = 5.0
_overrides: dict[str, tuple[int | None, int | None]] = {}
_overrides_read = [float("-inf")]
_overrides_lock = threading.Lock()


def forget_overrides() -> None:
    with _overrides_lock:
        _overrides_read[0] = float("-inf")


def _override(scope: str) -> tuple[int | None, int | None]:
    with _overrides_lock:
        if time.monotonic() - _overrides_read[0] > OVERRIDE_TTL:
            rows = FlowLimit.objects.values_list("scope", "max_active", "rate_limit")
            _overrides.clear()
            _overrides.update({s: (m, r) for s, m, r in rows})
            _overrides_read[0] = time.monotonic()
        return _overrides.get(scope, (None, None))


def max_active(scope: str, declared: int) -> int:
    """The limit in force: the operator's override, else the declared one."""
    override = _override(scope)[0]
    return override if override is not None else declared


def rate_limit(scope: str, declared: int) -> int:
    override = _override(scope)[1]
    return override if override is not None else declared


# -- locks ------------------------------------------------------------------


def lock_key(kind: str, scope: str, key: str) -> tuple[FlowKey, bool]:
    """The key's row, locked until the transaction ends, and whether it is new.

    A new row means nothing of the key is active: every active run (or
    running attempt) has its key's row (the invariant, :func:`violations`).
    So a new key admits without counting: one statement for a per-run key.

    The loop is no retry of a failed statement (``store/db.retrying`` is for
    those): both statements succeed, and the row may only have gone between
    them (an idle key purged). It runs in the caller's transaction, where a
    lost lock conflict could not be run again anyway."""
    for _ in range(5):
        now = clock.now()
        values = {"kind": kind, "scope": scope, "key": key, "held": 0, "created_at": now}
        if sql.insert_if_absent(FlowKey, values, using=db.alias()):
            return FlowKey(kind=kind, scope=scope, key=key, held=0, created_at=now), True
        row = for_update(FlowKey.objects.filter(kind=kind, scope=scope, key=key)).first()
        if row is not None:
            return row, False
        # deleted between the two statements (an idle key purged): insert again
    raise RuntimeError(f"could not lock flow key {kind} {scope!r}/{key!r}")


def lock_bucket(scope: str, key: str, window: datetime) -> RateBucket:
    """The key's bucket, locked until the transaction ends (created if missing).

    As in :func:`lock_key`, the loop only inserts again a row that went
    between the insert and the lock: no error is retried."""
    for _ in range(5):
        fresh = {
            "scope": scope,
            "key": key,
            "window_start": window,
            "count": 0,
            "skipped": 0,
            "skipped_positions": [],
        }
        if sql.insert_if_absent(RateBucket, fresh, using=db.alias()):
            return for_update(RateBucket.objects.filter(scope=scope, key=key)).get()
        row = for_update(RateBucket.objects.filter(scope=scope, key=key)).first()
        if row is not None:
            return row
    raise RuntimeError(f"could not lock rate bucket {scope!r}/{key!r}")


def lock_batch(items: Iterable[Item[Any]], now: datetime) -> None:
    """Lock the keys, then the rate buckets, of a batch of items about to be
    admitted, each in sorted order: the order one admission takes them in."""
    keys = set()
    buckets = set()
    for item in items:
        if item.concurrency is not None:
            keys.add((item.gate.kind, item.concurrency.scope, item.concurrency.key))
        if item.rate is not None:
            buckets.add((item.rate.scope, item.rate.key, window_of(now, item.rate.period)))
    for kind, scope, key in sorted(keys):
        lock_key(kind, scope, key)  # (a new row is locked as it is inserted)
    for scope, key, window in sorted(buckets):
        lock_bucket(scope, key, window)


def window_of(now: datetime, period: timedelta) -> datetime:
    """The start of the fixed window (aligned to the epoch) that holds ``now``."""
    step = int(period.total_seconds() * 1_000_000)
    elapsed = int((now - _EPOCH).total_seconds() * 1_000_000)
    return _EPOCH + timedelta(microseconds=elapsed - elapsed % step)


# -- admission, release ---------------------------------------------------------


def admit(item: Item[Any], *, now: datetime | None = None) -> Admission:
    """Whether the item may become active now (the caller makes it so in this
    transaction); else why not, and until when. An item with a row is parked
    when it is held (and told it is not any more when it is admitted); a run
    being started is recorded held by its ``run-started``."""
    if item.concurrency is None and item.rate is None:
        return Admission(None, quiet=True)
    decided = _decide(item.gate, item.concurrency, item.rate, new=item.new, now=now)
    if item.row is not None:
        if decided.hold is None:
            item.gate.admitted(item.row)
        else:
            item.gate.park(item.row, decided.hold.why, decided.hold.until)
    return decided


def _decide(
    gate: Gate[Any],
    concurrency: Concurrency | None,
    rate: RateSpec | None,
    *,
    new: bool,
    now: datetime | None,
) -> Admission:
    now = now or clock.now()
    flow_key: FlowKey | None = None
    held_before = 0
    if concurrency is not None:
        limit = max_active(concurrency.scope, concurrency.max)
        flow_key, created = lock_key(gate.kind, concurrency.scope, concurrency.key)
        held_before = flow_key.held
        # A new key has nothing active (see lock_key): nothing to count.
        free = limit if created else limit - _active(gate, concurrency.scope, concurrency.key)
        if free > 0 and new and flow_key.held:
            # Wake those in line first; take a slot only if they leave one.
            woken, everyone = gate.wake(concurrency.scope, concurrency.key, free)
            flow_key.held = 0 if everyone else max(0, flow_key.held - woken)
            free -= woken
        if free <= 0:
            flow_key.held += 1
            _save_held(gate.kind, flow_key, held_before)
            _parked_behind(gate, concurrency.scope, concurrency.key)
            return Admission(
                Hold(
                    CONCURRENCY,
                    None,
                    f"{concurrency.scope} key {concurrency.key!r}: {limit} active (the limit)",
                )
            )
        _save_held(gate.kind, flow_key, held_before)
    quiet = flow_key is None or not flow_key.held
    if rate is not None:
        limit = rate_limit(rate.scope, rate.limit)
        window = window_of(now, rate.period)
        bucket = lock_bucket(rate.scope, rate.key, window)
        if bucket.window_start != window:
            bucket.window_start, bucket.count = window, 0
        if bucket.count >= limit:
            bucket.save(update_fields=["window_start", "count"])
            until = window + rate.period
            return Admission(
                Hold(RATE, until, f"{rate.scope} key {rate.key!r}: {limit} per window")
            )
        bucket.count += 1
        bucket.save(update_fields=["window_start", "count"])
    return Admission(None, quiet=quiet)


def _save_held(kind: str, flow_key: FlowKey, before: int) -> None:
    if flow_key.held != before:
        FlowKey.objects.filter(kind=kind, scope=flow_key.scope, key=flow_key.key).update(
            held=flow_key.held
        )


def take(item: Item[Any]) -> None:
    """The item becomes active without admission (``retry_run``: it takes its
    slot at once, an operator's decision): like every active item, its key
    has its row (the invariant, :func:`violations`)."""
    if item.concurrency is not None:
        lock_key(item.gate.kind, item.concurrency.scope, item.concurrency.key)


def holds_slot(run: WorkflowRun) -> bool:
    """Whether the run, as its row is before its end, holds a slot of its key
    or was given one (woken, not admitted yet): only then does its end free
    one. A run parked behind its key holds nothing, and its end takes no key
    lock: a waker holding the key waits for the parked rows it wakes."""
    if run.status in ACTIVE:
        return True
    return run.status == RunStatus.QUEUED and run.held_by == CONCURRENCY and run.wake_at is not None


def release(item: Item[Any], *, recheck: bool = False) -> int:
    """The item stopped being active (in this transaction): wake as many
    parked items of its key as there are free slots. Returns how many were
    woken.

    ``recheck``: the sweep's look at a key with parked items, whatever its row
    says (a count of parked items that is too low, a row that is missing)."""
    concurrency, gate = item.concurrency, item.gate
    if concurrency is None:
        return 0
    flow_key: FlowKey | None
    if recheck:
        flow_key, _ = lock_key(gate.kind, concurrency.scope, concurrency.key)
    else:
        flow_key = for_update(
            FlowKey.objects.filter(kind=gate.kind, scope=concurrency.scope, key=concurrency.key)
        ).first()
    if flow_key is None or not (flow_key.held or recheck):
        return 0
    free = max_active(concurrency.scope, concurrency.max) - _active(
        gate, concurrency.scope, concurrency.key
    )
    if recheck:
        free -= gate.woken(concurrency.scope, concurrency.key)
    if free <= 0:
        return 0
    before = flow_key.held
    woken, everyone = gate.wake(concurrency.scope, concurrency.key, free)
    flow_key.held = 0 if everyone else max(0, before - woken)
    _save_held(gate.kind, flow_key, before)
    return woken


# -- the safety net ---------------------------------------------------------------

#: Parked items the sweep reads per pass (each pass goes on where the last stopped).
SWEEP_BATCH = 500


class StrandedSweep:
    """The safety net under the wakes: parked runs and attempts whose key has
    a free slot.

    A parked item waits for the end of an active item of its key, and nothing
    else looks at it: a wake that was lost (a release that did not run, a
    count of parked items that is too low, an attempt a release passed over
    because another transaction held it, SKIP LOCKED) would leave it parked
    for good. Each pass reads the next :data:`SWEEP_BATCH` parked runs,
    newest start first (the status index: queued rows only, never the
    finished ones), and up to as many parked attempts (the due index: no
    next attempt time), and checks each of their keys once, under the key's
    lock, as a release does: free slots wake the first in line; an item
    parked behind an active one stays parked."""

    def __init__(self) -> None:
        #: Where the next pass over the runs starts (None: from the newest parked run).
        self.after: datetime | None = None

    def __call__(self, limit: int = SWEEP_BATCH) -> int:
        parked = RUNS.parked_rows()
        if self.after is not None:
            parked = parked.filter(started_at__lte=self.after)
        # Newest first, the order of the status index (status, -started_at).
        rows = list(
            parked.order_by("-started_at").values_list(
                "pk", "started_at", "flow_scope", "flow_key"
            )[:limit]
        )
        if len(rows) < limit:
            self.after = None  # a full lap: the next pass starts again from the newest
        else:
            last = rows[-1][1]
            # A batch of one instant moves on past it (else it would be read again and again).
            self.after = last if last != self.after else last - timedelta(microseconds=1)
        woken = 0
        for pk in _first_of_each_key((pk, scope, key) for pk, _, scope, key in rows):
            with db.atomic():
                run = WorkflowRun.objects.filter(pk=pk).first()
                if run is not None:
                    woken += release(Item.run(run), recheck=True)
        if woken:
            logger.warning("flow control: woke %d parked run(s) whose key had a free slot", woken)
        tasks = 0
        attempts = TASKS.parked_rows().values_list("id", "flow_scope", "flow_key")[:limit]
        for pk in _first_of_each_key(attempts):
            with db.atomic():
                task = StepTask.objects.filter(pk=pk).first()
                if task is not None:
                    tasks += release(Item.attempt(task), recheck=True)
        if tasks:
            logger.warning(
                "flow control: woke %d parked task attempt(s) whose key had a free slot", tasks
            )
        return woken + tasks


def _first_of_each_key(rows: Iterable[tuple[Any, str, str]]) -> list[Any]:
    first: dict[tuple[str, str], Any] = {}
    for pk, scope, key in rows:
        if key:
            first.setdefault((scope, key), pk)
    return list(first.values())


def wake_stranded(limit: int = SWEEP_BATCH) -> int:
    """One pass of :class:`StrandedSweep` from the newest parked run."""
    return StrandedSweep()(limit)


# -- the invariant ------------------------------------------------------------------


def violations() -> list[str]:
    """The invariant flow control relies on, for runs and task attempts,
    written once; each way it is broken, in words (none: it holds).

    1. Every active limited item (a run from its admission to its end, a
       running attempt) has its key's row: a key without its row is taken
       for a new one, and admits without counting.
    2. A key's ``held`` is at least the number of items parked behind it (an
       upper bound: too high only costs a look; too low, and the release
       that should wake them does not look).
    3. A key with parked items is at its limit: its active items and those
       woken (a slot is theirs) fill it. Else nothing wakes them but the
       sweep: they are stranded. (Checked where the limit is known: a run's
       workflow defined in this process.)

    Counted at READ COMMITTED outside any admission, when no transaction
    that admits or releases is under way (the tests call it between steps)."""
    found: list[str] = []
    for gate in (RUNS, TASKS):
        keyed = FlowKey.objects.filter(
            kind=gate.kind, scope=OuterRef("flow_scope"), key=OuterRef("flow_key")
        )
        unkeyed = gate.active_rows().exclude(flow_key="").filter(~Exists(keyed))
        for scope, key in sorted(set(unkeyed.values_list("flow_scope", "flow_key"))):
            found.append(f"{gate.kind} {scope!r}/{key!r}: active without its key's row")
        parked = (
            gate.parked_rows()
            .exclude(flow_key="")
            .order_by()
            .values("flow_scope", "flow_key")
            .annotate(n=Count("pk"))
            .values_list("flow_scope", "flow_key", "n")
        )
        for scope, key, n in sorted(parked):
            row = FlowKey.objects.filter(kind=gate.kind, scope=scope, key=key).first()
            held = row.held if row is not None else 0
            if held < n:
                found.append(f"{gate.kind} {scope!r}/{key!r}: {n} parked, its row says {held}")
            first = gate.parked_rows().filter(flow_scope=scope, flow_key=key).first()
            concurrency = _item(first).concurrency if first is not None else None
            if concurrency is None or concurrency.max == UNLIMITED:
                continue  # its workflow is not defined here: its limit is not known
            limit = max_active(scope, concurrency.max)
            taken = gate.active(scope, key) + gate.woken(scope, key)
            if taken < limit:
                found.append(
                    f"{gate.kind} {scope!r}/{key!r}: {n} parked, {taken} of {limit} slots taken"
                )
    return found


def _item(row: WorkflowRun | StepTask) -> Item[Any]:
    return Item.run(row) if isinstance(row, WorkflowRun) else Item.attempt(row)


# -- for people -----------------------------------------------------------------------


def hold_text(run: WorkflowRun, now: datetime) -> str:
    """Why a queued run is not running yet, for people."""
    if run.held_by == CONCURRENCY:
        if run.wake_at is not None:
            return f"a slot of {run.flow_scope} key {run.flow_key!r} freed: it starts next"
        return f"waits for a slot: {run.flow_scope} key {run.flow_key!r} is at its limit"
    if run.held_by == RATE:
        when = isoformat(run.wake_at) if run.wake_at else "the next window"
        return f"rate of key {run.rate_key!r} used up: waits for {when}"
    if run.held_by == DEBOUNCE:
        when = isoformat(run.wake_at) if run.wake_at else "?"
        return f"debounced (key {run.debounce_key!r}): starts at {when} unless more events come"
    return ""
