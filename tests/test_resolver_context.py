"""What a resolver sees: a read-only view of the segment, not the engine's state."""

from __future__ import annotations

from typing import Any

import pytest

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus

pytestmark = pytest.mark.django_db


def run(steps: list[Any], payload: dict[str, Any] | None = None) -> Any:
    define_workflow("wf", steps=steps)
    return start_workflow("wf", payload=payload or {})


def test_a_resolver_reads_the_trigger_the_steps_the_scope_and_the_run(registry):
    seen: dict[str, Any] = {}

    def look(ctx: Any) -> int:
        seen.update(
            tenant=ctx.tenant,
            workflow=ctx.run.workflow,
            attempt=ctx.attempt,
            item=ctx.scope["item"],
            a=ctx.steps["a"],
            wake=ctx.wake,
            now=ctx.now,
        )
        return int(ctx.scope["item"])

    r = run(
        [
            s.compute("a", lambda ctx: ctx.event.payload["n"]),
            s.for_each(lambda ctx: [7], "item", do=[s.compute("b", look)]),
            s.return_(lambda ctx: ctx.steps),
        ],
        {"n": 1},
    )
    assert r.status == RunStatus.COMPLETED
    assert r.result == {"a": 1, "b": 7}  # the read-only mapping stores as the object it shows
    assert seen["tenant"] == "default" and seen["workflow"] == "wf" and seen["attempt"] == 1
    assert seen["item"] == 7 and seen["a"] == 1 and seen["wake"].reason == "start" and seen["now"]


@pytest.mark.parametrize(
    "resolver",
    [
        pytest.param(lambda ctx: ctx.state, id="state"),
        pytest.param(lambda ctx: ctx.effects, id="effects"),
        pytest.param(lambda ctx: ctx.trail, id="trail"),
        pytest.param(lambda ctx: ctx._attempts, id="attempts"),
    ],
)
def test_the_engines_state_is_not_reachable(registry, resolver):
    r = run([s.compute("x", resolver)])
    assert r.status == RunStatus.FAILED
    assert "AttributeError" in r.last_error


def _set(mapping: Any, key: str, value: Any) -> None:
    mapping[key] = value


@pytest.mark.parametrize(
    "resolver",
    [
        pytest.param(lambda ctx: _set(ctx.steps, "a", 99), id="set-a-step-result"),
        pytest.param(lambda ctx: _set(ctx.scope, "item", 0), id="set-the-scope"),
        pytest.param(lambda ctx: setattr(ctx, "steps", {}), id="replace-steps"),
        pytest.param(lambda ctx: setattr(ctx, "event", None), id="replace-the-event"),
        pytest.param(lambda ctx: delattr(ctx, "run"), id="delete-the-run"),
    ],
)
def test_a_resolver_cannot_write_to_the_context(registry, resolver):
    r = run(
        [
            s.compute("a", lambda ctx: 1),
            s.for_each(lambda ctx: [1], "item", do=[s.compute("x", resolver)]),
            s.return_(lambda ctx: ctx.steps["a"]),
        ]
    )
    assert r.status == RunStatus.FAILED
    assert "does not support item assignment" in r.last_error or "read-only" in r.last_error
