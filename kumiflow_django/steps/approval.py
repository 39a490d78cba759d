"""``approval``: wait for a person's decision, with declared choices and fields.

An approval is a ``wait_for_event`` (the same kind: its look-back, timeout,
matching and wake-up) for the engine's ``approval-decided`` event on the
run's own stream, naming this approval. ``decide_approval`` appends that
event after checking the choice and the fields against the declaration; the
console's inbox lists the runs that wait at one. The step's result is the
wait's: ``ctx.steps[name]["payload"]`` holds ``choice``, ``fields``, ``by``
and ``reason``; ``{"timed_out": True, ...}`` after ``timeout``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kumiflow_django.definition.approvals import spec
from kumiflow_django.definition.context import ResolverContext
from kumiflow_django.definition.step import Resolver, Step
from kumiflow_django.store import names as ev


def run_stream(ctx: ResolverContext) -> str:
    """The run's own stream id: the decision is appended there."""
    return str(ctx.run.id)


def approval(
    name: str,
    *,
    choices: Sequence[str] = ("approve", "decline"),
    fields: Mapping[str, type | str] | None = None,
    timeout: Resolver = None,
    permission: str | None = None,
) -> Step:
    """Wait until a person decides ``name``: one of ``choices``, with the
    optional ``fields`` (name -> ``str``, ``int`` or ``bool``). ``permission``
    (``"app_label.codename"``) is what a decider needs besides
    ``kumiflow.decide_approval_workflowrun``."""
    return Step(
        "wait_for_event",
        name,
        {
            "event_type": ev.APPROVAL_DECIDED,
            "match": {"stream_id": run_stream, "payload.approval": name},
            "timeout": timeout,
            "approval": spec(name, choices, fields, permission),
        },
    )
