"""``child``: start another workflow as a child run, and (by default) wait for it.

The child run is created in the parent's segment (its own stream and row,
linked to the parent and to the root of the tree) and runs on the resume
loop once that commits. With ``wait=True`` the parent suspends until the
child ends; the child's result is the step's, or its failure fails the
step (``on_failure="fail"``) or becomes its result (``"result"``). With
``wait=False`` the step's result is the child's run id and the parent goes
on. Cancelling the parent cancels the child (``on_parent_cancel="cancel"``)
or leaves it running (``"abandon"``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from kumiflow_django.definition.context import ChildRequest, Context, state_part
from kumiflow_django.definition.step import (
    Resolver,
    Step,
    StepKind,
    check_resolver,
    compensated,
    path_text,
    register_step_kind,
    resolve,
)
from kumiflow_django.steps.control import ChildWait, Suspend
from kumiflow_django.store import errors, limits
from kumiflow_django.store.deprecation import moved_names
from kumiflow_django.store.errors import InvalidEvent
from kumiflow_django.store.log import check_text
from kumiflow_django.store.values import to_json

ON_FAILURE = ("fail", "result")
ON_PARENT_CANCEL = ("cancel", "abandon")


class ChildKind(StepKind):
    kind = "child"
    resolver_args = ("input", "idempotency_key")
    suspends = True

    def validate(self, step: Step) -> None:
        super().validate(step)
        a = step.args
        if not step.name:
            raise ValueError("a child step needs a name for its result")
        workflow = a["workflow"]
        if not isinstance(workflow, str) or not 0 < len(workflow) <= limits.WORKFLOW_NAME:
            raise ValueError(f"a child step names its workflow by name, not {workflow!r}")
        if a["on_failure"] not in ON_FAILURE:
            raise ValueError(f"on_failure must be one of {ON_FAILURE}, not {a['on_failure']!r}")
        if a["on_parent_cancel"] not in ON_PARENT_CANCEL:
            raise ValueError(
                f"on_parent_cancel must be one of {ON_PARENT_CANCEL}, not {a['on_parent_cancel']!r}"
            )
        if not isinstance(a["wait"], bool):
            raise ValueError(f"wait must be True or False, not {a['wait']!r}")
        check_resolver(a["input"], "input")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        a = step.args
        key = ctx.key(path)
        started = state_part(ctx.state, "children")
        if resume is not None and key in started:
            child_id = started[key]
            settled = state_part(ctx.state, "settled").pop(child_id, None)
            if settled is None:  # woken for another reason: wait on
                raise Suspend(ChildWait(child_id), path)
            del started[key]
            return _outcome(step, settled)
        payload = resolve(a["input"], ctx)
        if payload is None:
            payload = {}
        if not isinstance(payload, dict):
            raise InvalidEvent(f"the input of child {step.name!r} must be a dict (its payload)")
        payload = to_json(payload, f"the input of child {step.name!r}")
        key_value = resolve(a["idempotency_key"], ctx)
        if key_value is not None:
            key_value = check_text(key_value, "the child's idempotency key", limits.IDEMPOTENCY_KEY)
        child_id = uuid.uuid4()
        ctx.effects.append(
            ChildRequest(
                id=child_id,
                workflow=a["workflow"],
                version=a["version"],
                payload=payload,
                idempotency_key=key_value,
                step=path_text(path),
                wait=a["wait"],
                cancel_with_parent=a["on_parent_cancel"] == "cancel",
            )
        )
        if not a["wait"]:
            return {"run_id": str(child_id), "workflow": a["workflow"]}
        started[key] = str(child_id)
        raise Suspend(ChildWait(str(child_id)), path)

    def describe(self, step: Step) -> str:
        return f"child {step.args['workflow']}"


def _outcome(step: Step, settled: dict[str, Any]) -> Any:
    ok = settled.get("status") == "completed"
    if step.args["on_failure"] == "result":
        if ok:
            return {"ok": True, "result": settled.get("result"), "run_id": settled.get("run_id")}
        return {
            "ok": False,
            "status": settled.get("status"),
            "error": settled.get("error", ""),
            "reason": settled.get("reason", ""),
            "run_id": settled.get("run_id"),
        }
    if ok:
        return settled.get("result")
    raise errors.ChildFailed(
        f"child run {settled.get('run_id')} of {step.args['workflow']!r} was "
        f"{settled.get('status')}: {settled.get('error') or settled.get('reason') or ''}"
    )


def child(
    name: str,
    workflow: str,
    *,
    input: Resolver = None,  # noqa: A002 - the issue's name for the child's payload
    idempotency_key: Resolver = None,
    wait: bool = True,
    on_failure: str = "fail",
    on_parent_cancel: str = "cancel",
    version: str | None = None,
    compensate: Sequence[Step] | None = None,
) -> Step:
    """Start the workflow ``workflow`` (by name) as a child run whose payload is
    ``input``; with ``wait`` (default) its result is the step's."""
    name_of = getattr(workflow, "name", workflow)  # a Workflow object is accepted too
    step = Step(
        "child",
        name,
        {
            "workflow": name_of,
            "input": input,
            "idempotency_key": idempotency_key,
            "wait": wait,
            "on_failure": on_failure,
            "on_parent_cancel": on_parent_cancel,
            "version": version,
        },
    )
    return compensated(step, compensate)


register_step_kind(ChildKind())


__getattr__ = moved_names(__name__, {"ChildFailed": "kumiflow_django"})
