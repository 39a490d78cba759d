"""System checks for the KUMIFLOW_* settings (``manage.py check``).

Ids are stable: E001-E099 settings, E100-E199 workflow definitions,
W001-W099 warnings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.apps import apps
from django.conf import settings as django_settings
from django.core import checks

from kumiflow_django.conf import PREFIX, KumiflowSettings, settings
from kumiflow_django.definition.backoff import BackoffPolicy
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.step import path_text, walk
from kumiflow_django.definition.workflow import child_cycle
from kumiflow_django.observability import LIBRARIES, available


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _non_negative_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


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


def _optional_callable_path(v: Any) -> bool:
    """None, or a dotted path that imports to something callable."""
    if v is None:
        return True
    if not isinstance(v, str):
        return False
    from django.utils.module_loading import import_string

    try:
        return callable(import_string(v))
    except ImportError:
        return False


def _optional_bool(v: Any) -> bool:
    return v is None or isinstance(v, bool)


#: Shortest metrics token: guessing one must be out of reach.
MIN_TOKEN_LENGTH = 24


def _tokens(v: Any) -> bool:
    values = [v] if isinstance(v, str) else v
    return v is None or (
        isinstance(values, Sequence)
        and bool(values)
        and all(
            isinstance(t, str) and len(t) >= MIN_TOKEN_LENGTH and t.strip() == t for t in values
        )
    )


def _tenant_weights(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        _tenant(tenant)
        and isinstance(weight, int)
        and not isinstance(weight, bool)
        and 1 <= weight <= 100
        for tenant, weight in value.items()
    )


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
    "TRACING": ("kumiflow.E030", _optional_bool, "None, True or False"),
    "METRICS": ("kumiflow.E031", _optional_bool, "None, True or False"),
    "METRICS_TOKEN": (
        "kumiflow.E032",
        _tokens,
        f"None, or a token (or a list of tokens) of at least {MIN_TOKEN_LENGTH} characters "
        "without surrounding spaces",
    ),
    "DATABASE": (
        "kumiflow.E020",
        lambda v: isinstance(v, str) and v in django_settings.DATABASES,
        "an alias of DATABASES",
    ),
    "API_USER_TENANTS": (
        "kumiflow.E021",
        _optional_callable_path,
        "None or the dotted path of a function (user) -> tenant(s)",
    ),
    "API_PAGE_SIZE": ("kumiflow.E022", _positive_int, "a positive integer"),
    "API_MAX_PAGE_SIZE": ("kumiflow.E023", _positive_int, "a positive integer"),
    "SSE_HEARTBEAT": ("kumiflow.E024", _positive_number, "a positive number of seconds"),
    "SSE_POLL_INTERVAL": ("kumiflow.E025", _positive_number, "a positive number of seconds"),
    "SSE_MAX_LISTENERS": ("kumiflow.E029", _non_negative_int, "zero or a positive integer"),
    "TASK_THREADS": ("kumiflow.E040", _non_negative_int, "zero or a positive integer"),
    "MAX_RESULT_BYTES": ("kumiflow.E041", _positive_int, "a positive integer (bytes)"),
    "TENANT_WEIGHTS": (
        "kumiflow.E050",
        _tenant_weights,
        "a mapping of tenants to integer weights from 1 to 100",
    ),
    "LOCK_TIMEOUT": (
        "kumiflow.E060",
        lambda v: v is None or (_positive_number(v) or v == 0),
        "None (half the lease), 0 (the server's) or a positive number of seconds",
    ),
    "STATEMENT_TIMEOUT": (
        "kumiflow.E061",
        lambda v: v is None or (_positive_number(v) or v == 0),
        "None (the lease), 0 (the server's) or a positive number of seconds",
    ),
    "SSE_LISTEN": (
        "kumiflow.E026",
        lambda v: v is None or isinstance(v, bool),
        "None, True or False",
    ),
    "LISTEN_DATABASE": (
        "kumiflow.E028",
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
    page, most = settings.API_PAGE_SIZE, settings.API_MAX_PAGE_SIZE
    if _positive_int(page) and _positive_int(most) and page > most:
        errors.append(
            checks.Error(
                f"{PREFIX}API_PAGE_SIZE ({page}) is larger than "
                f"{PREFIX}API_MAX_PAGE_SIZE ({most}).",
                id="kumiflow.E027",
                obj=f"{PREFIX}API_PAGE_SIZE",
            )
        )
    result, value = settings.MAX_RESULT_BYTES, settings.MAX_VALUE_BYTES
    if _positive_int(result) and _positive_int(value) and result > value:
        errors.append(
            checks.Error(
                f"{PREFIX}MAX_RESULT_BYTES ({result}) is larger than "
                f"{PREFIX}MAX_VALUE_BYTES ({value}): a result is stored as a value.",
                id="kumiflow.E043",
                obj=f"{PREFIX}MAX_RESULT_BYTES",
            )
        )
    alias = settings.TASKS_BACKEND
    if isinstance(alias, str) and alias:
        errors.extend(_check_tasks_backend(alias))
    errors.extend(_check_integrations())
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


#: The extra that installs each integration's library.
_EXTRAS = {"TRACING": ("kumiflow.E033", "otel"), "METRICS": ("kumiflow.E034", "metrics")}


def _check_integrations() -> list[checks.CheckMessage]:
    """An integration switched on (True) whose library is missing."""
    errors: list[checks.CheckMessage] = []
    for name, (check_id, extra) in _EXTRAS.items():
        if getattr(settings, name) is True and not available(LIBRARIES[name]):
            errors.append(
                checks.Error(
                    f"{PREFIX}{name} is True, but {LIBRARIES[name].split('.')[0]} "
                    "cannot be imported.",
                    hint=f"pip install 'kumiflow-django[{extra}]', or set {PREFIX}{name} = None "
                    "(on when installed).",
                    id=check_id,
                    obj=f"{PREFIX}{name}",
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


@checks.register()
def check_task_backends(**kwargs: Any) -> list[checks.CheckMessage]:
    """Every task step whose function is a Django ``Task`` names a configured backend."""
    configured = set(getattr(django_settings, "TASKS", None) or {"default": None})
    errors: list[checks.CheckMessage] = []
    for workflow in registry.all_versions():
        for path, step in walk(workflow.steps):
            backend = getattr(step.args.get("fn"), "backend", None) if step.kind == "task" else None
            if isinstance(backend, str) and backend not in configured:
                errors.append(
                    checks.Error(
                        f"Workflow {workflow.name!r}, step {path_text(list(path))} "
                        f"({step.name!r}): its task names the backend {backend!r}, "
                        "which is not an alias of TASKS.",
                        hint=f"Add {backend!r} to TASKS or use a task of a configured backend.",
                        id="kumiflow.E042",
                        obj=workflow.name,
                    )
                )
    return errors


@checks.register()
def check_child_workflows(**kwargs: Any) -> list[checks.CheckMessage]:
    """Every child step names a registered workflow; no workflows always start
    each other (a tree without end)."""
    errors: list[checks.CheckMessage] = []
    for workflow in registry.current():
        for path, step in walk(workflow.steps):
            if step.kind == "child" and not registry.is_registered(step.args["workflow"]):
                errors.append(
                    checks.Error(
                        f"Workflow {workflow.name!r}, step {path_text(list(path))} "
                        f"({step.name!r}) starts the workflow {step.args['workflow']!r} as a "
                        "child, which is not registered.",
                        hint="Define it in a workflows.py module of an installed app.",
                        id="kumiflow.E110",
                        obj=workflow.name,
                    )
                )
        cycle = child_cycle(
            workflow, lambda name: registry.get(name) if registry.is_registered(name) else None
        )
        if cycle:
            errors.append(
                checks.Error(
                    f"Workflow {workflow.name!r} always starts itself through its children: "
                    f"{' -> '.join(cycle)}.",
                    hint="Start the child under a condition (a branch step) if this is meant.",
                    id="kumiflow.E111",
                    obj=workflow.name,
                )
            )
    return errors


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


@checks.register()
def check_isolation_level(**kwargs: Any) -> list[checks.CheckMessage]:
    """Flow control counts a key's active runs under the key's row lock: a
    snapshot older than the lock (REPEATABLE READ, SERIALIZABLE) misses runs
    admitted meanwhile, and a limit could let more in."""
    return isolation_warnings(django_settings.DATABASES, str(settings.DATABASE))


#: The level each backend runs at when ``OPTIONS`` does not name one.
_READ_COMMITTED = {"postgresql": "read committed", "mysql": "read committed"}


def isolation_warnings(databases: Mapping[str, Any], alias: str) -> list[checks.CheckMessage]:
    config = databases.get(alias) or {}
    vendor = str(config.get("ENGINE", "")).rsplit(".", 1)[-1]
    options = config.get("OPTIONS") or {}
    if vendor not in _READ_COMMITTED or "isolation_level" not in options:
        return []  # SQLite has one writer at a time; the others default to READ COMMITTED
    level = options["isolation_level"]
    if vendor == "postgresql":
        from django.db.backends.postgresql.psycopg_any import IsolationLevel

        try:
            # the driver's constant (psycopg 2 and 3 number the levels differently)
            name = IsolationLevel(level).name.replace("_", " ").lower()
        except ValueError:
            return []  # Django itself refuses it when it connects
    else:  # MySQL and MariaDB: a name, or None for the server's default
        name = "the server's default" if level is None else str(level).lower()
    if name in ("read committed", "read uncommitted"):
        return []
    said = "the server's default level (REPEATABLE READ)" if level is None else name.upper()
    return [
        checks.Warning(
            f"The database {alias!r} that kumiflow-django uses runs its transactions "
            f"at {said}: flow-control limits are exact only under READ COMMITTED.",
            hint='Leave DATABASES[...]["OPTIONS"]["isolation_level"] unset (Django '
            "runs PostgreSQL and MySQL at READ COMMITTED), or give kumiflow-django "
            "an alias of its own with KUMIFLOW_DATABASE.",
            id="kumiflow.W003",
            obj=alias,
        )
    ]


@checks.register(checks.Tags.database)
def check_bounded_stalls(**kwargs: Any) -> list[checks.CheckMessage]:
    """A worker host that loses the network holds its locks until the server
    notices: only TCP keepalives and a user timeout bound that wait."""
    return stall_warnings(django_settings.DATABASES, str(settings.DATABASE))


#: libpq's parameters that bound how long a dead peer goes unnoticed.
KEEPALIVE_OPTIONS = ("keepalives_idle", "keepalives_interval", "keepalives_count")


def stall_warnings(databases: Mapping[str, Any], alias: str) -> list[checks.CheckMessage]:
    config = databases.get(alias) or {}
    if str(config.get("ENGINE", "")).rsplit(".", 1)[-1] != "postgresql":
        return []  # MariaDB: the workers' session limits (idle_transaction_timeout) bound it
    options = config.get("OPTIONS") or {}
    missing = [name for name in (*KEEPALIVE_OPTIONS, "tcp_user_timeout") if name not in options]
    if str(options.get("keepalives", 1)) == "0":
        missing.insert(0, "keepalives")
    found: list[checks.CheckMessage] = []
    if missing:
        found.append(
            checks.Warning(
                f"The database {alias!r} that kumiflow-django uses sets no "
                f"{', '.join(missing)}: a worker whose network is cut mid-transaction "
                "holds its locks until TCP gives up (minutes to hours).",
                hint='Set them in DATABASES[...]["OPTIONS"], e.g. "keepalives": 1, '
                '"keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3, '
                '"tcp_user_timeout": 30000 (docs/scaling.md, "Bounded stalls").',
                id="kumiflow.W060",
                obj=alias,
            )
        )
    unbounded = [
        name for name in ("LOCK_TIMEOUT", "STATEMENT_TIMEOUT") if getattr(settings, name) == 0
    ]
    if unbounded:
        found.append(
            checks.Warning(
                f"{' and '.join(PREFIX + name for name in unbounded)} 0: the engine's "
                "transactions wait as long as the server lets them (unbounded by default).",
                hint="Leave them None (from the lease), unless the server or the role bounds them.",
                id="kumiflow.W061",
                obj=alias,
            )
        )
    return found


#: Step kinds whose ``model`` argument names a Django model.
MODEL_STEP_PREFIXES = ("read.", "model.")


@checks.register()
def check_model_labels(**kwargs: Any) -> list[checks.CheckMessage]:
    """Every ``"app_label.ModelName"`` a read or model step names is an installed
    model: a typo fails ``manage.py check`` (and ``runserver``, ``migrate``) at
    startup, not a run in production. (Labels are checked when the workflow is
    defined only if the app registry is ready then, which it is not while
    ``workflows.py`` modules are imported.)"""
    errors: list[checks.CheckMessage] = []
    for workflow in registry.all_versions():
        for path, step in walk(workflow.steps):
            label = step.args.get("model") if step.kind.startswith(MODEL_STEP_PREFIXES) else None
            if not isinstance(label, str):
                continue
            try:
                if label.count(".") != 1:
                    raise LookupError("it is not of the form 'app_label.ModelName'")
                apps.get_model(label)
            except LookupError as exc:
                version = f" (version {workflow.version})" if workflow.version else ""
                errors.append(
                    checks.Error(
                        f"Workflow {workflow.name!r}{version}, step {path_text(path)} "
                        f"({step.kind}): {label!r} is not an installed model ({exc}).",
                        hint="Use 'app_label.ModelName' of an app in INSTALLED_APPS "
                        "(the app label is the last part of the app's name by default).",
                        id="kumiflow.E100",
                        obj=workflow.name,
                    )
                )
    return errors
