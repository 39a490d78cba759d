"""Settings are read lazily and validated by system checks with stable ids."""

from __future__ import annotations

import pytest
from django.test import override_settings

from kumiflow_django.checks import check_settings
from kumiflow_django.conf import settings


def ids(messages):
    return [m.id for m in messages]


def test_defaults_are_documented_class_attributes():
    assert settings.DEFAULT_TENANT == "default"
    assert settings.EVENT_WAKE == "inline"


def test_settings_are_read_at_access_time():
    with override_settings(KUMIFLOW_DEFAULT_TENANT="acme"):
        assert settings.DEFAULT_TENANT == "acme"
    assert settings.DEFAULT_TENANT == "default"


def test_the_default_configuration_passes_the_checks():
    assert check_settings() == []


@pytest.mark.parametrize(
    ("name", "value", "check_id"),
    [
        ("DEFAULT_TENANT", "", "kumiflow.E001"),
        ("DEFAULT_TENANT", "x" * 65, "kumiflow.E001"),
        ("EVENT_WAKE", "sometimes", "kumiflow.E002"),
        ("MAX_START_DEPTH", 0, "kumiflow.E003"),
        ("RESUME_BATCH_SIZE", "100", "kumiflow.E004"),
        ("MAX_INTERVAL", -1, "kumiflow.E005"),
        ("LEASE_SECONDS", True, "kumiflow.E006"),
        ("DISPATCH_RETRY", {"attempts": 0}, "kumiflow.E007"),
        ("DISPATCH_RETRY", {"tries": 3}, "kumiflow.E007"),
        ("WEBHOOK_SECRETS", {"crm": ""}, "kumiflow.E008"),
        ("WEBHOOK_ALLOWED_PRIVATE_HOSTS", "localhost", "kumiflow.E009"),
        ("WEBHOOK_TIMEOUT", (5,), "kumiflow.E010"),
        ("TASKS_BACKEND", 3, "kumiflow.E011"),
        ("ADMIN_PAYLOAD_CHARS", 0, "kumiflow.E012"),
        ("CRON_MISFIRE_GRACE", 0, "kumiflow.E013"),
        ("RESUME_THREADS", 0, "kumiflow.E017"),
        ("LISTEN_DATABASE", "no-such-alias", "kumiflow.E028"),
    ],
)
def test_each_bad_setting_has_its_own_error(name, value, check_id):
    with override_settings(**{f"KUMIFLOW_{name}": value}):
        messages = check_settings()
    assert ids(messages) == [check_id]
    assert f"KUMIFLOW_{name}" in messages[0].msg


def test_a_misspelt_setting_is_a_warning():
    with override_settings(KUMIFLOW_EVENT_WAKEUP="worker"):
        messages = check_settings()
    assert ids(messages) == ["kumiflow.W001"]


@pytest.mark.parametrize(
    ("engine", "level", "warned"),
    [
        ("postgresql", None, False),  # OPTIONS without isolation_level: READ COMMITTED
        ("postgresql", "READ_COMMITTED", False),
        ("postgresql", "REPEATABLE_READ", True),
        ("postgresql", "SERIALIZABLE", True),
        ("mysql", "read committed", False),
        ("mysql", "repeatable read", True),
        ("mysql", "SERIALIZABLE", True),
        ("mysql", "server default", True),  # isolation_level None: the server's own
        ("sqlite3", None, False),
    ],
)
def test_an_isolation_level_above_read_committed_is_a_warning(engine, level, warned):
    from kumiflow_django.checks import isolation_warnings

    options: dict[str, object] = {}
    if engine == "postgresql" and level is not None:
        psycopg = pytest.importorskip("psycopg")
        options["isolation_level"] = getattr(psycopg.IsolationLevel, level)
    elif engine == "mysql":
        options["isolation_level"] = None if level == "server default" else level
    databases = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"},
        "flows": {"ENGINE": f"django.db.backends.{engine}", "NAME": "x", "OPTIONS": options},
    }
    messages = isolation_warnings(databases, "flows")
    assert ids(messages) == (["kumiflow.W003"] if warned else [])
    if warned:
        assert "'flows'" in messages[0].msg and "READ COMMITTED" in messages[0].msg
    # only the database kumiflow-django uses is checked
    assert isolation_warnings(databases, "default") == []


def test_the_isolation_check_reads_kumiflow_database(monkeypatch):
    from types import SimpleNamespace

    from kumiflow_django import checks

    repeatable = {"isolation_level": "repeatable read"}
    databases = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"},
        "flows": {"ENGINE": "django.db.backends.mysql", "NAME": "x", "OPTIONS": repeatable},
    }
    monkeypatch.setattr(checks, "django_settings", SimpleNamespace(DATABASES=databases))
    assert checks.check_isolation_level() == []
    with override_settings(KUMIFLOW_DATABASE="flows"):
        assert ids(checks.check_isolation_level()) == ["kumiflow.W003"]


def test_sqlite_without_immediate_transactions_is_a_warning():
    from kumiflow_django.checks import sqlite_warnings

    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"}}
    assert ids(sqlite_warnings(databases)) == ["kumiflow.W002"]
    immediate = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": "x.sqlite3",
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
    }
    assert sqlite_warnings(immediate) == []


@pytest.mark.django_db
def test_the_tests_hash_passwords_fast_and_the_testproject_for_real(admin_user):
    """The suite's users are hashed with MD5 (tests/conftest.py); the
    testproject's settings (the demo, make serve) keep Django's default."""
    from django.contrib.auth.hashers import get_hasher

    import testproject.settings

    assert get_hasher().algorithm == "md5"
    assert admin_user.password.startswith("md5$")
    assert not hasattr(testproject.settings, "PASSWORD_HASHERS")


# -- settings that steps reference -------------------------------------------


def _step_checks():
    from kumiflow_django.checks import check_step_settings

    return [(m.id, m.obj) for m in check_step_settings()]


def test_a_webhook_signed_with_a_missing_secret_is_an_error(registry):
    from kumiflow_django import define_workflow
    from kumiflow_django import steps as s

    define_workflow("crm", steps=[s.webhook_send("https://crm.example.com", secret="crm")])
    with override_settings(KUMIFLOW_WEBHOOK_SECRETS={"crm": "a-secret"}):
        assert _step_checks() == []
    with override_settings(KUMIFLOW_WEBHOOK_SECRETS={"other": "a-secret"}):
        assert _step_checks() == [("kumiflow.E044", "crm")]


def test_a_mail_step_without_a_default_mailer_is_an_error(registry):
    from kumiflow_django import define_workflow
    from kumiflow_django import steps as s

    define_workflow("welcome", steps=[s.mail_send("a@example.com", "Hi", "Hello.")])
    assert _step_checks() == []
    console = "django.core.mail.backends.console.EmailBackend"
    with override_settings(MAILERS={"bulk": {"BACKEND": console}}):
        assert _step_checks() == [("kumiflow.E045", "welcome")]
    with override_settings(MAILERS={"default": {"BACKEND": "no.such.Backend"}}):
        assert _step_checks() == [("kumiflow.E045", "welcome")]


def test_a_mail_step_without_a_sender_is_a_warning_when_none_is_set(registry, settings):
    from kumiflow_django import define_workflow
    from kumiflow_django import steps as s

    define_workflow("welcome", steps=[s.mail_send("a@example.com", "Hi", "Hello.")])
    define_workflow("signed", steps=[s.mail_send("a@example.com", "Hi", "Hi.", from_="x@y.z")])
    settings.DEFAULT_FROM_EMAIL = "webmaster@localhost"  # Django's own default
    assert _step_checks() == [("kumiflow.W004", "welcome")]
