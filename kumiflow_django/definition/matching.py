"""Correlating appended events with runs that wait for them.

A ``wait_for_event`` step's ``match`` relates paths of the awaited event
(``payload.order_id``, ``metadata.source``, ``stream_id``) to values
resolved from the run. The resolved values are stored on the suspension as
data and condensed into a correlation key, so an appended event finds its
waiting runs through an index instead of a scan.

A path is data, never an ORM lookup: after the root, each part between dots
is a literal key of a JSON object (``payload.a__b``, ``payload.in`` and
``payload.0`` name the keys ``a__b``, ``in`` and ``0``), so a key cannot
contain a dot. Values are compared as JSON values, and the three places that
compare them agree: :func:`matches` (which decides), :func:`correlation_key`
(the live wake) and the SQL of :func:`lookback` (which only narrows).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import F, Q, QuerySet
from django.db.models.fields.json import KeyTransform

from kumiflow_django.store import db, sql
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import Event

_TOP_LEVEL = ("stream_id", "stream_type")
_ROOTS = ("payload", "metadata")
_MISSING = object()


#: Awaited "types" that stand for several event types: an awaited delivery
#: settles as delivered or dead, a task as completed or failed.
ALIASES: dict[str, tuple[str, ...]] = {
    ev.SETTLED: ev.OUTCOME_TYPES,
    ev.TASK_SETTLED: ev.TASK_OUTCOME_TYPES,
}


def event_types_for(awaited: str) -> tuple[str, ...]:
    """The event types that satisfy a wait for ``awaited``."""
    return ALIASES.get(awaited, (awaited,))


def awaited_as(event_type: str) -> list[str]:
    """The awaited types an event of ``event_type`` can satisfy."""
    return [event_type, *(alias for alias, types in ALIASES.items() if event_type in types)]


def check_path(path: Any) -> None:
    if not isinstance(path, str) or not path:
        raise ValueError(f"a match path must be a non-empty string, not {path!r}")
    if "\x00" in path or not _encodable(path):
        # PostgreSQL cannot store either in the run's awaited match (JSON).
        raise ValueError(f"match path {path!r} holds a NUL character or invalid Unicode")
    parts = path.split(".")
    if path in _TOP_LEVEL:
        return
    if parts[0] not in _ROOTS or len(parts) < 2 or not all(parts):
        raise ValueError(
            f"match path {path!r} must be 'payload.<field>[.<field>…]', "
            f"'metadata.<field>…', 'stream_id' or 'stream_type' (each field a non-empty key; "
            "a dot always separates two keys)"
        )


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def value_at(event: Any, path: str) -> Any:
    """The value at ``path`` in an event, or ``_MISSING``."""
    if path in _TOP_LEVEL:
        return getattr(event, path)
    root, *fields = path.split(".")
    value: Any = getattr(event, root)
    for field in fields:
        if not isinstance(value, Mapping) or field not in value:
            return _MISSING
        value = value[field]
    return value


def same_value(a: Any, b: Any) -> bool:
    """Whether two values are equal as JSON values.

    Numbers compare by value (``1`` matches ``1.0``: JSON has one number
    type), but a boolean is not a number (``True`` does not match ``1``, as
    Python's ``==`` would have it) and a string is not a number (``"1"``
    does not match ``1``). Objects and arrays compare item by item.
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return a is None and b is None


def _key_form(value: Any) -> Any:
    """``value`` with each number that equals an integer written as that integer,
    so two values have the same JSON text exactly when :func:`same_value`."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _key_form(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_key_form(v) for v in value]
    return value


def correlation_key(values: Mapping[str, Any]) -> str:
    """One indexable string for a set of (path, value) pairs: equal for two sets
    exactly when their values are :func:`same_value` path by path."""
    pairs = sorted((path, _key_form(value)) for path, value in values.items())
    text = json.dumps(pairs, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def keys_for_event(event: Any, path_sets: Iterable[tuple[str, ...]]) -> list[str]:
    """The correlation keys an event matches, one per set of paths some wait uses."""
    keys = []
    for paths in path_sets:
        values = {p: value_at(event, p) for p in paths}
        if all(v is not _MISSING for v in values.values()):
            keys.append(correlation_key(values))
    return keys


def matches(event: Any, values: Mapping[str, Any]) -> bool:
    for path, value in values.items():
        found = value_at(event, path)
        if found is _MISSING or not same_value(found, value):
            return False
    return True


#: How far below a cut-off position :func:`gaps_below` looks for transactions
#: still in flight. An event whose transaction stays open while more events
#: than this are appended by others is not seen by the look-back of a run
#: that started meanwhile (documented in docs/steps/wait_for_event.md).
GAP_WINDOW = 1000
#: Most gaps kept per run (the newest: in-flight positions are recent ones).
MAX_GAPS = 200


def gaps_below(position: int) -> list[int]:
    """Positions at or below ``position`` not visible now: their transactions
    are still open (or were rolled back, leaving a hole for good).

    On PostgreSQL and MariaDB a position is taken when the event is inserted,
    not when it commits: an event that commits after a run started can have
    a smaller position than the run's cut-off. The run keeps these gaps, and
    an event at one of them counts as after its start.
    """
    low = max(0, position - GAP_WINDOW)
    present = {row[0] for row in _positions(low, position)}
    gaps = [p for p in range(low + 1, position + 1) if p not in present]
    return gaps[-MAX_GAPS:]


#: The slots of :func:`_positions`' query, compiled once (``store.sql.values``).
_ABOVE = sql.Slot("above", Event._meta.get_field("position"))
_UP_TO = sql.Slot("up_to", Event._meta.get_field("position"))


def _positions(above: int, up_to: int) -> list[tuple[Any, ...]]:
    """The visible positions in ``(above, up_to]``: read at each start of a run
    that waits for events and at each event it takes, on the servers; the ORM
    building the query each time cost more than the database reading it."""
    return sql.values(
        "gaps-below",
        lambda: Event.objects.filter(position__gt=_ABOVE, position__lte=_UP_TO).values_list(
            "position"
        ),
        using=db.alias(),
        above=above,
        up_to=up_to,
    )


@dataclass(frozen=True, slots=True)
class Cutoff:
    """Where a wait starts looking in the log: events after position
    ``after``, and those at the ``gaps`` below it (their transactions were
    still open when the cut-off was taken: they commit later, yet count as
    after it)."""

    after: int
    gaps: tuple[int, ...] = ()

    @classmethod
    def of(
        cls,
        after: int,
        own_gaps: Sequence[int] | None,
        since_position: int,
        since_gaps: Sequence[int] | None,
    ) -> Cutoff:
        """The cut-off of a wait as the engine stores it: the wait's own gaps
        (an earlier wait of its chain took a later event), else, None, the
        run's start gaps when the wait looks back to the run's start."""
        if own_gaps is not None:
            return cls(after, tuple(own_gaps))
        return cls(after, tuple(since_gaps or ()) if after == since_position else ())

    def admits(self, position: int) -> bool:
        """Whether an event at ``position`` counts as after the cut-off."""
        return position > self.after or position in self.gaps


@dataclass(frozen=True, slots=True)
class Wait:
    """One wait for an event: the awaited type (or an alias, see
    :data:`ALIASES`), the run's tenant, the match values and the cut-off.

    Every check of whether an event satisfies a wait, live (the appender, a
    waiting branch, the woken step) or looking back in the log, asks this.
    """

    event_type: str
    tenant: str
    match: Mapping[str, Any]
    cutoff: Cutoff

    @property
    def event_types(self) -> tuple[str, ...]:
        return event_types_for(self.event_type)

    def accepts(self, event: Any) -> bool:
        """Whether ``event`` is one this wait takes."""
        return (
            event.type in self.event_types
            and event.tenant_id == self.tenant
            and self.cutoff.admits(event.position)
            and matches(event, self.match)
        )

    def lookback(self) -> Event | None:
        """The first event in the log this wait takes, if one is there already."""
        return lookback(
            self.tenant, self.event_types, self.match, self.cutoff.after, self.cutoff.gaps
        )


def lookback(
    tenant: str,
    event_types: tuple[str, ...],
    values: Mapping[str, Any],
    after: int,
    gaps: Collection[int] = (),
) -> Event | None:
    """The first event of the tenant after position ``after`` (or at one of the
    cut-off's ``gaps``) that matches, if any."""
    window = Q(position__gt=after)
    if gaps:
        window |= Q(position__in=sorted(gaps))
    qs: QuerySet[Event] = Event.objects.filter(window, tenant_id=tenant, type__in=event_types)
    text_json = db.json_compares_text(qs.db)
    for index, (path, value) in enumerate(sorted(values.items())):
        qs = _narrow(qs, index, path, value, text_json)
    for event in qs.order_by("position").iterator(chunk_size=100):
        if matches(event, values):
            return event
    return None


def _narrow(qs: QuerySet[Event], index: int, path: str, value: Any, text: bool) -> QuerySet[Event]:
    """``qs`` narrowed in SQL to the events whose ``path`` may hold ``value``.

    The SQL only narrows and must never drop a real match, so a path or a
    value the backend might compare otherwise than :func:`same_value` is
    left to :func:`matches` alone.
    """
    if path in _TOP_LEVEL:
        return qs.filter(**{path: value}) if isinstance(value, str) else qs
    if not _sql_comparable(value, text):
        return qs
    root, *keys = path.split(".")
    if not all(_literal_key(key) for key in keys):
        return qs
    expression: Any = F(root)
    for key in keys:
        expression = KeyTransform(key, expression)
    # An alias keeps the path out of the lookup syntax: ``a__b`` or ``in``
    # stay keys, and Django compares the key's JSON with ``value``'s.
    alias = f"_match_{index}"
    return qs.alias(**{alias: expression}).filter(**{alias: value})


def _literal_key(key: str) -> bool:
    """Whether every backend reads ``key`` in a KeyTransform as that object key."""
    try:
        int(key)
    except ValueError:
        pass
    else:
        return False  # Django turns it into an array index: ``$[0]``, ``-> 0``
    # SQLite and MariaDB compare a quoted path label with the key's *escaped*
    # text in the stored JSON: safe only for keys that JSON writes verbatim.
    return json.dumps(key) == f'"{key}"'


def _sql_comparable(value: Any, text: bool) -> bool:
    """Whether the backend's JSON equality holds wherever :func:`same_value` does."""
    if isinstance(value, bool):
        return True
    if isinstance(value, str):
        # MariaDB compares the escaped JSON text of strings too.
        return not text or json.dumps(value) == f'"{value}"'
    if isinstance(value, int | float):
        # MariaDB compares numbers as text: 1 would miss a stored 1.0.
        return not text and math.isfinite(value)
    return False  # None, objects, arrays: Python alone


def event_result(event: Event) -> dict[str, Any]:
    """What a ``wait_for_event`` step stores when its event arrives."""
    return {
        "timed_out": False,
        "type": event.type,
        "payload": event.payload,
        "metadata": event.metadata,
        "event_id": str(event.event_id),
        "position": event.position,
        "stream_id": event.stream_id,
        "created_at": event.created_at.isoformat(),
    }


def timeout_result(event_type: str) -> dict[str, Any]:
    return {"timed_out": True, "type": event_type, "payload": None}
