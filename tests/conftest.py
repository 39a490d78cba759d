from __future__ import annotations

import pytest
from django.db import connection


def pytest_sessionstart(session):
    """The processes the tests start (workers, servers) run on the test
    database alone: they leave out the settings' second alias, whose test
    database exists only when a test asks for it (Django's checks at a
    command's start connect to every alias)."""
    import os

    from django.conf import settings

    settings.DATABASES  # noqa: B018 - this process reads its settings first
    # Under pytest-xdist the controller starts the workers after this hook:
    # they must read the settings with both aliases, then set it themselves.
    if not session.config.pluginmanager.has_plugin("dsession"):
        os.environ["TESTPROJECT_ONE_DATABASE"] = "1"

    # Users the tests create and log in (admin_client, ...) are hashed with MD5:
    # PBKDF2 costs a fifth of a second per password. Only here: the demo, make
    # serve and the processes the tests start keep the settings' real hashing.
    from django.test.utils import override_settings

    override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]).enable()


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
    from kumiflow_django.definition.registry import registry as the_registry

    with the_registry.isolated() as isolated:
        yield isolated


@pytest.fixture
def clock():
    from kumiflow_django.testing import virtual_clock

    with virtual_clock() as the_clock:
        yield the_clock


@pytest.fixture
def browser():
    """A headless Chromium page driver. Skipped where Playwright or Debian's
    chromium is missing, unless KUMIFLOW_REQUIRE_BROWSER=1 (CI), which fails instead."""
    import os
    import shutil

    chromium = os.environ.get("KUMIFLOW_CHROMIUM") or shutil.which("chromium") or ""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None  # type: ignore[assignment]
    if sync_playwright is None or not chromium:
        message = "browser tests need the 'browser' dependency group and /usr/bin/chromium"
        if os.environ.get("KUMIFLOW_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright runs an event loop
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=chromium,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            yield instance
        finally:
            instance.close()
            # Playwright switches greenlets, which carry their own context
            # variables: Django may have opened a second connection in ours.
            from django.db import connections

            connections.close_all()


@pytest.fixture(autouse=True)
def _fresh_paused_scopes():
    """Paused scopes are cached per process for a second for starts: a test's
    (rolled back) pause must not reach the next test."""
    from kumiflow_django.projections.pauses import forget_scopes

    forget_scopes()
    yield
    forget_scopes()


@pytest.fixture(autouse=True)
def _fresh_flow_overrides():
    """Flow limit overrides are cached per process for a few seconds: a test's
    (rolled back) override must not reach the next test."""
    from kumiflow_django.flow.admission import forget_overrides

    forget_overrides()
    yield
    forget_overrides()
