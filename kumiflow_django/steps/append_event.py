"""``append_event``: write a domain event from a workflow, in the run's tenant."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any, cast

from kumiflow_django.definition.context import Context
from kumiflow_django.definition.step import (
    Resolver,
    Step,
    StepKind,
    compensated,
    register_step_kind,
    resolve,
)
from kumiflow_django.store.errors import KumiflowDeprecationWarning
from kumiflow_django.store.log import append_event as append
from kumiflow_django.store.log import check_event_type, check_text


class AppendEventKind(StepKind):
    kind = "append_event"
    resolver_args = ("stream_id", "payload", "expected_version")

    def validate(self, step: Step) -> None:
        super().validate(step)
        event_type = step.args["type"]
        if not isinstance(event_type, str) or not event_type.strip():
            raise ValueError(f"append_event needs an event type, not {event_type!r}")
        check_event_type(event_type)
        check_text(step.args["stream_type"], "stream_type", 100, empty=True)

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        event = append(
            resolve(step.args["stream_id"], ctx),
            step.args["type"],
            resolve(step.args["payload"], ctx) or {},
            stream_type=step.args["stream_type"],
            tenant=ctx.tenant,
            expected_version=resolve(step.args["expected_version"], ctx),
            metadata={"run_id": str(ctx.run.id), "workflow": ctx.run.workflow},
        )
        return {
            "event_id": str(event.event_id),
            "position": event.position,
            "stream_id": event.stream_id,
            "version": event.version,
        }

    def describe(self, step: Step) -> str:
        return f"append {step.args['type']}"


def _old_order[**P](func: Callable[P, Step]) -> Callable[P, Step]:
    """Before 0.2 the type came first, ``append_event(type, stream_id=...)``: such
    a call still works, with a warning (in the new order it could not bind)."""

    @functools.wraps(func)
    def shim(*args: Any, **kwargs: Any) -> Step:
        if len(args) == 1 and "stream_id" in kwargs and "type" not in kwargs:
            warnings.warn(
                "steps.append_event(type, stream_id=...) is deprecated: the arguments "
                "come in the order of kumiflow_django.append_event, "
                "append_event(stream_id, type, payload)",
                KumiflowDeprecationWarning,
                stacklevel=2,
            )
            return func(kwargs.pop("stream_id"), *args, **kwargs)
        return func(*args, **kwargs)

    return cast(Callable[P, Step], shim)


@_old_order
def append_event(
    stream_id: Resolver,
    type: str,  # noqa: A002 - mirrors kumiflow_django.append_event
    payload: Resolver = None,
    *,
    stream_type: str = "",
    expected_version: Resolver = None,
    name: str | None = None,
    compensate: Sequence[Step] | None = None,
) -> Step:
    """Append a domain event (it may start or wake other workflows); the arguments
    are those of :func:`kumiflow_django.append_event`, in its order."""
    args = {
        "type": type,
        "stream_id": stream_id,
        "payload": payload,
        "stream_type": stream_type,
        "expected_version": expected_version,
    }
    return compensated(Step("append_event", name, args), compensate)


register_step_kind(AppendEventKind())
