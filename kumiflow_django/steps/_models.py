"""Helpers shared by the steps that read and write Django models."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db import models
from django.db.models import Q

ModelRef = str | type[models.Model]


def check_model_ref(ref: Any) -> None:
    if isinstance(ref, type) and issubclass(ref, models.Model):
        return
    if not isinstance(ref, str) or ref.count(".") != 1:
        raise ValueError(f"model must be a model class or 'app_label.ModelName', not {ref!r}")
    if apps.ready:
        apps.get_model(ref)  # LookupError names the model


def get_model(ref: ModelRef) -> type[models.Model]:
    if isinstance(ref, str):
        return apps.get_model(ref)
    return ref


def apply_filter(qs: models.QuerySet[Any], value: Any) -> models.QuerySet[Any]:
    """``value`` is a mapping of lookups or a ``Q``."""
    if isinstance(value, Q):
        return qs.filter(value)
    if isinstance(value, dict):
        return qs.filter(**value)
    raise TypeError(
        f"a filter must resolve to a dict of lookups or a Q, not {type(value).__name__}"
    )


def row(obj: models.Model) -> dict[str, Any]:
    """A model instance as the plain values a step result stores."""
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}
