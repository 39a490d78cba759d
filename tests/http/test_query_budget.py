"""The statements of one API request, pinned per endpoint and database (W14).

Each figure is every statement the request sends, the token's look-up and
the transaction's own (BEGIN, SAVEPOINT, RELEASE, COMMIT) included, measured
after a first request of the same kind, with the API mounted as the
testproject mounts it. On PostgreSQL a transaction sets its timeouts in a
statement of its own, and a request that changed a run announces it to the
live streams after the commit (one NOTIFY). A figure may only go down:
lower it with the change that lowers it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from tests.http.conftest import API

# Transactions commit, as in production: a definition snapshot is remembered
# after its first commit, not stored again by each start.
pytestmark = pytest.mark.django_db(transaction=True)

BUDGETS: dict[str, dict[str, int]] = {
    # A straight-through run of two steps, started and run to its end in the
    # request: the token, the position, the trigger event and the run's row
    # (on PostgreSQL the run's events and row in one statement; 10 before).
    "start": {"sqlite": 8, "postgresql": 8, "mysql": 8},
    # The token, then the run by its key.
    "read": {"sqlite": 2, "postgresql": 2, "mysql": 2},
    # The token, then one page of 50 runs in one statement, whatever their number.
    "list": {"sqlite": 2, "postgresql": 2, "mysql": 2},
    # An event no workflow starts on or waits for: the token, the stream's head,
    # the event (PostgreSQL's figure was one above what it sent).
    "append": {"sqlite": 5, "postgresql": 5, "mysql": 5},
}


def _statements(request) -> list[str]:
    connection.queries_log.clear()
    with CaptureQueriesContext(connection) as queries:
        response = request()
    assert response.status_code in (200, 201), response.content
    return [q["sql"] for q in queries.captured_queries]


def _within_budget(kind: str, statements: list[str]) -> None:
    budget = BUDGETS[kind][connection.vendor]
    listed = "\n".join(f"{i + 1:>3} {q[:160]}" for i, q in enumerate(statements))
    assert len(statements) <= budget, f"{kind}: {len(statements)} > {budget}\n{listed}"


@pytest.fixture
def straight(registry):
    return define_workflow(
        "straight", steps=[s.compute("a", lambda ctx: 1), s.compute("b", lambda ctx: 2)]
    )


@pytest.mark.parametrize("kind", list(BUDGETS))
def test_each_endpoint_sends_its_pinned_statements(api, straight, kind):
    runs = [start_workflow("straight", payload={"n": n}) for n in range(60)]
    requests: list[Callable[[], Any]]
    if kind == "start":
        requests = [
            partial(api.post_json, f"{API}runs/", {"workflow": "straight", "payload": {"n": n}})
            for n in (0, 1)
        ]
    elif kind == "read":
        requests = [partial(api.get, f"{API}runs/{run.id}/") for run in runs[:2]]
    elif kind == "list":
        requests = [partial(api.get, f"{API}runs/", {"limit": 50})] * 2
    else:
        requests = [
            partial(
                api.post_json,
                f"{API}events/",
                {"stream_id": f"note-{n}", "type": "budget.note", "payload": {}},
            )
            for n in (0, 1)
        ]
    measured = [_statements(request) for request in requests][-1]
    if kind == "list":
        assert len(api.get(f"{API}runs/", {"limit": 50}).json()["runs"]) == 50
    _within_budget(kind, measured)
