"""Modules that moved in 0.2 still import, as the module that replaced them,
with a DeprecationWarning (CHANGELOG.md lists them)."""

from __future__ import annotations

import importlib
import sys

import pytest

import kumiflow_django
from kumiflow_django import MOVED_MODULES


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_an_old_module_path_imports_the_new_module_with_a_warning(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    sys.modules.pop(old, None)


@pytest.mark.parametrize(
    ("package", "name", "new"),
    [
        ("kumiflow_django.outbox", "request", "kumiflow_django.steps.dispatch"),
        ("kumiflow_django.cron", "fire_now", "kumiflow_django.cron.schedules"),
        ("kumiflow_django.cron", "set_enabled", "kumiflow_django.cron.schedules"),
        ("kumiflow_django.cron", "next_occurrence", "kumiflow_django.cron.occurrences"),
    ],
)
def test_names_of_modules_that_became_packages_still_resolve(package, name, new):
    with pytest.warns(DeprecationWarning, match="moved to"):
        value = getattr(importlib.import_module(package), name)
    assert value is getattr(importlib.import_module(new), name)


def test_the_public_api_is_unchanged():
    for name in kumiflow_django.__all__:
        assert getattr(kumiflow_django, name) is not None
