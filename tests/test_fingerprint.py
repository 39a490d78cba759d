"""The definition fingerprint (B11-B13) and what changes it."""

from __future__ import annotations

from kumiflow_django import define_workflow, on_event
from kumiflow_django import steps as s

LIMIT = 3


def build(event_type="x", extra=(), fn=None):
    return define_workflow(
        "fp",
        trigger=on_event(event_type),
        steps=[s.compute("a", fn or (lambda ctx: ctx.event.payload["n"] + 1)), *extra],
        register=False,
    )


def test_identical_definitions_hash_the_same_B11():
    assert build().fingerprint == build().fingerprint
    assert len(build().fingerprint) == 64


def test_adding_a_step_changes_it_B12():
    assert build().fingerprint != build(extra=[s.compute("noop", lambda ctx: None)]).fingerprint


def test_changing_the_trigger_changes_it_B13():
    assert build("x").fingerprint != build("y").fingerprint


def test_changing_a_resolvers_code_changes_it():
    assert (
        build(fn=lambda ctx: ctx.event.payload["n"] + 1).fingerprint
        != build(fn=lambda ctx: ctx.event.payload["n"] + 2).fingerprint
    )


def test_two_lambdas_on_one_line_are_told_apart():
    one = [s.compute("a", lambda ctx: 1), s.compute("b", lambda ctx: 2)]  # noqa: E501
    two = [s.compute("a", lambda ctx: 1), s.compute("b", lambda ctx: 3)]  # noqa: E501
    wf1 = define_workflow("fp2", steps=one, register=False)
    wf2 = define_workflow("fp2", steps=two, register=False)
    assert wf1.fingerprint != wf2.fingerprint


def test_a_constant_the_resolver_reads_is_part_of_it():
    def limited(ctx):
        return min(ctx.event.payload["n"], LIMIT)

    before = build(fn=limited).fingerprint
    global LIMIT
    LIMIT = 4
    try:
        assert build(fn=limited).fingerprint != before
    finally:
        LIMIT = 3


def test_a_changed_filter_changes_it():
    a = define_workflow("f", trigger=on_event("x", filter=lambda e: True), steps=[], register=False)
    b = define_workflow(
        "f", trigger=on_event("x", filter=lambda e: False), steps=[], register=False
    )
    assert a.fingerprint != b.fingerprint
