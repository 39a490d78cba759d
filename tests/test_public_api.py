"""The public API does not drift: async twins take exactly their sync function's
arguments, ``tenant`` is keyword-only, the exceptions live in one module, and
the old spellings still work with a DeprecationWarning (CHANGELOG.md)."""

from __future__ import annotations

import importlib
import inspect
import warnings

import pytest
from asgiref.sync import async_to_sync

import kumiflow_django
from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import Compensation, RunStatus
from kumiflow_django.store import errors
from kumiflow_django.testing import run_until_idle

PUBLIC = {name: getattr(kumiflow_django, name) for name in kumiflow_django.__all__}
FUNCTIONS = {
    name: value
    for name, value in PUBLIC.items()
    if inspect.isfunction(value) or inspect.iscoroutinefunction(value)
}
TWINS = sorted(
    name
    for name, value in FUNCTIONS.items()
    if inspect.iscoroutinefunction(value) and name.startswith("a")
)


def test_every_async_function_of_the_api_is_the_twin_of_a_sync_one():
    assert TWINS == [
        "aappend_event",
        "abulk_runs",
        "acancel_run",
        "adecide_approval",
        "afail_run",
        "aget_run",
        "apause_run",
        "apause_tenant",
        "apause_workflow",
        "arestart_run",
        "aresume_run",
        "aresume_tenant",
        "aresume_workflow",
        "aretry_run",
        "astart_workflow",
        "awake_run",
    ]
    for name in TWINS:
        assert not inspect.iscoroutinefunction(FUNCTIONS[name[1:]]), name


@pytest.mark.parametrize("name", TWINS)
def test_an_async_twin_has_its_sync_functions_signature(name):
    sync = FUNCTIONS[name[1:]]
    assert inspect.signature(FUNCTIONS[name]) == inspect.signature(sync)
    assert FUNCTIONS[name].__name__ == name
    assert sync.__doc__ in FUNCTIONS[name].__doc__


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_tenant_is_keyword_only_in_the_public_api(name):
    parameter = inspect.signature(FUNCTIONS[name]).parameters.get("tenant")
    assert parameter is None or parameter.kind == inspect.Parameter.KEYWORD_ONLY


@pytest.mark.django_db
def test_acancel_run_takes_compensate_and_by_like_cancel_run(registry, clock):
    undo = [s.append_event("undo-log", "undo.ran")]
    define_workflow(
        "trip",
        steps=[s.compute("a", lambda ctx: 1, compensate=undo), s.wait("PT1M"), s.wait("P1D")],
    )
    run = start_workflow("trip")
    clock.advance(minutes=1)
    run_until_idle()
    async_to_sync(kumiflow_django.acancel_run)(run.id, compensate=True, by="ann", reason="x")
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.compensation) == (RunStatus.CANCELLED, Compensation.COMPENSATED)


@pytest.mark.django_db
def test_a_tenant_passed_by_position_still_works_with_a_warning(registry):
    define_workflow("one", steps=[s.return_(1)])
    run = start_workflow("one", tenant="acme")
    with pytest.warns(DeprecationWarning, match="pass tenant by keyword"):
        assert kumiflow_django.get_run(run.id, "acme") == run  # type: ignore[call-arg]
    with pytest.warns(DeprecationWarning), pytest.raises(errors.RunNotFound):
        kumiflow_django.get_run(run.id, "other")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        kumiflow_django.get_run(run.id, "acme", tenant="acme")  # type: ignore[misc]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kumiflow_django.get_run(run.id, tenant="acme") == run


EXCEPTIONS = sorted(
    name
    for name, value in PUBLIC.items()
    if isinstance(value, type) and issubclass(value, BaseException)
)


def test_the_public_exceptions_live_in_one_module():
    assert {"TaskFailed", "ChildFailed", "NotInATask", "DeliveryFailure", "StaleVersion"} <= set(
        EXCEPTIONS
    )
    for name in EXCEPTIONS:
        assert PUBLIC[name].__module__ == "kumiflow_django.store.errors", name
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    }
    assert defined == set(EXCEPTIONS), "every exception there is public, and exported"


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("kumiflow_django.steps.task", "TaskFailed"),
        ("kumiflow_django.steps.child", "ChildFailed"),
        ("kumiflow_django.steps", "TaskFailed"),
        ("kumiflow_django.steps", "ChildFailed"),
        ("kumiflow_django.steps.model", "StaleVersion"),
        ("kumiflow_django.steps", "StaleVersion"),
        ("kumiflow_django.tasks.context", "NotInATask"),
        ("kumiflow_django.outbox.errors", "DeliveryFailure"),
        ("kumiflow_django.outbox.errors", "PermanentFailure"),
    ],
)
def test_an_exception_from_its_old_module_is_the_same_class_with_a_warning(module, name):
    with pytest.warns(DeprecationWarning, match=f"moved to kumiflow_django.{name}"):
        value = getattr(importlib.import_module(module), name)
    assert value is getattr(kumiflow_django, name)


def test_steps_append_event_takes_the_order_of_append_event():
    assert (
        list(inspect.signature(s.append_event).parameters)[:3]
        == list(inspect.signature(kumiflow_django.append_event).parameters)[:3]
    )
    new = s.append_event("order-7", "order.shipped", {"order": 7}, name="shipped")
    with pytest.warns(DeprecationWarning, match=r"append_event\(stream_id, type, payload\)"):
        old = s.append_event(  # type: ignore[call-arg, misc]
            "order.shipped", stream_id="order-7", payload={"order": 7}, name="shipped"
        )
    assert (old.kind, old.name, dict(old.args)) == (new.kind, new.name, dict(new.args))
    assert new.args["type"] == "order.shipped" and new.args["stream_id"] == "order-7"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keywords = s.append_event(type="order.shipped", stream_id="order-7", payload={"order": 7})
    assert dict(keywords.args) == {**new.args}
