"""Correlating appended events with runs that wait for them.

A ``wait_for_event`` step's ``match`` relates paths of the awaited event
(``payload.order_id``, ``metadata.source``, ``stream_id``) to values
resolved from the run. The resolved values are stored on the suspension as
data and condensed into a correlation key, so an appended event finds its
waiting runs through an index instead of a scan.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kumiflow_django.models.event import Event

_TOP_LEVEL = ("stream_id", "stream_type")
_ROOTS = ("payload", "metadata")
_MISSING = object()


def check_path(path: Any) -> None:
    if not isinstance(path, str) or not path:
        raise ValueError(f"a match path must be a non-empty string, not {path!r}")
    parts = path.split(".")
    if path in _TOP_LEVEL:
        return
    if parts[0] not in _ROOTS or len(parts) < 2 or not all(parts):
        raise ValueError(
            f"match path {path!r} must be 'payload.<field>[.<field>…]', "
            f"'metadata.<field>…', 'stream_id' or 'stream_type'"
        )


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


def correlation_key(values: Mapping[str, Any]) -> str:
    """One indexable string for a set of (path, value) pairs."""
    text = json.dumps(sorted(values.items()), separators=(",", ":"), sort_keys=True)
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
    return all(value_at(event, path) == value for path, value in values.items())


def lookback(
    tenant: str, event_types: tuple[str, ...], values: Mapping[str, Any], after: int
) -> Event | None:
    """The first event of the tenant after position ``after`` that matches, if any."""
    from kumiflow_django.models.event import Event

    qs = Event.objects.filter(tenant_id=tenant, type__in=event_types, position__gt=after)
    for path, value in values.items():
        # Narrow in SQL where JSON equality is the same on every backend;
        # ``matches`` below decides.
        if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
            if path in _TOP_LEVEL:
                qs = qs.filter(**{path: value})
            else:
                qs = qs.filter(**{path.replace(".", "__"): value})
    for event in qs.order_by("position").iterator(chunk_size=100):
        if matches(event, values):
            return event
    return None


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
