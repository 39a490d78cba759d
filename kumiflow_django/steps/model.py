"""``model.create`` / ``update`` / ``upsert`` / ``delete``: write Django models.

They run in the segment's transaction, so they commit with the run's
progress or not at all. ``update`` with ``version_field`` is an optimistic
lock: it changes the row only if the version is still the expected one.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import F

from kumiflow_django.definition.context import Context
from kumiflow_django.definition.step import (
    Resolver,
    Step,
    StepKind,
    compensated,
    register_step_kind,
    resolve,
)
from kumiflow_django.steps._models import ModelRef, apply_filter, check_model_ref, get_model, row
from kumiflow_django.store import errors
from kumiflow_django.store.deprecation import moved_names


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} must resolve to a dict, not {type(value).__name__}")
    return value


class _ModelKind(StepKind):
    def validate(self, step: Step) -> None:
        super().validate(step)
        check_model_ref(step.args["model"])


class CreateKind(_ModelKind):
    kind = "model.create"
    resolver_args = ("values",)

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        model = get_model(step.args["model"])
        values = _mapping(resolve(step.args["values"], ctx), "values")
        return row(model._default_manager.create(**values))


class UpdateKind(_ModelKind):
    kind = "model.update"
    resolver_args = ("pk", "values", "expected_version")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        model = get_model(step.args["model"])
        pk = resolve(step.args["pk"], ctx)
        values = _mapping(resolve(step.args["values"], ctx), "values")
        qs = model._default_manager.filter(pk=pk)
        field = step.args["version_field"]
        if field is not None:
            expected = resolve(step.args["expected_version"], ctx)
            changed = qs.filter(**{field: expected}).update(**values, **{field: F(field) + 1})
            if not changed:
                if qs.exists():
                    raise errors.StaleVersion(
                        f"{model.__name__} {pk} is no longer at {field}={expected!r}"
                    )
                raise ObjectDoesNotExist(f"{model.__name__} {pk} does not exist")
        elif not qs.update(**values):
            raise ObjectDoesNotExist(f"{model.__name__} {pk} does not exist")
        return row(qs.get())


class UpsertKind(_ModelKind):
    kind = "model.upsert"
    resolver_args = ("lookup", "values")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        model = get_model(step.args["model"])
        lookup = _mapping(resolve(step.args["lookup"], ctx), "lookup")
        values = _mapping(resolve(step.args["values"], ctx), "values")
        obj, created = model._default_manager.update_or_create(defaults=values, **lookup)
        return {**row(obj), "created": created}


class DeleteKind(_ModelKind):
    kind = "model.delete"
    resolver_args = ("lookup",)

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        model = get_model(step.args["model"])
        qs = apply_filter(model._default_manager.all(), resolve(step.args["lookup"], ctx))
        deleted, _ = qs.delete()
        return {"deleted": deleted}


def create(
    name: str | None,
    model: ModelRef,
    values: Resolver,
    *,
    compensate: Sequence[Step] | None = None,
) -> Step:
    """Create a row (``save()`` and its signals run); its fields are the result."""
    return compensated(Step("model.create", name, {"model": model, "values": values}), compensate)


def update(
    name: str | None,
    model: ModelRef,
    pk: Resolver,
    values: Resolver,
    *,
    version_field: str | None = None,
    expected_version: Resolver = None,
    compensate: Sequence[Step] | None = None,
) -> Step:
    """Update one row by primary key with ``QuerySet.update()`` (no ``save()``
    signals). With ``version_field`` it changes the row only while that field
    equals ``expected_version`` and increments it; otherwise ``StaleVersion``."""
    args = {
        "model": model,
        "pk": pk,
        "values": values,
        "version_field": version_field,
        "expected_version": expected_version,
    }
    return compensated(Step("model.update", name, args), compensate)


def upsert(
    name: str | None,
    model: ModelRef,
    lookup: Resolver,
    values: Resolver,
    *,
    compensate: Sequence[Step] | None = None,
) -> Step:
    """Insert or update the row found by ``lookup``: for read-model tables."""
    step = Step("model.upsert", name, {"model": model, "lookup": lookup, "values": values})
    return compensated(step, compensate)


def delete(
    name: str | None,
    model: ModelRef,
    lookup: Resolver,
    *,
    compensate: Sequence[Step] | None = None,
) -> Step:
    """Delete the rows matching ``lookup`` (a dict or a ``Q``)."""
    return compensated(Step("model.delete", name, {"model": model, "lookup": lookup}), compensate)


model = SimpleNamespace(create=create, update=update, upsert=upsert, delete=delete)

register_step_kind(CreateKind())
register_step_kind(UpdateKind())
register_step_kind(UpsertKind())
register_step_kind(DeleteKind())


__getattr__ = moved_names(__name__, {"StaleVersion": "kumiflow_django"})
