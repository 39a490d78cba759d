"""Why a run cannot go on: the failure a segment ends with."""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kumiflow_django.store import db, limits
from kumiflow_django.store import payloads as pl
from kumiflow_django.store.values import clean_text


@dataclass
class Failure(Exception):
    """A segment failed; the run ends failed with this reason and text."""

    reason: str
    error: str
    cursor: list[Any] | None = None
    trail: list[str] | None = None
    #: A step failed: completed steps' compensations may run (not for a run
    #: that cannot go on at all: a changed definition, a lost trigger).
    compensable: bool = False
    #: The compensation outcome the run ends with, when it compensated.
    compensation: str | None = None
    # What the console shows of a step's failure (the failed segment is rolled
    # back: this object is all that is left of it when the runner records it).
    traceback: str | None = None
    steps: dict[str, Any] | None = None
    durations: dict[str, float] | None = None

    def __str__(self) -> str:
        return f"{self.reason}: {self.error}"

    def payload(self) -> pl.RunFailed:
        """The ``run-failed`` event's payload."""
        payload: pl.RunFailed = {
            "error": clean_text(self.error, 2000),
            "reason": self.reason,
            "trail": self.trail or [],
        }
        if self.cursor is not None:
            payload["cursor"] = self.cursor
        if self.compensation is not None:
            payload["compensation"] = self.compensation
        if self.traceback:
            payload["traceback"] = self.traceback
        if self.steps is not None:
            payload["steps"] = self.steps
        if self.durations:
            payload["durations"] = self.durations
        return payload


@contextmanager
def user_code(reason: str, what: str) -> Iterator[None]:
    """Run a start's user code (a trigger's filter, a key or an attribute
    resolver): whatever it raises fails the start as a :class:`Failure` of
    ``reason`` that names ``what``, SystemExit included, but a Ctrl-C and a
    transient database error (retried by the caller) go through."""
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        if db.is_transient(exc):
            raise
        raise Failure(reason, clean_text(f"{type(exc).__name__} {what}: {exc}", 600)) from exc


def capped_traceback(error: BaseException) -> str:
    """The traceback of ``error`` as text, at most ``limits.TRACEBACK`` characters:
    its start (the outermost frames) and its end (where it was raised, and the
    message) are kept, the middle is cut."""
    text = "".join(traceback.format_exception(error))
    cap = limits.TRACEBACK
    if len(text) > cap:
        cut = len(text) - cap
        note = f"\n… ({cut} characters of the traceback left out) …\n"
        head = cap // 4
        text = text[:head] + note + text[len(text) - (cap - head - len(note)) :]
    return clean_text(text, cap)


def capped_steps(steps: dict[str, Any]) -> dict[str, Any]:
    """The step results as a closing event keeps them: all of them when their JSON
    fits ``limits.CLOSING_STEPS`` bytes, else each one that still fits, in order,
    and a note in place of the others."""
    # The results are JSON already (each was checked when its step stored it).
    if len(_json(steps)) <= limits.CLOSING_STEPS:
        return dict(steps)
    kept: dict[str, Any] = {}
    room = limits.CLOSING_STEPS
    for name, value in steps.items():
        size = len(_json(value))
        if size + len(name) + 8 <= room:
            kept[name] = value
            room -= size + len(name) + 8
        else:
            kept[name] = f"… ({size} bytes, not kept)"
            room -= len(name) + 40
    return kept


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode()
