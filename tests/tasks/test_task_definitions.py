"""Bad task steps are refused where they are written, or by ``manage.py check``."""

from __future__ import annotations

import functools

import django
import pytest
from django.core import checks
from django.test import override_settings

from kumiflow_django import define_workflow
from kumiflow_django import steps as s
from kumiflow_django.store.errors import WorkflowDefinitionError
from testproject.shop import tasks as shop_tasks


def local_function():
    def inner(n):
        return n

    return inner


class Service:
    def call(self, n):
        return n

    def __call__(self, n):
        return n


@pytest.mark.parametrize(
    "fn, why",
    [
        (lambda n: n, "lambda or a function defined inside another one"),
        (local_function(), "lambda or a function defined inside another one"),
        (Service().call, "not a bound method"),
        (Service(), "plain importable function"),
        (functools.partial(shop_tasks.double), "plain importable function"),
        ("testproject.shop.tasks.double", "plain importable function"),
    ],
    ids=["lambda", "closure", "bound-method", "callable-object", "partial", "a-string"],
)
def test_a_function_not_importable_by_its_path_is_refused(registry, fn, why):
    with pytest.raises(WorkflowDefinitionError, match=why):
        define_workflow("bad-task", steps=[s.task("out", fn)])


@pytest.mark.parametrize(
    "options, why",
    [
        ({"timeout": 0}, "timeout must be between 0 and 7 days"),
        ({"timeout": "P8D"}, "timeout must be between 0 and 7 days"),
        ({"timeout": True}, "timeout must be seconds"),
        ({"heartbeat_timeout": -1}, "heartbeat_timeout must be between"),
        ({"retry": "often"}, "retry must be a number of attempts or a policy"),
        ({"retry": {"attempts": 0}}, "attempts"),
        ({"non_retryable": ("ValueError",)}, "non_retryable must name exception classes"),
        ({"on_error": "ignore"}, "on_error must be one of"),
        ({"queue": ""}, "queue must be a name"),
    ],
)
def test_bad_options_are_refused(registry, options, why):
    with pytest.raises(WorkflowDefinitionError, match=why):
        define_workflow("bad-task", steps=[s.task("out", shop_tasks.double, **options)])


def test_a_task_step_needs_a_name(registry):
    with pytest.raises(WorkflowDefinitionError, match="needs a name"):
        define_workflow("bad-task", steps=[s.task("", shop_tasks.double)])


def test_a_django_task_that_takes_its_context_is_refused(registry):
    with pytest.raises(WorkflowDefinitionError, match="takes_context=True is not supported"):
        define_workflow("bad-task", steps=[s.task("out", shop_tasks.with_django_context)])


def test_a_decorated_function_is_accepted_by_its_path(registry):
    workflow = define_workflow("good-task", steps=[s.task("out", shop_tasks.double_immediate)])
    assert workflow.steps[0].args["fn"] is shop_tasks.double_immediate


def test_a_task_on_a_backend_that_is_not_configured_is_a_system_check_error(registry):
    define_workflow("orphan-task", steps=[s.task("out", shop_tasks.double_immediate)])
    from kumiflow_django.checks import check_task_backends

    assert check_task_backends() == []
    module = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    other = {"other": {"BACKEND": f"{module}.backends.dummy.DummyBackend"}}
    with override_settings(TASKS=other):
        [error] = check_task_backends()
    assert error.id == "kumiflow.E042"
    assert "'default'" in error.msg and "orphan-task" in error.msg
    assert error.level == checks.ERROR


@override_settings(KUMIFLOW_TASK_THREADS=-1, KUMIFLOW_MAX_RESULT_BYTES=0)
def test_the_task_settings_are_checked():
    from kumiflow_django.checks import check_settings

    ids = {e.id for e in check_settings()}
    assert {"kumiflow.E040", "kumiflow.E041"} <= ids


@override_settings(KUMIFLOW_MAX_RESULT_BYTES=2_000_000, KUMIFLOW_MAX_VALUE_BYTES=1_000_000)
def test_a_result_may_not_be_larger_than_a_value():
    from kumiflow_django.checks import check_settings

    assert "kumiflow.E043" in {e.id for e in check_settings()}
