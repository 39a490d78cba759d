"""Who did an operator action and why: checked once, stored in the event it appends.

Every operator action (cancel, wake, retry, redeliver, fire now, enable,
disable) takes ``by`` and ``reason`` keywords. Both are optional for code
that calls the functions itself; the console always gives the operator.
They go into the payload of the event the action appends (``by`` also into
its ``created_by``), so the log itself says who did what and why.
"""

from __future__ import annotations

import re
from typing import Any

from kumiflow_django.store import limits
from kumiflow_django.store.errors import InvalidEvent

# Control characters other than a newline and a tab, and lone surrogates.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def check_operator(by: object, reason: object) -> tuple[str, str]:
    """``(by, reason)`` as stored: strings that fit their limits; a reason may
    span lines (``\\r\\n`` becomes ``\\n``). InvalidEvent otherwise."""
    if not isinstance(by, str):
        raise InvalidEvent(f"by must be a string, not {type(by).__name__}")
    if not isinstance(reason, str):
        raise InvalidEvent(f"reason must be a string, not {type(reason).__name__}")
    by = by.strip()
    reason = reason.replace("\r\n", "\n").replace("\r", "\n").strip()
    if len(by) > limits.OPERATOR:
        raise InvalidEvent(f"by is longer than {limits.OPERATOR} characters: {by[:40]!r}…")
    if len(reason) > limits.OPERATOR_REASON:
        raise InvalidEvent(
            f"reason is longer than {limits.OPERATOR_REASON} characters: {reason[:40]!r}…"
        )
    for what, text in (("by", by), ("reason", reason)):
        if _CONTROL.search(text) or (what == "by" and ("\n" in text or "\t" in text)):
            raise InvalidEvent(f"{what} contains a control character: {text[:40]!r}")
    return by, reason


def audited(payload: dict[str, Any], by: str, reason: str) -> dict[str, Any]:
    """``payload`` with the operator and the reason, each only when given."""
    if by:
        payload["by"] = by
    if reason:
        payload["reason"] = reason
    return payload
