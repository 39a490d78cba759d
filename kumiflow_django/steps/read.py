"""``read.find_one`` / ``read.find_many``: read Django models into step results.

Results are dicts of field values (``.values()``), so they survive the JSON
of the run state. Tenant filtering is the caller's: put the tenant into the
filter (``lambda ctx: {"tenant": ctx.tenant, ...}``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from kumiflow_django.definition.context import Context
from kumiflow_django.definition.step import Resolver, Step, StepKind, register_step_kind, resolve
from kumiflow_django.steps._models import ModelRef, apply_filter, check_model_ref, get_model


class _ReadKind(StepKind):
    resolver_args = ("filter",)

    def validate(self, step: Step) -> None:
        super().validate(step)
        if not step.name:
            raise ValueError(f"{step.kind} needs a name for its result")
        check_model_ref(step.args["model"])

    def queryset(self, step: Step, ctx: Context) -> Any:
        model = get_model(step.args["model"])
        qs = apply_filter(model._default_manager.all(), resolve(step.args["filter"], ctx))
        if step.args["order_by"]:
            qs = qs.order_by(*step.args["order_by"])
        return qs.values(*step.args["fields"])


class FindOneKind(_ReadKind):
    kind = "read.find_one"

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        qs = self.queryset(step, ctx)
        if not step.args["order_by"]:
            qs = qs.order_by("pk")  # deterministic when the filter is not unique
        return qs.first()


class FindManyKind(_ReadKind):
    kind = "read.find_many"

    def validate(self, step: Step) -> None:
        super().validate(step)
        limit = step.args["limit"]
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"read.find_many limit must be a positive integer, not {limit!r}")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        limit = step.args["limit"]
        rows = list(self.queryset(step, ctx)[: limit + 1])
        if len(rows) > limit and not step.args["truncate"]:
            raise ValueError(
                f"more than {limit} rows match; raise limit= or pass truncate=True "
                "to keep only the first ones"
            )
        return rows[:limit]


def find_one(
    name: str,
    model: ModelRef,
    filter: Resolver,  # noqa: A002 - the natural name here
    *,
    order_by: Sequence[str] = (),
    fields: Sequence[str] = (),
) -> Step:
    """Store the first matching row (a dict) or None under ``name``."""
    args = {"model": model, "filter": filter, "order_by": tuple(order_by), "fields": tuple(fields)}
    return Step("read.find_one", name, args)


def find_many(
    name: str,
    model: ModelRef,
    filter: Resolver = None,  # noqa: A002
    *,
    order_by: Sequence[str] = (),
    fields: Sequence[str] = (),
    limit: int = 100,
    truncate: bool = False,
) -> Step:
    """Store the matching rows (dicts) under ``name``. More than ``limit`` rows fail
    the step unless ``truncate=True``: a silently shortened list would lose work."""
    args = {
        "model": model,
        "filter": filter if filter is not None else {},
        "order_by": tuple(order_by),
        "fields": tuple(fields),
        "limit": limit,
        "truncate": truncate,
    }
    return Step("read.find_many", name, args)


read = SimpleNamespace(find_one=find_one, find_many=find_many)

register_step_kind(FindOneKind())
register_step_kind(FindManyKind())
