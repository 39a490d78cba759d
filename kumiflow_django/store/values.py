"""What a storable JSON value is, everywhere in kumiflow-django.

Every value that enters the log or a run (event payloads and metadata,
step results, run results, inputs, loop items, match values, dispatch
requests) passes :func:`to_json` where it enters, so a value that one of
the three databases would refuse is refused there, with a clear error,
instead of making a later write fail over and over:

- it must be JSON (Django's encoder: datetimes, decimals and UUIDs become
  strings); NaN and infinities are refused (PostgreSQL's jsonb has none);
- no NUL character and no lone surrogate in any string or key (PostgreSQL
  refuses both in jsonb, and a surrogate cannot be encoded as UTF-8);
- at most :data:`MAX_DEPTH` levels of nesting (MariaDB's ``JSON_VALID``
  refuses 32; the engine nests values a few levels deeper in run state);
- at most ``KUMIFLOW_MAX_VALUE_BYTES`` bytes of UTF-8 JSON (MariaDB's
  default packet is 16 MiB; a run's state holds many values).
"""

from __future__ import annotations

import itertools
import json
import re
from types import MappingProxyType
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from kumiflow_django.conf import settings
from kumiflow_django.store.errors import InvalidEvent

#: Deepest nesting of a value (objects and arrays). The engine wraps values
#: in up to ten more levels (event payload, state, steps, loops, branches),
#: and MariaDB refuses documents nested 32 deep.
MAX_DEPTH = 20

# A ``\u0000`` escape that is not itself an escaped backslash followed by "u0000".
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_DEPTH_CHANGE = {"[": 1, "{": 1, "]": -1, "}": -1}


class _Encoder(DjangoJSONEncoder):
    """Django's encoder, and the read-only mappings resolvers see
    (``ctx.steps``, ``ctx.scope``) as the objects they show."""

    def default(self, o: Any) -> Any:
        if isinstance(o, MappingProxyType):
            return dict(o)
        return super().default(o)


def to_json(
    value: Any,
    what: str,
    *,
    max_bytes: int | None = None,
    setting: str = "KUMIFLOW_MAX_VALUE_BYTES",
) -> Any:
    """``value`` as it reads back from a JSON column; InvalidEvent when it cannot be stored.

    ``max_bytes`` defaults to ``KUMIFLOW_MAX_VALUE_BYTES``; ``setting`` names the limit.
    """
    if value is None or type(value) is bool:
        return value  # reads back as itself, in 5 bytes at most
    if type(value) is int and -_SHORT_INT < value < _SHORT_INT:
        limit = max_value_bytes() if max_bytes is None else max_bytes
        if limit >= _SHORT_INT_BYTES:  # else the full check says how long it is
            return value
    text = dump(value, what, max_bytes=max_bytes, setting=setting)
    return json.loads(text)


#: Integers of fewer than 16 digits (17 bytes of JSON with a sign) read back as
#: themselves: a step's counter or id is returned without a round of JSON.
_SHORT_INT = 10**16
_SHORT_INT_BYTES = 17


def dump(
    value: Any,
    what: str,
    *,
    max_bytes: int | None = None,
    setting: str = "KUMIFLOW_MAX_VALUE_BYTES",
) -> str:
    """The compact JSON text of a storable value (see the module docstring);
    ``setting`` names the limit in the error."""
    try:
        text = json.dumps(
            value, cls=_Encoder, allow_nan=False, ensure_ascii=False, separators=(",", ":")
        )
    except RecursionError:
        raise InvalidEvent(f"{what} is nested too deeply (at most {MAX_DEPTH} levels)") from None
    except (TypeError, ValueError) as exc:
        raise InvalidEvent(f"{what} is not JSON-serialisable: {exc}") from exc
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidEvent(f"{what} contains a lone surrogate character") from None
    if "\\u0000" in text and _NUL.search(text):
        raise InvalidEvent(f"{what} contains a NUL character (\\x00), which databases refuse")
    limit = max_value_bytes() if max_bytes is None else max_bytes
    if size > limit:
        raise InvalidEvent(
            f"{what} is {size} bytes of JSON, more than the limit of {limit} ({setting})"
        )
    if text.count("[") + text.count("{") > MAX_DEPTH and depth(text) > MAX_DEPTH:
        raise InvalidEvent(f"{what} is nested too deeply (at most {MAX_DEPTH} levels)")
    return text


def depth(text: str) -> int:
    """The nesting depth of a JSON text (brackets inside strings do not count)."""
    structure = _STRING.sub("", text)
    changes = (_DEPTH_CHANGE.get(c, 0) for c in structure)
    return max(itertools.accumulate(changes, initial=0))


def max_value_bytes() -> int:
    return int(settings.MAX_VALUE_BYTES)


def clean_text(text: str, limit: int) -> str:
    """An error or reason text that every database stores: NUL characters and lone
    surrogates replaced, cut to ``limit`` characters. For texts the engine writes
    about failures (exception messages may quote the very value that was refused)."""
    cleaned = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"
