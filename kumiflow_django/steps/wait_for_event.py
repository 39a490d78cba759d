"""``wait_for_event``: suspend until a matching event is appended, or a timeout.

Before suspending, the step looks back in the log: an event appended after
the run started but before it reached the wait is found, not lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kumiflow_django.definition import matching
from kumiflow_django.definition.approvals import check_spec
from kumiflow_django.definition.context import Context, WakeReason, state_part
from kumiflow_django.definition.durations import check_when, to_deadline
from kumiflow_django.definition.step import (
    Resolver,
    Step,
    StepKind,
    check_resolver,
    register_step_kind,
    resolve,
)
from kumiflow_django.steps.control import EventWait, Suspend
from kumiflow_django.store import db
from kumiflow_django.store import names as ev
from kumiflow_django.store.log import check_event_type
from kumiflow_django.store.values import to_json


class WaitForEventKind(StepKind):
    kind = "wait_for_event"
    suspends = True

    def validate(self, step: Step) -> None:
        event_type = step.args["event_type"]
        if not isinstance(event_type, str) or not event_type.strip():
            raise ValueError(f"wait_for_event needs an event type, not {event_type!r}")
        check_event_type(event_type, internal=True)
        if event_type == ev.APPROVAL_DECIDED and "approval" not in step.args:
            # Only a declared approval waits for a decision: a plain wait would
            # be listed in the inbox with nothing to decide, or watch another
            # run's decisions.
            raise ValueError(
                f"wait for {ev.APPROVAL_DECIDED} with steps.approval(...), which declares "
                "its choices and fields"
            )
        match = step.args["match"]
        if not isinstance(match, Mapping):
            raise ValueError("wait_for_event match must be a mapping of paths to values")
        for path, value in match.items():
            matching.check_path(path)
            check_resolver(value, f"match value of {path!r}")
        if step.args["timeout"] is not None:
            check_when(step.args["timeout"])
            check_resolver(step.args["timeout"], "timeout")
        if "approval" in step.args:
            check_spec(step.args["approval"])

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        event_type = step.args["event_type"]
        # Sequential waits of one branch take events one after the other; each
        # branch of a parallel step keeps its own count.
        taken = f"{ctx.branch}{event_type}" if ctx.branch else event_type
        if resume is not None:
            wake = ctx.wake
            if wake is not None and wake.reason == WakeReason.EVENT and wake.event is not None:
                took(ctx, taken, wake.event.position)
                return matching.event_result(wake.event)
            return matching.timeout_result(event_type)
        values = {
            p: to_json(resolve(v, ctx), f"match value of {p!r}")
            for p, v in step.args["match"].items()
        }
        after, own_gaps = cutoff(ctx, taken)
        found = matching.Wait(
            event_type,
            ctx.tenant,
            values,
            matching.Cutoff.of(after, own_gaps, ctx.since_position, ctx.since_gaps),
        ).lookback()
        if found is not None:
            took(ctx, taken, found.position)
            return matching.event_result(found)
        timeout = step.args["timeout"]
        timeout_at = None if timeout is None else to_deadline(resolve(timeout, ctx), ctx.now)
        wait = EventWait(
            event_type=event_type,
            match=values,
            correlation_key=matching.correlation_key(values),
            timeout_at=timeout_at,
            after=after,
            gaps=own_gaps,
        )
        raise Suspend(wait, path)

    def describe(self, step: Step) -> str:
        if "approval" in step.args:
            return f"approval {step.args['approval']['name']}"
        return f"wait for {step.args['event_type']}"


def cutoff(ctx: Context, taken: str) -> tuple[int, tuple[int, ...] | None]:
    """(after, gaps) of the next wait in the chain ``taken``: events after
    ``after``, and those at the ``gaps`` below it, have not been taken yet.
    Gaps None: the run's start gaps (nothing taken yet, or a run whose state
    predates gaps per wait)."""
    consumed = ctx.state["consumed"]
    if taken not in consumed:
        return ctx.since_position, None
    after = max(ctx.since_position, consumed[taken])
    own = state_part(ctx.state, "consumed_gaps").get(taken)
    if own is None:  # taken before gaps were kept per wait
        return after, None if after == ctx.since_position else ()
    return after, tuple(own)


def took(ctx: Context, taken: str, position: int) -> None:
    """Record that the chain ``taken`` took the event at ``position``.

    Positions are taken at insert, not at commit: when this event is above
    the cut-off, events below it may still be in flight (inserted earlier,
    not committed yet). They become the next wait's gaps, as the run's start
    keeps its own, so that a later commit is not passed over. An event taken
    at a gap leaves the cut-off where it is and the gap is closed.
    """
    after, gaps = cutoff(ctx, taken)
    known = set(matching.Cutoff.of(after, gaps, ctx.since_position, ctx.since_gaps).gaps)
    if position > after:
        if not db.one_writer_at_a_time():  # else nothing is in flight beside this writer
            known |= {g for g in matching.gaps_below(position) if g > after}
        after = position
    known.discard(position)
    ctx.state["consumed"][taken] = after
    state_part(ctx.state, "consumed_gaps")[taken] = sorted(known)[-matching.MAX_GAPS :]


def wait_for_event(
    event_type: str,
    *,
    match: Mapping[str, Resolver] | None = None,
    timeout: Resolver = None,
    name: str | None = None,
) -> Step:
    """Suspend until an event of ``event_type`` of the run's tenant whose fields
    equal ``match`` is appended; its result is stored under ``name`` (default:
    the event type): ``{"timed_out": False, "type", "payload", ...}``, or
    ``{"timed_out": True, ...}`` after ``timeout``."""
    return Step(
        "wait_for_event",
        name or event_type,
        {"event_type": event_type, "match": dict(match or {}), "timeout": timeout},
    )


register_step_kind(WaitForEventKind())
