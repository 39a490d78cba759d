"""The HTTP surface's settings: documented defaults, one check id each."""

from __future__ import annotations

import pytest
from django.test import override_settings

from kumiflow_django.checks import check_settings
from kumiflow_django.conf import settings


def test_the_defaults():
    assert (settings.API_USER_TENANTS, settings.API_PAGE_SIZE, settings.API_MAX_PAGE_SIZE) == (
        None,
        50,
        500,
    )
    assert (settings.SSE_HEARTBEAT, settings.SSE_POLL_INTERVAL, settings.SSE_LISTEN) == (
        15.0,
        1.0,
        None,
    )


def test_streams_listen_where_they_are_mounted():
    """SSE_LISTEN=None: on where the API's URLs are mounted (the testproject
    mounts them), off elsewhere: no NOTIFY tax on projects without the API."""
    from kumiflow_django.http.notify import _streams_mounted, listening

    assert listening()
    _streams_mounted.cache_clear()
    with override_settings(ROOT_URLCONF="tests.http.no_api_urls"):
        assert not listening()
    _streams_mounted.cache_clear()


def tenants(user):
    return ["default"]


@pytest.mark.parametrize(
    ("name", "value", "check_id"),
    [
        ("API_USER_TENANTS", "no.such.module.tenants", "kumiflow.E021"),
        ("API_USER_TENANTS", "tests.http.test_settings.nothing_here", "kumiflow.E021"),
        ("API_USER_TENANTS", ["x"], "kumiflow.E021"),
        ("API_PAGE_SIZE", 0, "kumiflow.E022"),
        ("API_MAX_PAGE_SIZE", "500", "kumiflow.E023"),
        ("API_PAGE_SIZE", 501, "kumiflow.E027"),
        ("SSE_HEARTBEAT", 0, "kumiflow.E024"),
        ("SSE_POLL_INTERVAL", -1.0, "kumiflow.E025"),
        ("SSE_LISTEN", "yes", "kumiflow.E026"),
    ],
)
def test_each_bad_setting_has_its_own_error(name, value, check_id):
    with override_settings(**{f"KUMIFLOW_{name}": value}):
        messages = check_settings()
    assert [m.id for m in messages] == [check_id]
    assert f"KUMIFLOW_{name}" in messages[0].msg


def test_a_tenants_hook_that_imports_passes():
    with override_settings(KUMIFLOW_API_USER_TENANTS="tests.http.test_settings.tenants"):
        assert check_settings() == []
