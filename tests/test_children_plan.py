"""The look-up of a run's children reads the index of child runs, also once
ANALYZE has counted that most runs have no parent (SQLite's planner then
scanned the run table rather than use a full index on ``parent_id``). The
index is partial (child runs only) on SQLite and PostgreSQL, plain on
MariaDB, which has no partial indexes."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from kumiflow_django.admin import structure
from kumiflow_django.engine import bulk
from kumiflow_django.engine import children as child_runs
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.store import db

pytestmark = pytest.mark.django_db

INDEX = "kumiflow_run_child_idx"
ROOTS = 500
#: A look-up by parent (not a read of the column): ``"parent_id" = ...`` or ``IN (...)``.
_BY_PARENT = re.compile(r'["`]parent_id["`] (=|IN) ')


def _run(parent: WorkflowRun | None = None) -> WorkflowRun:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return WorkflowRun(
        id=uuid.uuid4(),
        tenant_id="default",
        workflow="tree",
        fingerprint="f",
        status=RunStatus.WAITING,
        version=1,
        started_at=now,
        updated_at=now,
        parent_id=None if parent is None else parent.id,
        root_id=None if parent is None else parent.id,
        depth=0 if parent is None else 1,
        parent_waits=parent is not None,
    )


@pytest.fixture
def tree() -> WorkflowRun:
    """Many root runs (parent NULL), one parent with three children, a child
    of each (a cancel's cascade goes two levels), and the planner's
    statistics of them."""
    WorkflowRun.objects.bulk_create([_run() for _ in range(ROOTS)], batch_size=500)
    parent = _run()
    parent.save()
    children = [_run(parent) for _ in range(3)]
    WorkflowRun.objects.bulk_create(children)
    WorkflowRun.objects.bulk_create([_run(child) for child in children])
    # Not on MariaDB: its ANALYZE TABLE commits the test's transaction (an
    # implicit commit), leaving these rows to the tests after it; InnoDB
    # samples its statistics by itself, and its index is a plain one.
    if connection.vendor != "mysql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    return parent


def _plans(call: Callable[[], object]) -> list[tuple[str, str]]:
    """(statement, plan) of each statement of ``call`` that looks children up."""
    with CaptureQueriesContext(connection) as queries:
        call()
    statements = [q["sql"] for q in queries.captured_queries if _BY_PARENT.search(q["sql"])]
    assert statements, "the call looked no children up"
    plans = []
    with connection.cursor() as cursor:
        for sql in statements:
            if connection.vendor == "sqlite":
                cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
                plans.append((sql, " | ".join(str(row[-1]) for row in cursor.fetchall())))
            elif connection.vendor == "mysql":  # the index each table is read by
                cursor.execute(f"EXPLAIN {sql}")
                plans.append((sql, " | ".join(str(row[5]) for row in cursor.fetchall())))
            else:
                cursor.execute(f"EXPLAIN {sql}")
                plans.append((sql, " | ".join(str(row[0]) for row in cursor.fetchall())))
    return plans


def _cascade(parent: WorkflowRun) -> None:
    with db.atomic():
        child_runs.lock_subtree(parent, cancelled=True)


LOOKUPS: dict[str, Callable[[WorkflowRun], object]] = {
    "the admin's children of a run": structure.children,
    "a cancel's cascade, level by level": _cascade,
    "a bulk operation's parent filter": lambda parent: list(
        bulk.matching({"parent": str(parent.id)}).values_list("pk", flat=True)
    ),
}


@pytest.mark.parametrize("lookup", LOOKUPS)
def test_the_children_look_up_reads_the_child_index_after_analyze(tree, lookup):
    for sql, plan in _plans(lambda: LOOKUPS[lookup](tree)):
        assert INDEX in plan, f"{sql}\n-> {plan}"


def _index_sql() -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = %s", [INDEX])
        else:
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", [INDEX])
        (sql,) = cursor.fetchone()
    return str(sql)


def test_the_child_index_is_the_only_index_of_parent_id_and_partial_where_it_can_be():
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, WorkflowRun._meta.db_table)
    on_parent = sorted(
        name for name, c in constraints.items() if c["index"] and c["columns"] == ["parent_id"]
    )
    assert on_parent == [INDEX]
    if connection.features.supports_partial_indexes:  # quoted and bracketed per database
        sql = _index_sql()
        assert re.sub(r'[\s"()]', "", sql).endswith("WHEREparent_idISNOTNULL"), sql
