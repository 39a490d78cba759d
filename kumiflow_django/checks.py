"""System checks for the KUMIFLOW_* settings (``manage.py check``).

Ids are stable: E001-E099 settings, E100-E199 workflow definitions,
W001-W099 warnings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from django.apps import apps
from django.conf import global_settings
from django.conf import settings as django_settings
from django.core import checks

from kumiflow_django.conf import PREFIX, KumiflowSettings, settings
from kumiflow_django.definition.backoff import BackoffPolicy
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.step import Step, path_text, walk
from kumiflow_django.definition.workflow import Workflow, child_cycle
from kumiflow_django.engine.deploys import DeployPlan
from kumiflow_django.observability import LIBRARIES, available
from kumiflow_django.store import db, replica


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
    "WORKER_STALE_SECONDS": (
        "kumiflow.E072",
        lambda v: v is None or _positive_number(v),
        "None (the lease) or a positive number of seconds",
    ),
    "UNKNOWN_DEFINITION_GRACE": (
        "kumiflow.E073",
        _positive_number,
        "a positive number of seconds",
    ),
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
    "RETENTION_BATCH_SIZE": ("kumiflow.E080", _positive_int, "a positive integer (runs)"),
    "RETENTION_PAUSE": (
        "kumiflow.E081",
        lambda v: _positive_number(v) or (v == 0 and not isinstance(v, bool)),
        "zero or a positive number of seconds",
    ),
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


def _registered_steps() -> Iterator[tuple[Workflow, list[Any], Step]]:
    """Every step of every registered workflow version, with its path: what the
    checks of steps walk (at startup, once the ``workflows.py`` modules are in)."""
    for workflow in registry.all_versions():
        for path, step in walk(workflow.steps):
            yield workflow, list(path), step


def _where(workflow: Workflow, path: list[Any], step: Step) -> str:
    version = f" (version {workflow.version})" if workflow.version else ""
    named = repr(step.name) if step.name else step.kind
    return f"Workflow {workflow.name!r}{version}, step {path_text(path)} ({named})"


@checks.register()
def check_step_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    """The settings that webhook and mail steps rely on exist: a missing secret
    or mailer would otherwise show only as a dead delivery of a completed run."""
    errors: list[checks.CheckMessage] = []
    secrets = settings.WEBHOOK_SECRETS if _str_mapping(settings.WEBHOOK_SECRETS) else {}
    mail_steps: list[tuple[Workflow, list[Any], Step]] = []
    for workflow, path, step in _registered_steps():
        if step.kind == "webhook_send":
            secret = step.args.get("secret")
            if isinstance(secret, str) and secret not in secrets:
                errors.append(
                    checks.Error(
                        f"{_where(workflow, path, step)} signs with the secret {secret!r}, "
                        f"which {PREFIX}WEBHOOK_SECRETS does not have.",
                        hint=f"Add {PREFIX}WEBHOOK_SECRETS = {{{secret!r}: ...}} to the settings "
                        "(the receiver checks the signature with the same secret).",
                        id="kumiflow.E044",
                        obj=workflow.name,
                    )
                )
        elif step.kind == "mail_send":
            mail_steps.append((workflow, path, step))
    if not mail_steps:
        return errors
    workflow, path, step = mail_steps[0]
    problem = _mail_backend_problem()
    if problem:
        errors.append(
            checks.Error(
                f"{_where(workflow, path, step)} sends a mail, but {problem}.",
                hint="Configure Django's mail: MAILERS['default'] (Django 6.1) or EMAIL_BACKEND.",
                id="kumiflow.E045",
                obj=workflow.name,
            )
        )
    if django_settings.DEFAULT_FROM_EMAIL == global_settings.DEFAULT_FROM_EMAIL:
        for workflow, path, step in mail_steps:
            if step.args.get("from_") is None:
                errors.append(
                    checks.Warning(
                        f"{_where(workflow, path, step)} sends a mail without from_, and "
                        "DEFAULT_FROM_EMAIL is not set: it would go out from "
                        f"{django_settings.DEFAULT_FROM_EMAIL!r}.",
                        hint="Set DEFAULT_FROM_EMAIL, or give the step a from_.",
                        id="kumiflow.W004",
                        obj=workflow.name,
                    )
                )
                break
    return errors


def _mail_backend_problem() -> str | None:
    """Why Django cannot make the default mail connection, or None."""
    from django.utils.module_loading import import_string

    if hasattr(django_settings, "MAILERS"):  # Django 6.1
        mailers = django_settings.MAILERS
        if not isinstance(mailers, Mapping) or "default" not in mailers:
            return "MAILERS has no 'default' mailer"
        backend = (mailers["default"] or {}).get(
            "BACKEND", "django.core.mail.backends.smtp.EmailBackend"
        )
        where = "MAILERS['default']['BACKEND']"
    else:
        backend, where = django_settings.EMAIL_BACKEND, "EMAIL_BACKEND"
    try:
        import_string(backend)
    except ImportError as exc:
        return f"{where} ({backend!r}) cannot be imported ({exc})"
    return None


@checks.register()
def check_task_backends(**kwargs: Any) -> list[checks.CheckMessage]:
    """Every task step whose function is a Django ``Task`` names a configured backend."""
    configured = set(getattr(django_settings, "TASKS", None) or {"default": None})
    errors: list[checks.CheckMessage] = []
    for workflow, path, step in _registered_steps():
        backend = getattr(step.args.get("fn"), "backend", None) if step.kind == "task" else None
        if isinstance(backend, str) and backend not in configured:
            errors.append(
                checks.Error(
                    f"{_where(workflow, path, step)}: its task names the backend {backend!r}, "
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


def isolation_warnings(databases: Mapping[str, Any], alias: str) -> list[checks.CheckMessage]:
    name = db.configured_isolation(databases.get(alias) or {})
    if name is None or name in ("read committed", "read uncommitted"):
        return []
    default = name == "the server's default"
    said = "the server's default level (REPEATABLE READ)" if default else name.upper()
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


@checks.register(checks.Tags.database)
def check_prepared_statements(**kwargs: Any) -> list[checks.CheckMessage]:
    """Prepared statements are opt-in (docs/scaling.md, "Prepared statements"):
    one asked for where Django binds on the client is never used."""
    return prepared_statement_warnings(django_settings.DATABASES, str(settings.DATABASE))


def prepared_statement_warnings(
    databases: Mapping[str, Any], alias: str
) -> list[checks.CheckMessage]:
    config = databases.get(alias) or {}
    if str(config.get("ENGINE", "")).rsplit(".", 1)[-1] != "postgresql":
        return []
    options = config.get("OPTIONS") or {}
    if options.get("prepare_threshold") is None or options.get("server_side_binding") is True:
        return []
    return [
        checks.Warning(
            f"The database {alias!r} that kumiflow-django uses sets prepare_threshold "
            "without server_side_binding: Django binds parameters on the client then, "
            "and psycopg prepares no statement.",
            hint='Set "server_side_binding": True beside it (not behind a transaction-'
            "pooling PgBouncer older than 1.21, or without its max_prepared_statements), "
            'or remove "prepare_threshold" (docs/scaling.md, "Prepared statements").',
            id="kumiflow.W062",
            obj=alias,
        )
    ]


@checks.register()
def check_read_database(**kwargs: Any) -> list[checks.CheckMessage]:
    """A replica for the console's and the API's reads only works with the
    router and the middleware of ``kumiflow_django.routers``; without the
    router, reads stay on the primary (and nothing writes to the replica)."""
    return read_database_errors(
        settings.READ_DATABASE,
        django_settings.DATABASES,
        str(settings.DATABASE),
        list(getattr(django_settings, "DATABASE_ROUTERS", [])),
        list(getattr(django_settings, "MIDDLEWARE", None) or []),
    )


ROUTER = "kumiflow_django.routers.ReplicaRouter"
MIDDLEWARE = "kumiflow_django.routers.ReplicaReadsMiddleware"


def read_database_errors(
    replica_alias: Any,
    databases: Mapping[str, Any],
    primary: str,
    routers: list[Any],
    middleware: list[str],
) -> list[checks.CheckMessage]:
    if replica_alias is None:
        return []
    if (
        not isinstance(replica_alias, str)
        or replica_alias not in databases
        or replica_alias == primary
    ):
        return [
            checks.Error(
                f"KUMIFLOW_READ_DATABASE must be None or an alias of DATABASES other "
                f"than KUMIFLOW_DATABASE ({primary!r}), not {replica_alias!r}.",
                id="kumiflow.E070",
            )
        ]
    if not any(r == ROUTER or getattr(r, replica.ROUTER_FLAG, False) for r in routers):
        return [
            checks.Error(
                f"KUMIFLOW_READ_DATABASE is {replica_alias!r} but DATABASE_ROUTERS does not "
                f"list {ROUTER!r}: every read stays on the primary.",
                hint=f'DATABASE_ROUTERS = ["{ROUTER}", ...] (docs/scaling.md).',
                id="kumiflow.E071",
            )
        ]
    if MIDDLEWARE not in middleware:
        return [
            checks.Warning(
                f"KUMIFLOW_READ_DATABASE is {replica_alias!r} but MIDDLEWARE does not list "
                f"{MIDDLEWARE!r}: no request is marked as one that may read the replica.",
                hint="Add it to MIDDLEWARE, or mark reads with "
                "kumiflow_django.replica_reads() yourself.",
                id="kumiflow.W070",
            )
        ]
    if (databases.get(primary) or {}).get("ATOMIC_REQUESTS"):
        return [
            checks.Warning(
                f"KUMIFLOW_READ_DATABASE is {replica_alias!r} but {primary!r} has "
                "ATOMIC_REQUESTS: every request is a transaction of the primary, and "
                "reads inside one stay there, so nothing reads the replica.",
                hint="Turn ATOMIC_REQUESTS off, or decorate the console's and the "
                "API's views with non_atomic_requests.",
                id="kumiflow.W071",
            )
        ]
    return []


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
    for workflow, path, step in _registered_steps():
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


#: Runs the deploy-plan check reads one by one at most (those whose definition
#: is not registered here); the others are counted by one grouped query.
PLAN_CHECK_LIMIT = 1000


@checks.register()
def check_deploy_plan(**kwargs: Any) -> list[checks.CheckMessage]:
    """Runs in flight that this process's definitions would fail, at startup
    (a warning: the process may well be an old one; ``kumiflow_plan`` says more)."""
    plan = DeployPlan(limit=PLAN_CHECK_LIMIT)
    try:
        failing = plan.failing()
    except Exception:  # no table yet (before migrate), no database: nothing to say
        return []
    if not failing:
        return []
    counted = f"at least {failing}" if plan.truncated else str(failing)
    return [
        checks.Warning(
            f"{counted} run(s) in flight would fail when they resume in this process: "
            "their definition changed in a way that is incompatible for them, and is "
            "not registered here.",
            hint="Run manage.py kumiflow_plan for where and what changed; keep the old "
            "definitions registered with their version= until their runs drain "
            "(docs/deploying.md).",
            id="kumiflow.W080",
        )
    ]
