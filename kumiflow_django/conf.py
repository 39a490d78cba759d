"""The ``KUMIFLOW_*`` settings, read lazily through one typed accessor.

Every attribute is read from ``django.conf.settings`` when it is first
asked for, then kept until a ``setting_changed`` signal of a ``KUMIFLOW_*``
setting (so ``override_settings`` works in tests) and nothing is read at
import time.
The class attributes are the documented defaults (docs/settings.md).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

PREFIX = "KUMIFLOW_"


class KumiflowSettings:
    #: The ``DATABASES`` alias of every kumiflow-django table and transaction.
    DATABASE: str = "default"
    #: Tenant used when an API call names none.
    DEFAULT_TENANT: str = "default"
    #: How an appended event wakes a run waiting for it: "inline" resumes the
    #: run in the appending transaction, "worker" marks it due for the resume loop.
    EVENT_WAKE: str = "inline"
    #: How deep workflows may start workflows (through appended events) in one transaction.
    MAX_START_DEPTH: int = 8
    #: Largest number of runs the resume loop claims per batch.
    RESUME_BATCH_SIZE: int = 100
    #: Threads (each with its own connection) that resume runs in one worker;
    #: 1 on SQLite whatever this says.
    RESUME_THREADS: int = 4
    #: Fair share of the due claim between tenants: tenant -> weight (1 to 100;
    #: tenants not named weigh 1). A tenant of weight 3 gets three runs into a
    #: batch for each run of a tenant of weight 1, when both have runs due.
    TENANT_WEIGHTS: Mapping[str, int] = MappingProxyType({})
    #: Longest sleep of a loop between two polls, in seconds.
    MAX_INTERVAL: float = 5.0
    #: Seconds a worker may hold a run's segment (and a dispatch's delivery) before
    #: another worker takes it over; also the database's idle-in-transaction limit
    #: of worker connections on PostgreSQL and MariaDB.
    LEASE_SECONDS: float = 60.0
    #: Seconds after which a worker process that sent no heartbeat counts as
    #: gone: the definitions it served are no longer served (its row is pruned).
    #: None: LEASE_SECONDS. It beats every third of this.
    WORKER_STALE_SECONDS: float | None = None
    #: Seconds a due run may wait for a worker that has its definition (its
    #: fingerprint, served by no live worker process) before it fails with
    #: ``workflow_definition_not_served``, naming the missing definition.
    UNKNOWN_DEFINITION_GRACE: float = 3600.0
    #: Longest wait for a lock of a transaction kumiflow-django opens itself, in
    #: seconds (PostgreSQL ``lock_timeout``; MariaDB workers'
    #: ``innodb_lock_wait_timeout``): a worker cut off while it waits frees its
    #: locks within this. None: half of LEASE_SECONDS (a lock wait then ends as a
    #: transient lock timeout before the statement's limit); 0: the server's setting.
    LOCK_TIMEOUT: float | None = None
    #: Longest statement of such a transaction, in seconds (``statement_timeout``;
    #: MariaDB workers' ``max_statement_time``). None: LEASE_SECONDS; 0: the server's.
    STATEMENT_TIMEOUT: float | None = None
    #: The ``DATABASES`` alias of the worker's one LISTEN connection (PostgreSQL),
    #: when ``DATABASE`` goes through a transaction-pooling PgBouncer; None: ``DATABASE``.
    LISTEN_DATABASE: str | None = None
    #: The ``DATABASES`` alias of a read replica that serves the admin's kumiflow
    #: pages and the HTTP API's reads (with ``kumiflow_django.routers``); None: no replica.
    READ_DATABASE: str | None = None
    #: Default retry policy of outbox deliveries.
    DISPATCH_RETRY: Mapping[str, Any] = MappingProxyType(
        {"attempts": 8, "backoff": "exponential", "base": 10.0, "max_delay": 3600.0, "jitter": 0.1}
    )
    #: Per-endpoint webhook secrets: name -> secret. Secrets never enter the event log.
    WEBHOOK_SECRETS: Mapping[str, str] = MappingProxyType({})
    #: Host names or IP networks a webhook may reach although they are private.
    WEBHOOK_ALLOWED_PRIVATE_HOSTS: Sequence[str] = ()
    #: Connect and read timeouts of webhook requests, in seconds.
    WEBHOOK_TIMEOUT: tuple[float, float] = (5.0, 15.0)
    #: Threads of kumiflow's own task pool in ``kumiflow_worker`` and
    #: ``kumiflow_tasks``: how many task steps' functions (plain functions, not
    #: Django ``Task`` objects) run at once in one process. Sized for I/O-bound
    #: work (each waits on a network or a disk); 0: this process runs none.
    TASK_THREADS: int = 16
    #: Largest result of a task step's function, and largest body of a webhook
    #: response a workflow awaits, in bytes of UTF-8 JSON (a result is kept in
    #: the run's state).
    MAX_RESULT_BYTES: int = 262_144
    #: Optional ``TASKS`` backend alias; wake-ups are then also enqueued as tasks.
    TASKS_BACKEND: str | None = None
    #: An occurrence later than this (seconds) is a misfire, handled by the policy.
    CRON_MISFIRE_GRACE: float = 60.0
    #: Largest payload shown in the admin timeline, in characters.
    ADMIN_PAYLOAD_CHARS: int = 2000
    #: Largest JSON value (an event's payload or metadata, a step's or a run's
    #: result, a start input), in bytes of UTF-8 JSON. Larger ones are refused
    #: where they enter, with a clear error.
    MAX_VALUE_BYTES: int = 1_048_576
    #: Largest state of a run (the results of its steps so far), in bytes of
    #: JSON; a step whose result makes it larger fails the run. Every supported
    #: database stores a row of this size with its default configuration.
    MAX_STATE_BYTES: int = 4_194_304
    #: Whom a signed-in user of the HTTP API acts for: None, the default tenant;
    #: or the dotted path of a function ``(user) -> tenant or list of tenants``
    #: (the first one is where the user's starts and appends go when the
    #: request names none; an empty list lets the user see no tenant at all).
    API_USER_TENANTS: str | None = None
    #: Runs per page of the HTTP API's run list when a request names no limit.
    API_PAGE_SIZE: int = 50
    #: The largest page of the run list a request may ask for.
    API_MAX_PAGE_SIZE: int = 500
    #: Runs ``kumiflow_retention`` deletes per transaction (``--batch-size``):
    #: short transactions, a few thousand rows each (the runs and their events).
    RETENTION_BATCH_SIZE: int = 500
    #: Seconds ``kumiflow_retention`` sleeps between two batches (``--pause``), so
    #: that the live workload gets the CPUs and the WAL flush back between them
    #: (docs/performance.md, W11); 0 deletes as fast as the database goes.
    RETENTION_PAUSE: float = 0.05
    #: Seconds between two keep-alive comments of a live run stream (SSE), so
    #: that proxies do not close an idle stream; also how soon a WSGI server
    #: notices a client that has gone.
    SSE_HEARTBEAT: float = 15.0
    #: Seconds between two reads of a live run stream when nothing wakes it: the
    #: only trigger on SQLite and MariaDB, a safety net under PostgreSQL's LISTEN.
    SSE_POLL_INTERVAL: float = 1.0
    #: Most live run streams of one process that LISTEN, each with a database
    #: connection of its own; the others (and a stream whose connection the
    #: database refuses) poll every SSE_POLL_INTERVAL instead. Bounds the
    #: backends that viewers can hold: processes x this.
    SSE_MAX_LISTENERS: int = 20
    #: Whether live run streams on PostgreSQL LISTEN for changes of their run
    #: (one connection per stream), and every transaction that changed a run
    #: announces it with NOTIFY (one round trip after its commit). None: only
    #: where the API's live streams are mounted (its URLs are in ROOT_URLCONF).
    #: False behind a transaction-pooling PgBouncer, which cannot LISTEN.
    SSE_LISTEN: bool | None = None
    #: OpenTelemetry spans (``kumiflow-django[otel]``): None, on when
    #: ``opentelemetry-api`` is installed; True, on (an error if it is not);
    #: False, off. Read once, at start-up.
    TRACING: bool | None = None
    #: Prometheus metrics (``kumiflow-django[metrics]``), like TRACING for
    #: ``prometheus-client``.
    METRICS: bool | None = None
    #: Bearer token(s) that may read the metrics endpoints; None: the web view
    #: lets in only users with ``kumiflow.view_workflowrun``, and the worker's
    #: endpoint anyone who can reach it.
    METRICS_TOKEN: str | Sequence[str] | None = None

    def __getattribute__(self, name: str) -> Any:
        if name.isupper():
            try:
                return _read[name]
            except KeyError:
                default = object.__getattribute__(self, name)
                changes = _changes
                value = getattr(django_settings, PREFIX + name, default)
                with _keeping:
                    if changes == _changes:  # else read before a change: not kept
                        _read[name] = value
                return value
        return object.__getattribute__(self, name)

    @classmethod
    def names(cls) -> list[str]:
        return [n for n in vars(cls) if n.isupper()]


#: The values read so far: the engine reads some settings several times per
#: segment, and Django's settings object costs more than a dict. Emptied by
#: ``setting_changed``, which ``override_settings`` (and pytest-django's
#: ``settings`` fixture when it sets one) send; Django's settings are not
#: changed at runtime otherwise. Deleting a setting with pytest-django's
#: fixture sends none: set it to its default instead.
_read: dict[str, Any] = {}
#: ``setting_changed`` signals seen so far, and the lock that makes "nothing
#: changed since this value was read" and its keeping one step: a thread that
#: read a value just before a change does not keep it past the change.
_changes = 0
_keeping = threading.Lock()


def _forget(*, setting: str, **kwargs: Any) -> None:
    global _changes
    if setting.startswith(PREFIX):
        with _keeping:
            _changes += 1
            _read.clear()


setting_changed.connect(_forget, dispatch_uid="kumiflow-settings")

settings = KumiflowSettings()
