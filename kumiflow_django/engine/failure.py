"""Why a run cannot go on: the failure a segment ends with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

    def __str__(self) -> str:
        return f"{self.reason}: {self.error}"

    def payload(self) -> dict[str, Any]:
        """The ``run-failed`` event's payload."""
        payload: dict[str, Any] = {
            "error": clean_text(self.error, 2000),
            "reason": self.reason,
            "trail": self.trail or [],
        }
        if self.cursor is not None:
            payload["cursor"] = self.cursor
        if self.compensation is not None:
            payload["compensation"] = self.compensation
        return payload
