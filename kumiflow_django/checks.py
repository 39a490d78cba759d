"""System checks for the KUMIFLOW_* settings (``manage.py check``).

Ids are stable: E001-E099 settings, E100-E199 workflow definitions,
W001-W099 warnings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core import checks

from kumiflow_django.conf import PREFIX, KumiflowSettings, settings
from kumiflow_django.definition.backoff import BackoffPolicy


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _positive_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v > 0


def _tenant(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 64


def _timeouts(v: Any) -> bool:
    return (
        isinstance(v, Sequence)
        and not isinstance(v, str)
        and len(v) == 2
        and all(_positive_number(x) for x in v)
    )


def _str_mapping(v: Any) -> bool:
    return isinstance(v, Mapping) and all(
        isinstance(k, str) and isinstance(s, str) and s for k, s in v.items()
    )


def _str_sequence(v: Any) -> bool:
    return isinstance(v, Sequence) and not isinstance(v, str) and all(isinstance(x, str) for x in v)


def _retry_policy(v: Any) -> bool:
    if not isinstance(v, Mapping):
        return False
    try:
        BackoffPolicy.from_mapping(v)
    except (TypeError, ValueError):
        return False
    return True


def _optional_str(v: Any) -> bool:
    return v is None or (isinstance(v, str) and bool(v))


# setting name -> (id, validator, what it must be)
_RULES: dict[str, tuple[str, Callable[[Any], bool], str]] = {
    "DEFAULT_TENANT": ("kumiflow.E001", _tenant, "a non-empty string of at most 64 characters"),
    "EVENT_WAKE": ("kumiflow.E002", lambda v: v in ("inline", "worker"), '"inline" or "worker"'),
    "MAX_START_DEPTH": ("kumiflow.E003", _positive_int, "a positive integer"),
    "RESUME_BATCH_SIZE": ("kumiflow.E004", _positive_int, "a positive integer"),
    "MAX_INTERVAL": ("kumiflow.E005", _positive_number, "a positive number of seconds"),
    "LEASE_SECONDS": ("kumiflow.E006", _positive_number, "a positive number of seconds"),
    "DISPATCH_RETRY": (
        "kumiflow.E007",
        _retry_policy,
        "a mapping with attempts, backoff, base, max_delay and jitter",
    ),
    "WEBHOOK_SECRETS": ("kumiflow.E008", _str_mapping, "a mapping of names to non-empty strings"),
    "WEBHOOK_ALLOWED_PRIVATE_HOSTS": ("kumiflow.E009", _str_sequence, "a list of strings"),
    "WEBHOOK_TIMEOUT": ("kumiflow.E010", _timeouts, "a pair (connect, read) of positive seconds"),
    "TASKS_BACKEND": ("kumiflow.E011", _optional_str, "None or a TASKS alias"),
    "ADMIN_PAYLOAD_CHARS": ("kumiflow.E012", _positive_int, "a positive integer"),
    "CRON_MISFIRE_GRACE": ("kumiflow.E013", _positive_number, "a positive number of seconds"),
    "RESUME_THREADS": ("kumiflow.E017", _positive_int, "a positive integer"),
    "MAX_VALUE_BYTES": ("kumiflow.E018", _positive_int, "a positive integer (bytes)"),
    "MAX_STATE_BYTES": ("kumiflow.E019", _positive_int, "a positive integer (bytes)"),
    "DATABASE": (
        "kumiflow.E020",
        lambda v: isinstance(v, str) and v in django_settings.DATABASES,
        "an alias of DATABASES",
    ),
    "LISTEN_DATABASE": (
        "kumiflow.E021",
        lambda v: v is None or (isinstance(v, str) and v in django_settings.DATABASES),
        "None or an alias of DATABASES",
    ),
}


@checks.register()
def check_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for name, (check_id, valid, must_be) in _RULES.items():
        value = getattr(settings, name)
        if not valid(value):
            errors.append(
                checks.Error(
                    f"{PREFIX}{name} must be {must_be}; it is {value!r}.",
                    id=check_id,
                    obj=f"{PREFIX}{name}",
                )
            )
    alias = settings.TASKS_BACKEND
    if isinstance(alias, str) and alias:
        errors.extend(_check_tasks_backend(alias))
    known = set(KumiflowSettings.names())
    for attr in dir(django_settings):
        if attr.startswith(PREFIX) and attr[len(PREFIX) :] not in known:
            errors.append(
                checks.Warning(
                    f"{attr} is not a kumiflow-django setting (misspelt?).",
                    hint="The settings are listed in docs/settings.md.",
                    id="kumiflow.W001",
                    obj=attr,
                )
            )
    return errors


def _check_tasks_backend(alias: str) -> list[checks.CheckMessage]:
    try:
        from django.tasks import task_backends
    except ImportError:
        return [
            checks.Error(
                "KUMIFLOW_TASKS_BACKEND needs django.tasks (Django 6.0 or later).",
                id="kumiflow.E014",
                obj="KUMIFLOW_TASKS_BACKEND",
            )
        ]
    if alias not in getattr(django_settings, "TASKS", {}):
        return [
            checks.Error(
                f"KUMIFLOW_TASKS_BACKEND is {alias!r}, which is not an alias of TASKS.",
                id="kumiflow.E015",
                obj="KUMIFLOW_TASKS_BACKEND",
            )
        ]
    if not task_backends[alias].supports_defer:
        return [
            checks.Error(
                f"The TASKS backend {alias!r} cannot run tasks later (supports_defer is False).",
                hint="Use a backend with deferred tasks, such as django-tasks-db.",
                id="kumiflow.E016",
                obj="KUMIFLOW_TASKS_BACKEND",
            )
        ]
    return []


@checks.register(checks.Tags.database)
def check_sqlite_transactions(**kwargs: Any) -> list[checks.CheckMessage]:
    """SQLite must start write transactions IMMEDIATE: the engine relies on one
    writer at a time there (and DEFERRED ones deadlock a worker and a web process)."""
    return sqlite_warnings(django_settings.DATABASES)


def sqlite_warnings(databases: Mapping[str, Any]) -> list[checks.CheckMessage]:
    warnings: list[checks.CheckMessage] = []
    for alias, config in databases.items():
        if config.get("ENGINE") != "django.db.backends.sqlite3":
            continue
        mode = (config.get("OPTIONS") or {}).get("transaction_mode")
        if mode not in ("IMMEDIATE", "EXCLUSIVE"):
            warnings.append(
                checks.Warning(
                    f"The SQLite database {alias!r} does not use IMMEDIATE transactions.",
                    hint='Set DATABASES[...]["OPTIONS"]["transaction_mode"] = "IMMEDIATE" '
                    "(Django 5.1+); see the installation docs.",
                    id="kumiflow.W002",
                    obj=alias,
                )
            )
    return warnings
