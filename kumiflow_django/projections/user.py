"""User projections: read models kept from the log, in the appending transaction.

``define_projection(name, handlers={event_type: fn})`` registers handlers
that run for every appended event of those types (``"*"`` for every type)
through the ``event_appended`` signal, in the transaction that appends it.
``kumiflow_rebuild`` calls ``reset()`` and replays the log through them.
A handler that raises makes the append fail: the projection is part of the
write. So does one that catches a database error and goes on (the
transaction cannot: Django marked it for rollback). The workflow triggers
are such projections too (not rebuilt: the runs they started are in the
log).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kumiflow_django.store import db
from kumiflow_django.store.log import handled_types
from kumiflow_django.store.models import Event
from kumiflow_django.store.registry import Registry

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
        if handler is None:
            return
        handler(event)
        # A handler that caught a database error of its own and went on has
        # left the transaction marked for rollback: the append's savepoint
        # would be rolled back silently and the append look written. It fails
        # with that error instead (in a segment: a refusal, with its cause).
        broken = db.transaction_broken()
        if broken is not None:
            raise broken


class Projections(Registry[Projection]):
    """Every user projection by name, with an index by event type."""

    what = "projection"

    def __init__(self) -> None:
        super().__init__()
        self._by_type: dict[str, list[Projection]] | None = None

    def changed(self) -> None:
        self._by_type = None

    def for_type(self, event_type: str) -> list[Projection]:
        """The projections that handle ``event_type``: by name, then those of ``"*"``."""
        if self._by_type is None:
            index: dict[str, list[Projection]] = {}
            for projection in self.values():
                for handled in projection.types:
                    index.setdefault(handled, []).append(projection)
            self._by_type = index
        named = self._by_type.get(event_type, [])
        catch_all = [p for p in self._by_type.get("*", []) if event_type not in p.types]
        return named + catch_all

    def handles_event_type(self, event_type: str) -> bool:
        """Whether a projection names this type (``"*"`` does not count)."""
        return any(event_type in projection.types for projection in self.values())


#: The one registry of user projections.
projections = Projections()
handled_types.add_source(projections.handles_event_type)


def define_projection(
    name: str,
    handlers: Mapping[str, Handler],
    *,
    reset: Callable[[], Any] | None = None,
    replace: bool = False,
) -> Projection:
    """Register a projection; ``reset`` empties its tables before a rebuild."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a projection needs a name, not {name!r}")
    if name in projections and not replace:
        raise ValueError(f"projection {name!r} is already defined")
    if not handlers or not all(callable(h) for h in handlers.values()):
        raise ValueError(f"projection {name!r} needs handlers: {{event_type: function}}")
    return projections.add(name, Projection(name, dict(handlers), reset), replace=True)


def remove_projection(name: str) -> None:
    projections.remove(name)


def apply_live(event: Event) -> None:
    """Run every projection that handles ``event``, in the appending transaction."""
    for projection in projections.for_type(event.type):
        projection.handle(event)
