"""Old spellings of the public API that keep working, with a DeprecationWarning.

One helper per kind of change, so that every shim warns the same way and
CHANGELOG.md can list them: a name that moved to another module
(:func:`moved_names`), parameters that became keyword-only
(:func:`keyword_only`). Modules that moved whole are in
``kumiflow_django.MOVED_MODULES``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any, cast

from kumiflow_django.store.errors import KumiflowDeprecationWarning

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def moved_names(module: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``module`` for the names that moved out of it
    (name -> the module that has it now): each still resolves, with a warning."""

    def resolve(name: str) -> Any:
        new = names.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} moved to {new}.{name}", KumiflowDeprecationWarning, stacklevel=2
        )
        return getattr(importlib.import_module(new), name)

    return resolve


def keyword_only[**P, R](*names: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """For a function whose parameters ``names`` (in their old order, after its
    positional ones) became keyword-only: a call that still passes them by
    position works, with a warning. The function keeps its own signature."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        params = inspect.signature(func).parameters.values()
        positional = sum(p.kind in _POSITIONAL for p in params)

        @functools.wraps(func)
        def shim(*args: Any, **kwargs: Any) -> R:
            if len(args) > positional:
                extra = args[positional:]
                if len(extra) > len(names) or set(names[: len(extra)]) & kwargs.keys():
                    return func(*args, **kwargs)  # the TypeError the call deserves
                moved = dict(zip(names, extra, strict=False))
                warnings.warn(
                    f"{func.__name__}(): pass {', '.join(moved)} by keyword; by position "
                    "is deprecated",
                    KumiflowDeprecationWarning,
                    stacklevel=2,
                )
                args, kwargs = args[:positional], {**kwargs, **moved}
            return func(*args, **kwargs)

        return cast(Callable[P, R], shim)

    return decorate
