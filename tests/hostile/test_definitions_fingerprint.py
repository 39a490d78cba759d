"""Definition values and the fingerprint: refused when a process cannot render
them the same way as the next one, accepted (and stable) otherwise.

A run is stamped with its definition's fingerprint and resumed by any worker
process; a value rendered by a ``repr`` that holds a memory address gives
every process another fingerprint, and every resume elsewhere fails with
``workflow_definition_changed``. Such a value is refused when the workflow is
defined, with the workflow, the step path and the argument in the message.
See also ``tests/test_fingerprint.py`` for the cross-process check.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.db.models import F, Q

from kumiflow_django import define_workflow, on_event
from kumiflow_django import steps as s
from kumiflow_django.store.errors import WorkflowDefinitionError
from testproject.shop.models import Order

URL = "https://hooks.example.com/in"


class Plain:
    """No ``__repr__``: ``<…Plain object at 0x7f…>``."""


class AddressRepr:
    def __repr__(self) -> str:
        return f"<AddressRepr at {hex(id(self))}>"


class NamedRepr:
    """A stable repr, but no value the fingerprint knows how to render."""

    def __repr__(self) -> str:
        return "NamedRepr()"


class LocalZone(dt.tzinfo):
    """A tzinfo without ``__repr__``: a datetime's repr shows its address."""

    def utcoffset(self, when: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(hours=1)

    def dst(self, when: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(0)

    def tzname(self, when: dt.datetime | None) -> str:
        return "LOCAL"


@dataclasses.dataclass(frozen=True)
class Limits:
    low: int
    high: Any


class Color(enum.Enum):
    RED = "red"


def first(x: Any, ctx: Any) -> Any:
    return x


def body(value: Any) -> list[Any]:
    return [s.webhook_send(URL, body=value)]


BODY = r"step 0 \(webhook_send\), argument 'body'"

# (steps, the step path and argument the error names)
REFUSED = [
    pytest.param(body(object()), BODY + ": <object object at 0x", id="object()"),
    pytest.param(body(Plain()), BODY + ": <.*Plain object at 0x", id="no-repr"),
    pytest.param(body(AddressRepr()), BODY + ": <AddressRepr at 0x", id="repr-with-address"),
    pytest.param(body(NamedRepr()), BODY + r": NamedRepr\(\) \(a NamedRepr\)", id="other"),
    pytest.param(
        body({"nested": [1, {"deep": object()}]}),
        BODY + r"\['nested'\]\[1\]\['deep'\]: ",
        id="nested-object",
    ),
    pytest.param(body({Plain(): 1}), BODY + r" \(a key\): ", id="object-key"),
    pytest.param(body({1, Plain()}), BODY + "{…}: ", id="object-in-set"),
    pytest.param(body(Limits(1, object())), BODY + r"\.high: ", id="dataclass-field"),
    pytest.param(
        body(dt.datetime(2030, 1, 1, tzinfo=LocalZone())), BODY + ": datetime", id="odd-tzinfo"
    ),
    pytest.param(
        [s.read.find_many("rows", Order, Q(status=object()))],
        r"step 0 \(read.find_many\), argument 'filter'",
        id="object-in-Q",
    ),
    pytest.param(
        [s.compute("a", functools.partial(first, object()))],
        r"step 0 \(compute\), argument 'fn' \(a partial's arguments\)",
        id="partial-of-object",
    ),
    pytest.param(
        [s.for_each([1], "i", do=[s.branch(True, then=body(object()))])],
        r"step 0\.do\.0\.then\.0 \(webhook_send\), argument 'body'",
        id="nested-step",
    ),
]


@pytest.mark.parametrize(("steps", "where"), REFUSED)
def test_a_value_without_stable_text_is_refused_at_definition_time(steps, where):
    with pytest.raises(WorkflowDefinitionError, match=rf"^workflow 'hostile', {where}") as error:
        define_workflow("hostile", steps=steps, register=False)
    assert "every process" in str(error.value) or "use strings" in str(error.value)


def test_a_trigger_filter_bound_to_an_object_by_partial_is_refused():
    with pytest.raises(WorkflowDefinitionError, match=r"^workflow 'hostile', trigger: "):
        define_workflow(
            "hostile",
            trigger=on_event("x", filter=functools.partial(first, Plain())),
            steps=[],
            register=False,
        )


def recursive() -> Any:
    def countdown(ctx: Any, n: int = 3) -> int:
        return 0 if n == 0 else countdown(ctx, n - 1)

    return countdown


class Greeter:
    def greet(self, ctx: Any) -> str:
        return "hi"


def closure_over_object() -> Any:
    thing = Plain()
    return lambda ctx: thing


# Each builds its steps afresh: two builds hold different objects (different
# addresses), and must give the same fingerprint.
ACCEPTED = [
    # Bound objects enter by their type's name, never by their repr.
    pytest.param(
        lambda: [s.compute("a", lambda ctx, o=Plain(): o)],  # noqa: B008 - the point
        id="default-arg-object",
    ),
    pytest.param(lambda: [s.compute("a", closure_over_object())], id="closure-over-object"),
    pytest.param(lambda: [s.compute("a", Greeter().greet)], id="bound-method"),
    pytest.param(lambda: [s.compute("a", recursive())], id="recursive-function"),
    pytest.param(lambda: [s.call("n", len, [1])], id="builtin"),
    pytest.param(lambda: [s.compute("a", functools.partial(first, 1))], id="partial"),
    pytest.param(lambda: body(Color.RED), id="enum"),
    pytest.param(lambda: body([Decimal("1.10"), uuid.UUID(int=1)]), id="decimal-uuid"),
    pytest.param(lambda: body(dt.datetime(2030, 1, 1, tzinfo=dt.UTC)), id="aware-datetime"),
    pytest.param(lambda: body([dt.date(2030, 1, 1), dt.timedelta(hours=1)]), id="date-timedelta"),
    pytest.param(lambda: body(frozenset({"a", "b", "c"})), id="frozenset"),
    pytest.param(lambda: body(Limits(1, (2, 3))), id="dataclass"),
    pytest.param(
        lambda: [s.read.find_many("r", Order, Q(status__in={"a", "b"}) | ~Q(id=F("pk")))],
        id="Q-with-set-and-F",
    ),
    pytest.param(lambda: [s.read.find_many("r", "shop.Order")], id="model-label"),
]


@pytest.mark.parametrize("build", ACCEPTED)
def test_a_stable_value_is_accepted_and_fingerprints_the_same_each_time(build):
    one = define_workflow("stable", steps=build(), register=False)
    two = define_workflow("stable", steps=build(), register=False)
    assert one.fingerprint == two.fingerprint


def test_a_primitive_default_argument_is_part_of_the_fingerprint():
    """``lambda ctx, limit=LIMIT: …`` binds the value like a closure does."""
    one = define_workflow("d", steps=[s.compute("a", _limited(3))], register=False)
    two = define_workflow("d", steps=[s.compute("a", _limited(4))], register=False)
    assert one.fingerprint != two.fingerprint


def _limited(limit: int) -> Any:
    return lambda ctx, limit=limit: limit  # the same source and no closure: only the default
