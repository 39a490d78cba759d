from __future__ import annotations

import pytest
from django.db import connection


def pytest_collection_modifyitems(config, items):
    """Tests that need row locks or several connections run on the server databases only."""
    if connection.vendor != "sqlite":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL or MariaDB (row locks, several connections)")
    for item in items:
        if "server_db" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def registry():
    """An empty workflow registry for the test (the testproject's own are put back after)."""
    from kumiflow_django.registry import registry as the_registry

    with the_registry.isolated() as isolated:
        yield isolated


@pytest.fixture
def clock():
    from kumiflow_django.testing import virtual_clock

    with virtual_clock() as the_clock:
        yield the_clock
