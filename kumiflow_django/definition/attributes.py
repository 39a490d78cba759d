"""Search attributes: business values a run carries, indexed for finding it.

``define_workflow(attributes={"customer": lambda ctx: ...})`` names them and
how each is resolved at the start; ``steps.set_attributes(...)`` changes them
later. Names and values are checked here, when a workflow is defined and
again when a value is resolved, against the widths of the index table
(``store.limits``), so that the database never sees a value it could not
store: the same limits on every database.

A value is a string, an integer or a boolean; ``None`` removes the
attribute. The index stores it as text (``True`` as ``"true"``, ``17`` as
``"17"``): a filter compares text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from kumiflow_django.definition.step import check_resolver
from kumiflow_django.store import limits

AttributeValue = str | int | bool | None

MAX_NAME = limits.ATTRIBUTE_NAME
MAX_VALUE = limits.ATTRIBUTE_VALUE
MAX_PER_RUN = limits.ATTRIBUTES_PER_RUN
#: Integers the text index and JSON agree on in every database (a JavaScript
#: reader of the API, too): 53 bits.
MAX_INT = 2**53 - 1

#: Lower case: names that differ only in case would be one name to an index
#: whose collation ignores case (MariaDB's).
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def check_name(name: Any) -> str:
    """An attribute name: identifier-like (``customer``, ``order_total``), at
    most MAX_NAME characters; ValueError otherwise."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"a search attribute name must be lower-case identifier-like (a-z, digits, _; "
            f"not starting with a digit), not {name!r:.80}"
        )
    if len(name) > MAX_NAME:
        raise ValueError(
            f"a search attribute name has at most {MAX_NAME} characters ({name[:40]}…: {len(name)})"
        )
    return name


def check_value(name: str, value: Any) -> AttributeValue:
    """A resolved attribute value the index can store; ValueError otherwise."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            raise ValueError(
                f"search attribute {name!r}: {value} is outside ±{MAX_INT} (2**53 - 1)"
            )
        return value
    if isinstance(value, str):
        if not value:
            raise ValueError(f"search attribute {name!r}: the empty string (use None to remove)")
        if len(value) > MAX_VALUE:
            raise ValueError(
                f"search attribute {name!r}: a value has at most {MAX_VALUE} characters "
                f"({value[:40]!r}…: {len(value)})"
            )
        if "\x00" in value:
            raise ValueError(f"search attribute {name!r}: a value must not contain NUL")
        return value
    raise ValueError(
        f"search attribute {name!r} must be a string, an integer, a boolean or None, "
        f"not {type(value).__name__}"
    )


def as_text(value: str | int | bool) -> str:
    """How the index stores a value (and how a filter's value compares)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def check_declared(attributes: Any, what: str = "attributes") -> dict[str, Any]:
    """``attributes`` of ``define_workflow`` or ``set_attributes``: a mapping of
    names to resolvers (a value, or a function of the context)."""
    if not isinstance(attributes, Mapping):
        raise ValueError(f"{what} must be a mapping of names to values or functions")
    if len(attributes) > MAX_PER_RUN:
        raise ValueError(f"{what}: at most {MAX_PER_RUN} search attributes ({len(attributes)})")
    checked: dict[str, Any] = {}
    for name, resolver in attributes.items():
        check_name(name)
        if callable(resolver) and not isinstance(resolver, type):
            check_resolver(resolver, f"search attribute {name!r}")
        else:
            check_value(name, resolver)
        checked[name] = resolver
    return checked


def resolve_all(attributes: Mapping[str, Any], view: Any) -> dict[str, AttributeValue]:
    """Each attribute's value for ``view`` (a resolver context), checked."""
    out: dict[str, AttributeValue] = {}
    for name, resolver in attributes.items():
        value = (
            resolver(view) if callable(resolver) and not isinstance(resolver, type) else resolver
        )
        out[name] = check_value(name, value)
    return out


def merged(
    current: Mapping[str, Any], changes: Mapping[str, AttributeValue]
) -> dict[str, str | int | bool]:
    """The run's attributes after ``changes`` (None removes one)."""
    out = dict(current)
    for name, value in changes.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


def parse_filter(text: str) -> tuple[str, str]:
    """``name:value`` (the admin's ``?attr=``) as (name, value text); ValueError
    naming what is wrong."""
    name, sep, value = text.partition(":")
    if not sep:
        raise ValueError(f"an attribute filter is name:value, not {text!r:.80}")
    check_name(name)
    if not value or len(value) > MAX_VALUE:
        raise ValueError(f"an attribute filter's value has 1 to {MAX_VALUE} characters")
    return name, value


Resolvers = Mapping[str, Callable[[Any], Any] | AttributeValue]
