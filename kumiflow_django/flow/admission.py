"""Admission: whether a run (or a task attempt) may become active now.

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

Admitting is the caller's next write (the run or attempt becomes active in
the same transaction), so a rolled-back admission takes no slot.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from kumiflow_django.flow.models import FlowKey, FlowLimit, RateBucket
from kumiflow_django.store import clock, db, sql
from kumiflow_django.store.db import for_update
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.flow")

CONCURRENCY = "concurrency"
RATE = "rate"
DEBOUNCE = "debounce"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Hold:
    """Why an item is not admitted, and until when (None: until a slot frees)."""

    why: str
    until: datetime | None
    detail: str


@dataclass(frozen=True)
class Admission:
    """What :func:`admit` decided: admitted (``hold`` None) or held, and why."""

    hold: Hold | None
    #: Admitted with nothing parked behind its key: an item that also ends in
    #: this transaction (which holds the key's lock until it commits) need not
    #: wake anything.
    quiet: bool = False


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


class Gate(Protocol):
    """How admission counts and wakes the items of one kind (runs, task attempts).

    ``wake`` returns how many it woke, and whether it found every parked item
    (fewer than it looked for, read without a lock): only then may the key's
    count of parked items go back to zero."""

    kind: str

    def active(self, scope: str, key: str) -> int: ...

    def wake(self, scope: str, key: str, n: int) -> tuple[int, bool]: ...

    def woken(self, scope: str, key: str) -> int:
        """Items woken and not admitted yet: a slot is theirs (only the sweep asks)."""
        ...


@dataclass
class Pending:
    """A run admitted in this transaction whose row is not written yet: it
    counts as active for starts nested in its segment (an event it appends).
    ``quiet`` stays true while nothing parks behind its key in the meantime."""

    scope: str
    key: str
    quiet: bool = True
    #: Its row is written: the count of active rows has it from now on.
    written: bool = False


_pending: contextvars.ContextVar[tuple[Pending, ...]] = contextvars.ContextVar(
    "kumiflow_flow_pending", default=()
)


def pending_count(scope: str, key: str) -> int:
    return sum(1 for p in _pending.get() if (p.scope, p.key) == (scope, key) and not p.written)


@contextlib.contextmanager
def admitted_until_written(entry: Pending | None) -> Iterator[None]:
    """Count ``entry`` as active until its run's segment is written (or not)."""
    if entry is None:
        yield
        return
    token = _pending.set((*_pending.get(), entry))
    try:
        yield
    finally:
        _pending.reset(token)


def _parked_behind(scope: str, key: str) -> None:
    for entry in _pending.get():
        if (entry.scope, entry.key) == (scope, key):
            entry.quiet = False


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
    running attempt) has its key's row (the invariant, written in
    :func:`kumiflow_django.flow.gates.unkeyed`). So a new key admits without
    counting: one statement for a per-run key.

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


def window_of(now: datetime, period: timedelta) -> datetime:
    """The start of the fixed window (aligned to the epoch) that holds ``now``."""
    step = int(period.total_seconds() * 1_000_000)
    elapsed = int((now - _EPOCH).total_seconds() * 1_000_000)
    return _EPOCH + timedelta(microseconds=elapsed - elapsed % step)


# -- admission --------------------------------------------------------------


def admit(
    gate: Gate,
    concurrency: Concurrency | None,
    rate: RateSpec | None,
    *,
    new: bool,
    now: datetime | None = None,
) -> Admission:
    """Whether the item may become active now (the caller makes it so in this
    transaction); else why not, and until when.

    ``new``: the item was never parked (a start, a first attempt): it queues
    behind the key's parked items instead of overtaking them.
    """
    now = now or clock.now()
    flow_key: FlowKey | None = None
    held_before = 0
    if concurrency is not None:
        limit = max_active(concurrency.scope, concurrency.max)
        flow_key, created = lock_key(gate.kind, concurrency.scope, concurrency.key)
        held_before = flow_key.held
        # A new key has nothing active (see lock_key): nothing to count.
        free = limit if created else limit - gate.active(concurrency.scope, concurrency.key)
        if free > 0 and new and flow_key.held:
            # Wake those in line first; take a slot only if they leave one.
            woken, everyone = gate.wake(concurrency.scope, concurrency.key, free)
            flow_key.held = 0 if everyone else max(0, flow_key.held - woken)
            free -= woken
        if free <= 0:
            flow_key.held += 1
            _save_held(gate.kind, flow_key, held_before)
            _parked_behind(concurrency.scope, concurrency.key)
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


def release(gate: Gate, concurrency: Concurrency, *, recheck: bool = False) -> int:
    """An item of the key stopped being active (in this transaction): wake as
    many parked items as there are free slots. Returns how many were woken.

    ``recheck``: the sweep's look at a key with parked items, whatever its row
    says (a count of parked items that is too low, a row that is missing)."""
    flow_key: FlowKey | None
    if recheck:
        flow_key, _ = lock_key(gate.kind, concurrency.scope, concurrency.key)
    else:
        flow_key = for_update(
            FlowKey.objects.filter(kind=gate.kind, scope=concurrency.scope, key=concurrency.key)
        ).first()
    if flow_key is None or not (flow_key.held or recheck):
        return 0
    free = max_active(concurrency.scope, concurrency.max) - gate.active(
        concurrency.scope, concurrency.key
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
