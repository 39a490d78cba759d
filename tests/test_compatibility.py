"""The classification of a definition change for one run (a pure function):
``definition.compatibility.classify`` on canonical forms, no database.

The real runs of each kind of change are in tests/test_deploys.py; these
pin the rule's edges: what an executed step is compared on, what the
current step and its ancestors are, and what cannot be compared.
"""

from __future__ import annotations

from typing import Any

from kumiflow_django import on_event
from kumiflow_django import steps as s
from kumiflow_django.definition.compatibility import (
    Outcome,
    Position,
    Where,
    classify,
    step_prints,
)
from kumiflow_django.definition.workflow import define_workflow


def canonical(*steps: Any, **options: Any) -> dict[str, Any]:
    return define_workflow("w", steps=list(steps), register=False, **options).canonical()


def at(cursor: list[Any] | None, *trail: str) -> Position:
    return Position(cursor, trail)


def mail(subject: Any) -> Any:
    return s.mail_send(to="a@example.com", subject=subject, body="hello")


def test_the_same_definition_is_unchanged():
    old = canonical(s.wait("PT1H"))
    assert classify(old, canonical(s.wait("PT1H")), at([0])).outcome == Outcome.UNCHANGED


def test_every_step_has_a_print_by_its_path():
    prints = step_prints(canonical(s.branch(True, then=[s.wait("PT1H")]), s.return_(1)))
    assert list(prints) == ["0", "0.then.0", "1"]
    assert (prints["0.then.0"].kind, prints["1"].kind) == ("wait", "return")


def test_an_executed_steps_resolvers_are_left_out_but_not_its_static_arguments():
    old = canonical(mail(lambda ctx: "Helo"), s.wait("PT1H"))
    fixed = canonical(mail(lambda ctx: "Hello"), s.wait("PT1H"))
    assert classify(old, fixed, at([1], "0")).outcome == Outcome.COMPATIBLE
    # A literal in a resolver argument is a resolver too (evaluated when the step ran).
    literal = canonical(mail("Hello"), s.wait("PT1H"))
    assert classify(old, literal, at([1], "0")).outcome == Outcome.COMPATIBLE
    other_kind = canonical(s.compute("x", lambda c: 1), s.wait("PT1H"))
    found = classify(old, other_kind, at([1], "0"))
    assert found.outcome == Outcome.INCOMPATIBLE
    assert (found.differences[0].where, found.differences[0].change) == (Where.EXECUTED, "kind")


def test_a_static_argument_of_an_executed_step_counts():
    old = canonical(s.wait("PT1H"), s.wait("PT1H"))
    new = canonical(s.wait("PT2H"), s.wait("PT1H"))
    # ``until`` is wait's resolver argument: its value is left out once executed.
    assert classify(old, new, at([1], "0")).outcome == Outcome.COMPATIBLE
    old = canonical(s.append_event("s", "order.paid"), s.wait("PT1H"))
    new = canonical(s.append_event("s", "order.refunded"), s.wait("PT1H"))
    found = classify(old, new, at([1], "0"))
    assert found.outcome == Outcome.INCOMPATIBLE
    assert found.differences[0].change == "arguments"


def test_a_compensation_added_to_an_executed_step_counts():
    old = canonical(s.compute("a", lambda c: 1), s.wait("PT1H"))
    new = canonical(
        s.compute("a", lambda c: 1).compensated_by([s.compute("undo", lambda c: 0)]),
        s.wait("PT1H"),
    )
    found = classify(old, new, at([1], "0"))
    assert [(d.path, d.change) for d in found.differences] == [("0", "compensation")]


def test_the_current_step_is_compared_whole_resolvers_included():
    old = canonical(s.wait(lambda ctx: "PT1H"))
    new = canonical(s.wait(lambda ctx: "PT2H"))
    found = classify(old, new, at([0]))
    assert [(d.where, d.change) for d in found.differences] == [(Where.CURRENT, "resolvers")]
    assert "step 0 (the step the run is suspended in, wait): its resolvers changed" in (
        found.describe()
    )


def test_an_ancestor_is_compared_whole_and_steps_it_ran_inside_it_are_not_repeated():
    body = [s.compute("x", lambda c: 1), s.wait("PT1H")]
    old = canonical(s.for_each([1, 2], "i", body))
    new = canonical(s.for_each([1, 2], "i", [*body, s.compute("y", lambda c: 2)]))
    found = classify(old, new, at([0, "do", 1], "0.do.0"))
    assert [(d.path, d.where, d.change) for d in found.differences] == [
        ("0", Where.ANCESTOR, "steps below")
    ]


def test_an_arm_the_run_did_not_take_may_change():
    old = canonical(s.branch(True, then=[s.compute("t", lambda c: 1)]), s.wait("PT1H"))
    new = canonical(
        s.branch(True, then=[s.compute("t", lambda c: 1)], else_=[s.compute("e", lambda c: 2)]),
        s.wait("PT1H"),
    )
    assert classify(old, new, at([1], "0.then.0", "0")).outcome == Outcome.COMPATIBLE


def test_a_removed_step_the_run_executed_or_is_at_is_incompatible():
    old = canonical(s.compute("a", lambda c: 1), s.wait("PT1H"))
    found = classify(old, canonical(s.compute("a", lambda c: 1)), at([1], "0"))
    assert [(d.path, d.change) for d in found.differences] == [("1", "removed")]
    assert "is no longer in the definition" in found.describe()


def test_a_trigger_change_alone_is_compatible():
    old = canonical(s.wait("PT1H"))
    new = canonical(s.wait("PT1H"), trigger=on_event("go"))
    assert classify(old, new, at([0])).outcome == Outcome.COMPATIBLE


def test_what_cannot_be_compared_is_incompatible():
    new = canonical(s.wait("PT1H"))
    missing = classify({}, new, at([0]))
    assert missing.outcome == Outcome.INCOMPATIBLE
    assert "not stored" in missing.describe()
    old = canonical(s.wait("PT2H"))
    compensating = classify(old, new, at(["$compensate", 0]))
    assert "compensations" in compensating.describe()


def test_a_run_that_did_nothing_yet_is_compatible_with_any_steps():
    old = canonical(s.wait("PT1H"))
    new = canonical(s.compute("x", lambda c: 1), s.wait("PT2H"))
    assert classify(old, new, at(None)).outcome == Outcome.COMPATIBLE
