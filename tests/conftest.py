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
