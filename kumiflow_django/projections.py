"""User projections: read models kept from the log, in the appending transaction.

``define_projection(name, handlers={event_type: fn})`` registers handlers
that run for every appended event of those types (``"*"`` for every type)
through the ``event_appended`` signal, in the transaction that appends it.
``kumiflow_rebuild`` calls ``reset()`` and replays the log through them.
A handler that raises makes the append fail: the projection is part of the
write. The workflow triggers are such projections too (not rebuilt: the runs
they started are in the log).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kumiflow_django.eventstore import handled_types
from kumiflow_django.models.event import Event

Handler = Callable[[Event], Any]


@dataclass(frozen=True)
class Projection:
    name: str
    handlers: Mapping[str, Handler]
    reset: Callable[[], Any] | None = None
    rebuildable: bool = True
    types: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "types", frozenset(self.handlers))

    def handle(self, event: Event) -> None:
        handler = self.handlers.get(event.type) or self.handlers.get("*")
        if handler is not None:
            handler(event)


_PROJECTIONS: dict[str, Projection] = {}
_by_type: dict[str, list[Projection]] | None = None


def define_projection(
    name: str,
    handlers: Mapping[str, Handler],
    *,
    reset: Callable[[], Any] | None = None,
    replace: bool = False,
) -> Projection:
    """Register a projection; ``reset`` empties its tables before a rebuild."""
    global _by_type
    if not isinstance(name, str) or not name:
        raise ValueError(f"a projection needs a name, not {name!r}")
    if name in _PROJECTIONS and not replace:
        raise ValueError(f"projection {name!r} is already defined")
    if not handlers or not all(callable(h) for h in handlers.values()):
        raise ValueError(f"projection {name!r} needs handlers: {{event_type: function}}")
    projection = Projection(name, dict(handlers), reset)
    _PROJECTIONS[name] = projection
    _by_type = None
    return projection


def remove_projection(name: str) -> None:
    global _by_type
    _PROJECTIONS.pop(name, None)
    _by_type = None


def projections() -> list[Projection]:
    return list(_PROJECTIONS.values())


def handles_event_type(event_type: str) -> bool:
    return any(event_type in p.types for p in _PROJECTIONS.values())


handled_types.add_source(handles_event_type)


def apply_live(event: Event) -> None:
    global _by_type
    if _by_type is None:
        index: dict[str, list[Projection]] = {}
        for projection in _PROJECTIONS.values():
            for event_type in projection.types:
                index.setdefault(event_type, []).append(projection)
        _by_type = index
    for projection in _by_type.get(event.type, ()):
        projection.handle(event)
    for projection in _by_type.get("*", ()):
        if event.type not in projection.types:
            projection.handle(event)
