"""Live run streams: a run's events as server-sent events, as they are appended.

One view serves both servers. Under ASGI it answers an async iterator, so a
stream waiting for its run holds no thread; under WSGI a sync iterator,
which holds the worker thread as any streaming response does.

What wakes a stream to read its run's new events:

- On PostgreSQL (``KUMIFLOW_SSE_LISTEN``, psycopg 3.2 or later) each stream
  opens one connection of its own, LISTENs on ``kumiflow_runs`` (see
  :mod:`kumiflow_django.http.notify`) and reads through it when its run is
  announced. The stream then keeps no Django connection open: one database
  backend per stream. LISTEN starts before the first read, so no change
  falls between the two; a broken connection is reopened and read again.
- Everywhere (and as a safety net under LISTEN), a read every
  ``KUMIFLOW_SSE_POLL_INTERVAL`` seconds. A stream beyond
  ``KUMIFLOW_SSE_MAX_LISTENERS`` of its process, or one whose connection
  the database refuses, only polls: viewers cannot take every backend.

A client that goes away frees its connection at once under ASGI (Django
cancels the response, the iterator's ``finally`` closes it); under WSGI
the server notices at the next write, at the latest at the next heartbeat.

A stream lasts longer than its request, so it asks again whether its caller
may still view the run (:meth:`~kumiflow_django.http.auth.Principal.current`,
the lookup every request makes): before it sends what a read found, and at
every heartbeat. A token revoked, expired or without the view permission any
more ends the stream with an ``event: error`` message (the 401 or 403 a new
request would get) within one heartbeat, and nothing appended after it is sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncGenerator, Generator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import connections, models, transaction
from django.db.models.options import Options
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from kumiflow_django.conf import settings
from kumiflow_django.http import openapi, service, tokens
from kumiflow_django.http.auth import Principal, authenticate
from kumiflow_django.http.errors import ApiError
from kumiflow_django.http.notify import CHANNEL, listening
from kumiflow_django.http.serializers import EVENT_FIELDS, event_json
from kumiflow_django.http.views import convert, method_not_allowed, options
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from kumiflow_django.store import db
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.http")

FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})
#: Events read at most per read; a stream that is further behind reads on at once.
BATCH = 500
HEARTBEAT = b": keep-alive\n\n"
#: Sent first, once the stream listens: the client knows it is connected.
OPENED = b": connected\n\n"
ENDPOINT = next(e for e in openapi.ENDPOINTS if e.operation_id == "streamRunEvents")


class Clock:
    """How a stream tells the time and waits between two polls. The tests give a
    stream a clock of their own, so that a heartbeat is due when they say, not
    when a busy machine gets round to it."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


CLOCK = Clock()


@dataclass(frozen=True)
class Snapshot:
    """One read: the run's status and version, then its events after the client's last."""

    status: str | None  # None: the run is gone
    version: int
    events: list[tuple[Any, ...]]


@dataclass(frozen=True)
class StreamSpec:
    run_id: str
    tenant: str
    after: int
    alias: str
    #: psycopg connection parameters when the stream LISTENs; None when it polls.
    listen: dict[str, Any] | None
    #: Who follows the run: asked again while the stream lasts (:func:`denied`).
    principal: Principal


def frame(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"id: {event['version']}\nevent: {event['type']}\ndata: {data}\n\n".encode()


def end_frame(status: str | None, version: int) -> bytes:
    data = json.dumps({"status": status, "stream_version": version}, separators=(",", ":"))
    return f"event: end\ndata: {data}\n\n".encode()


def error_frame(error: ApiError) -> bytes:
    """The last message of a stream whose caller may no longer follow it: the
    error a new request would answer, in the API's error shape."""
    data = json.dumps(error.body(), ensure_ascii=False, separators=(",", ":"))
    return f"event: error\ndata: {data}\n\n".encode()


def denied(spec: StreamSpec, *, release: bool) -> bytes | None:
    """None while the stream's caller may still view its run; else the error frame
    that ends the stream. ``release``: a LISTEN stream lets go of the Django
    connection the check used, as it did when it opened."""
    try:
        viewer = spec.principal.current()
        viewer.require(tokens.VIEW)
        if spec.tenant not in viewer.tenants:  # as service.find_run sees it
            raise ApiError("not_found", "no such run")
    except ApiError as error:
        logger.info("run %s: the stream of %s ends: %s", spec.run_id, spec.principal.name, error)
        return error_frame(error)
    finally:
        if release:
            release_django_connection(spec.alias)
    return None


class RunStream:
    """What one client has been sent, what to send it after a read, and how long
    to wait for the next one (a heartbeat is due after a quiet spell)."""

    def __init__(self, after: int, clock: Clock = CLOCK) -> None:
        self.clock = clock
        self.last = after
        self.done = False
        self.next_beat = clock.now() + settings.SSE_HEARTBEAT

    def frames(self, snapshot: Snapshot) -> list[bytes]:
        """The frames of the events the client has not had, and the end once the
        run has finished and the client has all its events.

        The run row is read before the events: the events of the version the row
        shows are committed with it, so they are in the read too.
        """
        out = []
        for row in snapshot.events:
            event = event_json(row)
            if event["version"] > self.last:
                out.append(frame(event))
                self.last = event["version"]
        caught_up = self.last >= snapshot.version
        if caught_up and (snapshot.status is None or snapshot.status in FINISHED):
            out.append(end_frame(snapshot.status, snapshot.version))
            self.done = True
        if out:
            self.next_beat = self.clock.now() + settings.SSE_HEARTBEAT
        return out

    def wait_time(self, snapshot: Snapshot) -> float:
        """Seconds to wait before the next read: none if the read was cut at BATCH
        events, at most the poll interval, and no later than the next heartbeat."""
        if len(snapshot.events) >= BATCH:
            return 0.0
        until_beat = self.next_beat - self.clock.now()
        return max(0.0, min(settings.SSE_POLL_INTERVAL, until_beat))

    def idle(self) -> list[bytes]:
        """A keep-alive comment if the stream has been quiet for a heartbeat."""
        if self.clock.now() < self.next_beat:
            return []
        self.next_beat = self.clock.now() + settings.SSE_HEARTBEAT
        return [HEARTBEAT]


def read(run_id: str, tenant: str, after: int) -> Snapshot:
    """A snapshot through Django's connection (polling streams)."""
    row = (
        WorkflowRun.objects.filter(pk=run_id, tenant_id=tenant)
        .values_list("status", "version")
        .first()
    )
    events = list(
        Event.objects.filter(stream_id=run_id, tenant_id=tenant, version__gt=after)
        .order_by("version")
        .values_list(*EVENT_FIELDS)[:BATCH]
    )
    return Snapshot(row[0] if row else None, row[1] if row else 0, events)


def _sql(alias: str) -> tuple[str, str]:
    """The two reads of a snapshot, for a raw psycopg connection (PostgreSQL).

    Built from the models' metadata (quoted names, no values); values are bound.
    """
    qn = connections[alias].ops.quote_name
    run, event = WorkflowRun._meta, Event._meta

    def column(meta: Options[Any], name: str) -> str:
        field = meta.get_field(name)
        assert isinstance(field, models.Field) and field.column
        return qn(field.column)

    rc = {f: column(run, f) for f in ("id", "tenant_id", "status", "version")}
    ec = {f: column(event, f) for f in EVENT_FIELDS}
    run_sql = (
        f"SELECT {rc['status']}, {rc['version']} FROM {qn(run.db_table)} "  # noqa: S608
        f"WHERE {rc['id']} = %s AND {rc['tenant_id']} = %s"
    )
    events_sql = (
        f"SELECT {', '.join(ec.values())} FROM {qn(event.db_table)} "  # noqa: S608
        f"WHERE {ec['stream_id']} = %s AND {ec['tenant_id']} = %s AND {ec['version']} > %s "
        f"ORDER BY {ec['version']} LIMIT {BATCH}"
    )
    return run_sql, events_sql


def listen_params(alias: str) -> dict[str, Any] | None:
    """psycopg parameters of a LISTEN connection to ``alias``, or None to poll."""
    connection = connections[alias]
    if not listening() or not db.supports_listen(alias):
        return None
    if connection.in_atomic_block:
        # Opened inside a transaction (a test case, a custom wrapper): a
        # connection of its own would not see what that transaction wrote.
        return None
    try:
        import psycopg
    except ImportError:  # psycopg2: no notifies() with a timeout
        return None
    if tuple(int(p) for p in psycopg.__version__.split(".")[:2]) < (3, 2):
        return None
    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)  # Django's is a sync cursor
    # Streams are recognisable in pg_stat_activity.
    params.setdefault("application_name", "kumiflow-sse")
    return params


def last_event_id(request: HttpRequest) -> int:
    header = request.headers.get("Last-Event-ID")
    if header is not None:
        return int(convert(header.strip(), {"type": "integer", "minimum": 0}, "Last-Event-ID"))
    query = request.GET.get("last_event_id")
    if query is not None:
        return int(convert(query, {"type": "integer", "minimum": 0}, "last_event_id"))
    return 0


def open_stream(request: HttpRequest, run_id: str) -> StreamSpec | HttpResponse:
    """Check the caller and the run; the stream's parameters, or the answer instead of one."""
    try:
        principal = authenticate(request)
        principal.require(tokens.VIEW)
        run = service.find_run(principal, run_id)
        after = last_event_id(request)
    except ApiError as error:
        return error.response()
    if run.status in FINISHED and after >= run.version:
        return HttpResponse(status=204)  # nothing left: an EventSource stops reconnecting
    alias = db.alias()
    return StreamSpec(str(run.id), run.tenant_id, after, alias, listen_params(alias), principal)


class ListenSlots:
    """How many streams of this process LISTEN now, at most
    ``KUMIFLOW_SSE_MAX_LISTENERS``: each holds a database backend of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def take(self) -> bool:
        with self._lock:
            if self.taken >= settings.SSE_MAX_LISTENERS:
                return False
            self.taken += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.taken -= 1


LISTEN_SLOTS = ListenSlots()


def _refused(spec: StreamSpec, exc: BaseException) -> None:
    logger.warning(
        "run %s: the stream could not open its LISTEN connection (%s); it polls",
        spec.run_id,
        exc,
    )


def release_django_connection(alias: str) -> None:
    """Close the request's Django connection while a LISTEN stream runs: the stream
    reads through its own, so each stream holds one backend, not two."""
    connection = connections[alias]
    if not connection.in_atomic_block:
        connection.close()


class Listener:
    """A stream's own PostgreSQL connection (sync): LISTEN, wait, read.

    A broken connection surfaces in :meth:`read`; the stream then reopens it
    (LISTEN again) and reads again, so nothing that changed meanwhile is missed.
    """

    def __init__(self, spec: StreamSpec) -> None:
        assert spec.listen is not None
        self.spec = spec
        self.sql = _sql(spec.alias)
        self.conn: Any = None

    def open(self) -> None:
        import psycopg

        self.conn = psycopg.Connection.connect(autocommit=True, **self.spec.listen or {})
        self.conn.execute(f"LISTEN {CHANNEL}")

    def reopen(self) -> None:
        logger.warning("run %s: the stream's connection broke; reopening it", self.spec.run_id)
        self.close()
        time.sleep(settings.SSE_POLL_INTERVAL)
        self.open()

    def read(self, after: int) -> Snapshot:
        run_id, tenant = self.spec.run_id, self.spec.tenant
        with self.conn.cursor() as cursor:
            row = cursor.execute(self.sql[0], [run_id, tenant]).fetchone()
            events = cursor.execute(self.sql[1], [run_id, tenant, after]).fetchall()
        return Snapshot(row[0] if row else None, row[1] if row else 0, events)

    def wait(self, timeout: float) -> bool:
        """Until the run is announced (True) or ``timeout`` seconds have passed (or
        the connection broke: the next read finds out)."""
        deadline = time.monotonic() + timeout
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                notes = list(self.conn.notifies(timeout=remaining, stop_after=1))
                if any(n.payload == self.spec.run_id for n in notes):
                    return True
        except Exception as exc:
            if not _connection_lost(exc):
                raise
        return False

    def close(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            conn.close()


class AsyncListener(Listener):
    """The same with psycopg's async connection, for streams under ASGI."""

    async def aopen(self) -> None:
        import psycopg

        self.conn = await psycopg.AsyncConnection.connect(autocommit=True, **self.spec.listen or {})
        await self.conn.execute(f"LISTEN {CHANNEL}")

    async def areopen(self) -> None:
        logger.warning("run %s: the stream's connection broke; reopening it", self.spec.run_id)
        await self.aclose()
        await asyncio.sleep(settings.SSE_POLL_INTERVAL)
        await self.aopen()

    async def aread(self, after: int) -> Snapshot:
        run_id, tenant = self.spec.run_id, self.spec.tenant
        async with self.conn.cursor() as cursor:
            await cursor.execute(self.sql[0], [run_id, tenant])
            row = await cursor.fetchone()
            await cursor.execute(self.sql[1], [run_id, tenant, after])
            events = await cursor.fetchall()
        return Snapshot(row[0] if row else None, row[1] if row else 0, events)

    async def await_(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                notes = [n async for n in self.conn.notifies(timeout=remaining, stop_after=1)]
                if any(n.payload == self.spec.run_id for n in notes):
                    return True
        except Exception as exc:
            if not _connection_lost(exc):
                raise
        return False

    async def aclose(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            await conn.close()


def _connection_lost(exc: BaseException) -> bool:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - only LISTEN streams call this
        return False
    return isinstance(exc, psycopg.OperationalError)


async def astream(spec: StreamSpec, clock: Clock | None = None) -> AsyncGenerator[bytes, None]:
    """The stream's frames under ASGI."""
    run = RunStream(spec.after, clock or CLOCK)
    slot = spec.listen is not None and LISTEN_SLOTS.take()
    listener: AsyncListener | None = None
    try:
        if slot:
            listener = AsyncListener(spec)
            try:
                await listener.aopen()
            except Exception as exc:
                if not _connection_lost(exc):
                    raise
                _refused(spec, exc)
                await listener.aclose()
                listener = None
            else:
                await sync_to_async(release_django_connection)(spec.alias)
        yield OPENED
        while True:
            if listener is None:
                snapshot = await sync_to_async(read)(spec.run_id, spec.tenant, run.last)
            else:
                try:
                    snapshot = await listener.aread(run.last)
                except Exception as exc:
                    if not _connection_lost(exc):
                        raise
                    await listener.areopen()
                    continue
            out = run.frames(snapshot)
            if out and (end := await sync_to_async(denied)(spec, release=listener is not None)):
                yield end
                return
            for chunk in out:
                yield chunk
            if run.done:
                return
            if (timeout := run.wait_time(snapshot)) > 0:
                if listener is None:
                    await run.clock.asleep(timeout)
                else:
                    await listener.await_(timeout)
            beat = run.idle()
            if beat and (end := await sync_to_async(denied)(spec, release=listener is not None)):
                yield end
                return
            for chunk in beat:
                yield chunk
    finally:
        try:
            if listener is not None:
                await listener.aclose()
        finally:
            if slot:
                LISTEN_SLOTS.give_back()


def stream(spec: StreamSpec, clock: Clock | None = None) -> Generator[bytes, None, None]:
    """The stream's frames under WSGI: :func:`astream`, without ``await``."""
    run = RunStream(spec.after, clock or CLOCK)
    slot = spec.listen is not None and LISTEN_SLOTS.take()
    listener: Listener | None = None
    try:
        if slot:
            listener = Listener(spec)
            try:
                listener.open()
            except Exception as exc:
                if not _connection_lost(exc):
                    raise
                _refused(spec, exc)
                listener.close()
                listener = None
            else:
                release_django_connection(spec.alias)
        yield OPENED
        while True:
            if listener is None:
                snapshot = read(spec.run_id, spec.tenant, run.last)
            else:
                try:
                    snapshot = listener.read(run.last)
                except Exception as exc:
                    if not _connection_lost(exc):
                        raise
                    listener.reopen()
                    continue
            out = run.frames(snapshot)
            if out and (end := denied(spec, release=listener is not None)):
                yield end
                return
            yield from out
            if run.done:
                return
            if (timeout := run.wait_time(snapshot)) > 0:
                if listener is None:
                    run.clock.sleep(timeout)
                else:
                    listener.wait(timeout)
            beat = run.idle()
            if beat and (end := denied(spec, release=listener is not None)):
                yield end
                return
            yield from beat
    finally:
        try:
            if listener is not None:
                listener.close()
        finally:
            if slot:
                LISTEN_SLOTS.give_back()


@csrf_exempt
@transaction.non_atomic_requests
async def run_events_view(request: HttpRequest, run_id: str) -> HttpResponseBase:
    """``GET runs/<id>/events/``: see the module docstring and docs/live-streams.md.

    ``HEAD`` answers what ``GET`` would, without opening the stream; ``OPTIONS``
    answers ``Allow``, as every endpoint of the API does."""
    if request.method == "OPTIONS":
        return options({"get": ENDPOINT})
    if request.method not in ("GET", "HEAD"):
        return method_not_allowed({"get": ENDPOINT})
    opened = await sync_to_async(open_stream)(request, run_id)
    if isinstance(opened, HttpResponse):
        return opened
    asgi = isinstance(request, ASGIRequest)
    content: Any
    if request.method == "HEAD":  # no body: no stream, no LISTEN slot, no read
        content = _nothing() if asgi else iter(())
    else:
        content = astream(opened) if asgi else stream(opened)
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each message on at once
    return response


async def _nothing() -> AsyncGenerator[bytes, None]:
    """An empty body under ASGI (a sync iterator there makes Django warn)."""
    nothing: tuple[bytes, ...] = ()
    for chunk in nothing:
        yield chunk
