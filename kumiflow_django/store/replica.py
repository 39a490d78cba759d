"""Reads on a replica: which reads may go there, and which never do.

The engine must read what it wrote, so kumiflow-django's models are read on
``KUMIFLOW_DATABASE`` (the primary) unless a request is marked
*replica-readable* (:func:`replica_reads`, set by
:class:`kumiflow_django.routers.ReplicaReadsMiddleware` for the GET and HEAD
requests of the admin's kumiflow pages and of the HTTP API's reads), and
``KUMIFLOW_READ_DATABASE`` names the replica, and
:class:`kumiflow_django.routers.ReplicaRouter` is installed. Even then:

- a read inside a transaction of the primary stays on the primary (the
  engine's own transactions, a ``select_for_update``, your ``atomic`` block);
- every write goes to the primary, whatever the queryset or the instance was
  read from (the router's ``db_for_write``);
- ``LISTEN``, the wake-ups and the engine's raw SQL use the primary's
  connection and never ask a router.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper

from kumiflow_django.conf import settings
from kumiflow_django.store.db import alias

_marked: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "kumiflow_replica_reads", default=False
)


@contextlib.contextmanager
def replica_reads(allowed: bool = True) -> Iterator[None]:
    """Within the block, kumiflow-django's reads outside a transaction may go
    to ``KUMIFLOW_READ_DATABASE`` (``allowed=False``: they may not)."""
    token = _marked.set(allowed)
    try:
        yield
    finally:
        _marked.reset(token)


def read_database() -> str | None:
    """The replica's alias (``KUMIFLOW_READ_DATABASE``), or None."""
    value = settings.READ_DATABASE
    return None if value is None else str(value)


#: The attribute that tells :class:`kumiflow_django.routers.ReplicaRouter`
#: among ``DATABASE_ROUTERS`` (the router imports this module, not the reverse).
ROUTER_FLAG = "kumiflow_replica_router"


def router_installed() -> bool:
    return any(getattr(r, ROUTER_FLAG, False) for r in router.routers)


def routed() -> bool:
    """Whether kumiflow-django's managers leave the choice of database to the
    router now: a marked block, a replica configured, the router installed."""
    return _marked.get() and read_database() is not None and router_installed()


def read_alias() -> str:
    """Where a read of a marked block goes: the replica, unless the primary is
    in a transaction (a read there must see what the transaction wrote, and a
    lock is taken on the primary)."""
    replica = read_database()
    primary = alias()
    if replica is None or not _marked.get() or connections[primary].in_atomic_block:
        return primary
    return replica


def read_connection() -> BaseDatabaseWrapper:
    """The connection of :func:`read_alias`: for the raw SQL of a page's reads."""
    return connections[read_alias()]


def marked() -> bool:
    return _marked.get()
