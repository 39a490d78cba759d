"""The benchmark's history loader (bench/history.py) on the test database.

W10 and W11 load a million finished runs through it before they measure
anything; when a migration adds a column the loader does not fill, both
workloads die before their first row (round 12 found them broken by the
search attributes' ``top`` column). Ten clones here keep it honest.
"""

from __future__ import annotations

import importlib
import sys

import pytest

from kumiflow_django.models import Event, RunAttribute, WorkflowRun


@pytest.fixture
def bench_workflows(registry):
    """The benchmark's workflows, registered in the test's own registry."""
    module = sys.modules.get("bench.workflows")
    if module is None:  # defining registers in the isolated registry
        importlib.import_module("bench.workflows")
    else:
        importlib.reload(module)
    return registry


def own_columns(run_id) -> list[dict]:
    """A run's attribute rows without the columns a clone gives values of its own."""
    clone_s_own = {"id", "run_id", "value", "started_at"}
    rows = RunAttribute.objects.filter(run_id=run_id).order_by("name").values()
    return [{k: v for k, v in row.items() if k not in clone_s_own} for row in rows]


@pytest.mark.django_db(transaction=True)
def test_the_loader_clones_finished_runs_with_their_events_and_attributes(bench_workflows):
    from bench.history import load

    result = load(10, newest_days=100, oldest_days=400)
    template = WorkflowRun.objects.get(id=RunAttribute.objects.get(value="C-TEMPLATE").run_id)

    # The template run (through the engine) and its ten clones.
    assert result["runs"] == 10 and result["events"] == 50 and result["attributes"] == 20
    clones = WorkflowRun.objects.exclude(
        id__in=RunAttribute.objects.filter(value="C-TEMPLATE").values("run_id")
    ).filter(workflow="bench-w10")
    assert clones.count() == 10
    assert set(clones.values_list("status", flat=True)) == {"completed"}
    for run in clones:
        assert list(
            Event.objects.filter(stream_id=str(run.id))
            .order_by("version")
            .values_list("version", flat=True)
        ) == [1, 2, 3, 4]
        attributes = dict(RunAttribute.objects.filter(run_id=run.id).values_list("name", "value"))
        assert attributes == run.attributes
        assert attributes["customer"].startswith("C-") and attributes["tier"] != "T-TEMPLATE"
        # Every column but the clone's own (its run, value, start) as the
        # engine filled the template's rows.
        assert own_columns(run.id) == own_columns(template.id)
        assert run.finished_at is not None and run.started_at <= run.finished_at
    assert RunAttribute.objects.filter(name="customer").values("value").distinct().count() == 11
