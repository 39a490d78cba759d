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
        True,
    )


def tenants(user):
    return ["default"]


@pytest.mark.parametrize(
    ("name", "value", "check_id"),
    [
        ("API_USER_TENANTS", "no.such.module.tenants", "kumiflow.E020"),
        ("API_USER_TENANTS", "tests.http.test_settings.nothing_here", "kumiflow.E020"),
        ("API_USER_TENANTS", ["x"], "kumiflow.E020"),
        ("API_PAGE_SIZE", 0, "kumiflow.E021"),
        ("API_MAX_PAGE_SIZE", "500", "kumiflow.E022"),
        ("API_PAGE_SIZE", 501, "kumiflow.E026"),
        ("SSE_HEARTBEAT", 0, "kumiflow.E023"),
        ("SSE_POLL_INTERVAL", -1.0, "kumiflow.E024"),
        ("SSE_LISTEN", "yes", "kumiflow.E025"),
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
