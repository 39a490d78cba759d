"""The console's and the HTTP API's reads on a read replica.

    DATABASES = {"default": {...}, "replica": {..., "TEST": {"MIRROR": "default"}}}
    KUMIFLOW_READ_DATABASE = "replica"
    DATABASE_ROUTERS = ["kumiflow_django.routers.ReplicaRouter"]
    MIDDLEWARE = [..., "kumiflow_django.routers.ReplicaReadsMiddleware"]

The middleware marks the GET and HEAD requests of the admin's kumiflow pages
and of the API's read endpoints (not its event streams) as replica-readable;
the router sends their reads of kumiflow-django's tables to the replica, and
every write, lock and transaction to the primary (``store/replica.py`` says
which reads never move). docs/scaling.md ("Reads on a replica").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.db import DatabaseError, InterfaceError, connections
from django.http import HttpRequest, HttpResponseBase
from django.urls import Resolver404, ResolverMatch, resolve

from kumiflow_django.store import db, replica
from kumiflow_django.store.models import EngineManager
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.replica")

#: The response headers of a request served from the replica.
SERVED_FROM_HEADER = "Kumiflow-Read-From"
LAG_HEADER = "Kumiflow-Replica-Lag"


class ReplicaRouter:
    """Reads of kumiflow-django's tables in a replica-readable request go to
    ``KUMIFLOW_READ_DATABASE`` (the primary's inside its transactions); their
    writes go to ``KUMIFLOW_DATABASE`` always. Other models are left to the
    routers after this one."""

    kumiflow_replica_router = True  # replica.ROUTER_FLAG

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        if not is_engine_model(model):
            return None
        if replica.marked():
            return replica.read_alias()
        return _instance_db(hints) or db.alias()

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        if not is_engine_model(model):
            return None
        found = _instance_db(hints)
        return found if found and found != replica.read_database() else db.alias()

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        """A row read on the replica and one of the primary are the same data."""
        same = {db.alias(), replica.read_database()}
        if obj1._state.db in same and obj2._state.db in same:
            return True
        return None

    def allow_migrate(self, database: str, app_label: str, **hints: Any) -> bool | None:
        """Nothing is migrated on the replica: it replays the primary's."""
        if database == replica.read_database():
            return False
        return None


def is_engine_model(model: Any) -> bool:
    """Whether ``model`` is one of the tables of kumiflow-django's database
    (its default manager is the engine's); the API's tokens and your own
    models are not, and are left to your routers."""
    return isinstance(getattr(model, "_default_manager", None), EngineManager)


def _instance_db(hints: dict[str, Any]) -> str | None:
    instance = hints.get("instance")
    found = getattr(getattr(instance, "_state", None), "db", None)
    return None if found is None else str(found)


@dataclass(frozen=True)
class Staleness:
    """What a page served from the replica says about itself."""

    database: str
    #: seconds behind the primary; None: the replica cannot tell
    lag: float | None

    def note(self) -> str:
        if self.lag is None:
            behind = "how far behind the primary it is cannot be told"
        else:
            behind = f"{self.lag:.1f} s behind the primary"
        return (
            f"Read from the replica ({self.database}), {behind}: what changed "
            "since may not show yet. Actions run on the primary."
        )


def replica_readable(request: HttpRequest) -> bool:
    """Whether ``request`` may read from the replica: a GET or HEAD of an admin
    page of kumiflow-django's (URL names ``kumiflow_…``) or of an API endpoint
    that reads (not an event stream, which follows the primary's log)."""
    if request.method not in ("GET", "HEAD"):
        return False
    match = _match(request)
    if match is None:
        return False
    name = match.url_name or ""
    if match.app_name == "admin":
        return name.startswith("kumiflow_")
    if "kumiflow_api" in match.app_names:
        return bool(getattr(match.func, "replica_readable", False))
    return False


def _match(request: HttpRequest) -> ResolverMatch | None:
    """The request's view: resolved already (after the URL resolution), else
    resolved here (the middleware asks before it), None when no URL matches."""
    match = getattr(request, "resolver_match", None)
    if match is not None:
        return match  # type: ignore[no-any-return]
    try:
        return resolve(request.path_info, getattr(request, "urlconf", None))
    except Resolver404:
        return None


def staleness() -> Staleness | None:
    """The replica's lag now, or None when it cannot serve (unreachable: the
    request is then served from the primary, and a warning logged)."""
    database = replica.read_database()
    if database is None or not replica.router_installed():
        return None
    started = time.monotonic()
    try:
        lag = db.replica_lag(database)
    except (InterfaceError, DatabaseError) as exc:
        logger.warning("replica %s cannot serve reads (%s): reading the primary", database, exc)
        return None
    logger.debug("replica %s: lag %s (asked in %.3f s)", database, lag, time.monotonic() - started)
    return Staleness(database, lag)


class ReplicaReadsMiddleware:
    """Marks the replica-readable requests (:func:`replica_readable`) and says
    on their pages and in their headers how stale they may be.

    The mark is one block around the rest of the request, opened and closed
    in ``__call__``: under ASGI a sync middleware's ``process_view`` and its
    ``__call__`` run in different threads (different contexts), and a mark
    set in one cannot be reset in the other."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        # ATOMIC_REQUESTS on the primary makes the view one of its transactions:
        # nothing would move (W071), and the headers must not say it did.
        primary_atomic = connections[db.alias()].settings_dict.get("ATOMIC_REQUESTS", False)
        served = staleness() if not primary_atomic and replica_readable(request) else None
        if served is None:
            return self.get_response(request)
        match = _match(request)
        if match is not None and match.app_name == "admin":
            messages.info(request, served.note(), fail_silently=True)
        with replica.replica_reads():
            response = self.get_response(request)
        response[SERVED_FROM_HEADER] = served.database
        response[LAG_HEADER] = "unknown" if served.lag is None else f"{served.lag:.3f}"
        return response
