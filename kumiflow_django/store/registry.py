"""The shape every extension point shares: a named registry with ``isolated()``.

Step kinds, delivery kinds, call handlers, projections and workflows are
each one :class:`Registry` instance. Tests (yours too) change them inside
``with registry.isolated():``, which puts back what was there when the
block ends, instead of reaching into private dicts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ClassVar, Self


class Registry[T]:
    """Values registered under unique names."""

    #: What an entry is, for error messages ("step kind", "handler", ...).
    what: ClassVar[str] = "entry"

    def __init__(self) -> None:
        self._entries: dict[str, T] = {}

    # -- reading ---------------------------------------------------------
    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise LookupError(f"unknown {self.what} {name!r}") from None

    def find(self, name: str) -> T | None:
        return self._entries.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def values(self) -> list[T]:
        return list(self._entries.values())

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    # -- changing --------------------------------------------------------
    def add(self, name: str, value: T, *, replace: bool = False) -> T:
        """Register ``value`` as ``name``; a name taken by another value needs ``replace``."""
        existing = self._entries.get(name)
        if existing is not None and existing is not value and not replace:
            raise ValueError(f"{self.what} {name!r} is already registered ({existing!r})")
        self._entries[name] = value
        self.changed()
        return value

    def remove(self, name: str) -> None:
        if self._entries.pop(name, None) is not None:
            self.changed()

    def changed(self) -> None:
        """Called after every change: subclasses drop what they derived from the entries."""

    @contextlib.contextmanager
    def isolated(self, *, empty: bool = False) -> Iterator[Self]:
        """Changes inside the block are undone when it ends. With ``empty``, the
        block starts without any entry (the project's own come back after)."""
        saved = self._entries
        self._entries = {} if empty else dict(saved)
        self.changed()
        try:
            yield self
        finally:
            self._entries = saved
            self.changed()
