"""The core works without the optional extras: a child process in which
``opentelemetry`` and ``prometheus_client`` cannot be imported imports every
module of the core, runs workflows, passes ``manage.py check``, and says what
is missing when an integration is asked for."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.processes import ROOT

CHILD = textwrap.dedent(
    """
    import importlib
    import importlib.abc
    import pkgutil
    import sys

    BLOCKED = ("opentelemetry", "prometheus_client")

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is not installed (blocked by the test)")
            return None

    sys.meta_path.insert(0, Blocked())

    import django
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django.test import override_settings

    django.setup()
    import kumiflow_django
    from kumiflow_django import define_workflow, start_workflow, steps as s
    from kumiflow_django.checks import check_settings
    from kumiflow_django.store import telemetry

    # Every module of the core imports; only the two integrations need their library.
    failed = []
    for module in pkgutil.walk_packages(kumiflow_django.__path__, "kumiflow_django."):
        try:
            importlib.import_module(module.name)
        except ImportError as exc:
            failed.append(module.name)
    assert failed == [
        "kumiflow_django.observability.metrics",
        "kumiflow_django.observability.otel",
    ], failed
    assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED]
    assert not telemetry.tracing() and not telemetry.measuring()

    call_command("migrate", verbosity=0)
    call_command("check", fail_level="ERROR")
    define_workflow("plain", steps=[s.compute("a", lambda ctx: 1), s.wait("PT1H")])
    run = start_workflow("plain")
    assert run.status == "waiting", run.status
    assert "traceparent" not in str(run.state)

    with override_settings(KUMIFLOW_TRACING=True, KUMIFLOW_METRICS=True):
        assert [e.id for e in check_settings()] == ["kumiflow.E033", "kumiflow.E034"]
    try:
        call_command("kumiflow_worker", "--metrics-port", "0")
    except CommandError as exc:
        assert "needs prometheus-client" in str(exc), exc
    else:
        raise AssertionError("--metrics-port ran without prometheus-client")
    print("core ok")
    """
)


def test_the_core_imports_and_runs_without_opentelemetry_and_prometheus_client():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DATABASE_URL": "sqlite:///:memory:",
    }
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.strip().endswith("core ok")
