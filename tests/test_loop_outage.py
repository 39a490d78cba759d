"""A database outage as the loops see it: one line when it starts, a capped
backoff with jitter between tries, one line when it ends.

The loops are driven by ``run_forever`` with their pause (``idle``) and the
outage's clock and jitter replaced: nothing waits, nothing is timed."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
from django.db import connection

from kumiflow_django.store import db
from kumiflow_django.workers.cron import CronLoop
from kumiflow_django.workers.dispatch import DispatchLoop
from kumiflow_django.workers.loop import OUTAGE_BACKOFF, Loop, Outage, summary
from kumiflow_django.workers.resume import ResumeLoop
from kumiflow_django.workers.tasks import TaskLoop


class NoJitter(random.Random):
    """The middle of every jitter range: the backoff's own sequence."""

    def uniform(self, a: float, b: float) -> float:
        return (a + b) / 2


def refused_connection() -> Any:
    """What the driver raises when the database server is away (restarting)."""
    database = connection.Database  # type: ignore[attr-defined]
    if connection.vendor == "postgresql":
        return database.OperationalError(
            'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
            "Connection refused\n\tIs the server running on that host?"
        )
    if connection.vendor == "mysql":
        return database.OperationalError(2003, "Can't connect to MySQL server (111)")
    return database.OperationalError("database is locked")


class Drive:
    """Runs ``loop.run_forever()`` here: every pause is recorded (and advances a
    fake clock) instead of waited; the loop is stopped at the ``stop_at``-th."""

    def __init__(self, loop: Loop, stop_at: int) -> None:
        self.loop = loop
        self.stop_at = stop_at
        self.pauses: list[float] = []
        self.now = 0.0
        loop.outage = Outage(f"{loop.name} loop", rng=NoJitter(), monotonic=lambda: self.now)
        loop.idle = self.idle  # type: ignore[method-assign]

    def idle(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds
        if len(self.pauses) >= self.stop_at:
            self.loop.stop()

    def run(self) -> None:
        self.loop.run_forever()


def database_away_for(monkeypatch: Any, connects: int) -> list[int]:
    """The next ``connects`` connections to the database are refused."""
    tries: list[int] = []
    wrapper = type(db.connection())
    real = wrapper.get_new_connection

    def get_new_connection(self: Any, conn_params: Any) -> Any:
        tries.append(1)
        if len(tries) <= connects:
            raise refused_connection()
        return real(self, conn_params)

    monkeypatch.setattr(wrapper, "get_new_connection", get_new_connection)
    connection.close()
    return tries


def loud(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith("kumiflow_django") and r.levelno >= logging.WARNING
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("loop_class", [ResumeLoop, DispatchLoop, CronLoop, TaskLoop])
def test_an_outage_logs_one_line_backs_off_and_one_line_at_the_end(
    loop_class, monkeypatch, caplog, registry
):
    caplog.set_level(logging.DEBUG, logger="kumiflow_django")
    failing = 7
    tries = database_away_for(monkeypatch, failing)
    loop = loop_class(max_interval=30.0)
    drive = Drive(loop, stop_at=failing + 1)
    drive.run()

    # Every failed poll tried to connect once; the eighth found the database back.
    assert len(tries) > failing
    backoff = [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert drive.pauses[:failing] == backoff
    assert len(drive.pauses) == failing + 1  # and then its ordinary pause (nothing due)
    lines = loud(caplog)
    assert [(r.levelno, r.getMessage()) for r in lines] == [
        (
            logging.WARNING,
            f"{loop.name} loop: the database is unavailable "
            f"(OperationalError: {str(refused_connection()).splitlines()[0]}); "
            "trying again with backoff",
        ),
        (logging.WARNING, f"{loop.name} loop: working again after 15.8 s (7 failed tries)"),
    ]
    assert all(r.exc_info is None for r in lines)  # no traceback for a database that is away
    still = [r for r in caplog.records if "still failing" in r.getMessage()]
    assert len(still) == failing - 1 and all(r.levelno == logging.DEBUG for r in still)


@pytest.mark.django_db(transaction=True)
def test_an_unexpected_error_logs_one_traceback_for_its_whole_outage(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="kumiflow_django")
    calls: list[int] = []

    def due_dispatches(now: Any, limit: int) -> list[Any]:
        calls.append(1)
        if len(calls) <= 3:
            raise ValueError("nobody expected this\nsecond line")
        return []

    monkeypatch.setattr("kumiflow_django.workers.dispatch.due_dispatches", due_dispatches)
    drive = Drive(DispatchLoop(max_interval=30.0), stop_at=4)
    drive.run()

    assert drive.pauses[:3] == [0.25, 0.5, 1.0]
    lines = loud(caplog)
    assert [(r.levelno, r.getMessage()) for r in lines] == [
        (
            logging.ERROR,
            "dispatch loop: failed (ValueError: nobody expected this); trying again with backoff",
        ),
        (logging.WARNING, "dispatch loop: working again after 1.8 s (3 failed tries)"),
    ]
    assert lines[0].exc_info is not None and lines[1].exc_info is None


def test_the_backoff_is_capped_and_jittered():
    """Jitter spreads the pauses of a fleet of workers; none is longer than a few seconds."""
    outage = Outage("x", rng=random.Random(7))
    error = RuntimeError("down")
    pauses = [outage.failed(error) for _ in range(40)]
    cap = OUTAGE_BACKOFF.max_delay * (1 + OUTAGE_BACKOFF.jitter)
    assert all(0 < p <= cap for p in pauses)
    assert pauses[0] <= 0.25 * 1.25 and pauses[10] >= OUTAGE_BACKOFF.max_delay * 0.75
    assert len({round(p, 6) for p in pauses[10:]}) > 1  # jittered, not in step


def test_the_listen_thread_backs_off_and_says_when_it_listens_again(monkeypatch, caplog):
    """The LISTEN thread reconnects through the same outage: one warning, no
    traceback, backoff, one line once it listens again."""
    psycopg = pytest.importorskip("psycopg")
    from kumiflow_django.workers import listener as listener_module

    caplog.set_level(logging.INFO, logger="kumiflow_django")
    monkeypatch.setattr(listener_module, "listen_params", lambda alias=None: {})
    listener = listener_module.PgListener()
    now = [0.0]
    listener.outage = Outage("LISTEN connection", rng=NoJitter(), monotonic=lambda: now[0])
    pauses: list[float] = []

    class Stopping:
        stopped = False

        def is_set(self) -> bool:
            return self.stopped

        def set(self) -> None:
            self.stopped = True

        def wait(self, seconds: float) -> bool:
            pauses.append(seconds)
            now[0] += seconds
            return self.stopped

    listener._stopping = Stopping()  # type: ignore[assignment]

    class Connection:
        def __enter__(self) -> Connection:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def execute(self, sql: str) -> None:
            pass

        def notifies(self, timeout: float) -> list[Any]:
            listener.stop()
            return []

    connects: list[int] = []

    def connect(**params: Any) -> Connection:
        connects.append(1)
        if len(connects) <= 4:
            raise psycopg.OperationalError("connection failed: Connection refused")
        return Connection()

    monkeypatch.setattr(psycopg, "connect", connect)
    monkeypatch.setattr(listener_module, "notifications_arrive", lambda conn, params: True)
    listener.run()

    assert pauses == [0.25, 0.5, 1.0, 2.0]
    lines = loud(caplog)
    assert [(r.levelno, r.getMessage()) for r in lines] == [
        (
            logging.WARNING,
            "LISTEN connection: the database is unavailable (OperationalError: connection "
            "failed: Connection refused); trying again with backoff",
        ),
        (logging.WARNING, "LISTEN connection: working again after 3.8 s (4 failed tries)"),
    ]
    assert lines[0].exc_info is None


@pytest.mark.django_db(transaction=True)
def test_the_database_going_away_mid_batch_ends_the_batch_with_one_line(monkeypatch, caplog):
    """Not a traceback per due item: the first item's error ends the batch, the
    outage says so once, and the items are tried again after the pause."""
    from django.db import OperationalError

    caplog.set_level(logging.INFO, logger="kumiflow_django")
    tried: list[object] = []
    due = [(f"d{i}", 1) for i in range(5)]
    monkeypatch.setattr(
        "kumiflow_django.workers.dispatch.due_dispatches",
        lambda now, limit: due if not tried else [],
    )

    def deliver_one(dispatch_id: object, version: int) -> bool:
        tried.append(dispatch_id)
        raise OperationalError("database is locked")  # transient on every database

    monkeypatch.setattr("kumiflow_django.workers.dispatch.deliver_one", deliver_one)
    drive = Drive(DispatchLoop(max_interval=30.0), stop_at=2)
    drive.run()

    assert tried == ["d0"]
    assert drive.pauses == [0.25, 30.0]
    assert [r.getMessage() for r in loud(caplog)] == [
        "dispatch loop: the database is unavailable (OperationalError: database is locked); "
        "trying again with backoff",
        "dispatch loop: working again after 0.2 s (1 failed tries)",
    ]


def test_a_refused_postgresql_connection_is_transient():
    """psycopg reports a refused connection without a SQLSTATE, as a closed one."""
    psycopg = pytest.importorskip("psycopg")
    from django.db import OperationalError

    for text in (
        "connection failed: connection to server at 127.0.0.1, port 5432 failed: refused",
        "consuming input failed: server closed the connection unexpectedly",
    ):
        error = OperationalError(text)
        error.__cause__ = psycopg.OperationalError(text)
        assert db.is_transient(error), text
    error = OperationalError("syntax error at or near")
    error.__cause__ = psycopg.OperationalError("syntax error at or near")
    assert not db.is_transient(error)


# -- the heartbeat: a worker is not brought down at its start ---------------------


def lost_connection() -> Exception:
    """What Django raises when the server ends the session in the middle of a
    transaction (under heavy load on PostgreSQL: its idle-in-transaction limit,
    the lease, passed between two statements of the snapshot's insert)."""
    from django.db import InterfaceError, OperationalError

    database = connection.Database  # type: ignore[attr-defined]
    if connection.vendor == "postgresql":
        from psycopg import errors

        cause = errors.lookup("25P03")("terminating connection due to idle-in-transaction timeout")
    elif connection.vendor == "mysql":
        cause = database.OperationalError(2013, "Lost connection to MySQL server during query")
    else:  # no server to lose: the connection Django finds closed
        return InterfaceError("connection already closed")
    error = OperationalError(*cause.args)
    error.__cause__ = cause
    assert db.is_transient(error) and not db.is_lock_conflict(error)
    return error


def snapshots_fail(monkeypatch: Any, times: int) -> list[int]:
    """The next ``times`` inserts into the snapshot table lose the connection."""
    from kumiflow_django.definition.snapshots import DefinitionSnapshot, forget

    forget()  # this process has stored none: the first beat inserts them
    tries: list[int] = []
    manager = DefinitionSnapshot.objects
    real = manager.bulk_create

    def bulk_create(objs: Any, *args: Any, **kwargs: Any) -> Any:
        tries.append(1)
        if len(tries) <= times:
            raise lost_connection()
        return real(objs, *args, **kwargs)

    monkeypatch.setattr(manager, "bulk_create", bulk_create)
    return tries


def paused_heartbeat(heartbeat: Any) -> list[float]:
    """The heartbeat's pauses recorded (and a fake clock advanced) instead of waited."""
    pauses: list[float] = []
    now = [0.0]
    heartbeat.outage = Outage("heartbeat", rng=NoJitter(), monotonic=lambda: now[0])

    def wait(event: Any, seconds: float) -> bool:
        pauses.append(seconds)
        now[0] += seconds
        return bool(event.is_set())

    heartbeat._wait = wait
    return pauses


def heartbeat_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in loud(caplog) if "heartbeat" in r.getMessage()]


OUTAGE_OF_THREE = [
    "heartbeat: the database is unavailable ({error}); trying again with backoff",
    "heartbeat: working again after 1.8 s (3 failed tries)",
]


@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_first_heartbeat_loses_the_database_starts_when_it_is_back(
    monkeypatch, caplog, registry
):
    """The first beat stores the definitions' snapshots; the connection lost in
    that insert (a loaded PostgreSQL) used to escape the worker's start and
    bring the worker down. Now it is an outage of the heartbeat: backoff, and
    the loops start once the beat went through."""
    from kumiflow_django import define_workflow
    from kumiflow_django import steps as s
    from kumiflow_django.definition.serving import WorkerProcess
    from kumiflow_django.workers.worker import Worker

    caplog.set_level(logging.INFO, logger="kumiflow_django")
    define_workflow("beating", steps=[s.return_(1)])
    tries = snapshots_fail(monkeypatch, 3)
    worker = Worker(dispatch=False, cron=False, tasks=False, max_interval=30.0)
    pauses = paused_heartbeat(worker.services[0])
    seen: list[bool] = []

    def idle(loop: Loop, seconds: float) -> None:
        # The loops run only after the first beat: its row is there.
        seen.append(WorkerProcess.objects.filter(pk=worker.worker_id).exists())
        worker.stop()

    monkeypatch.setattr(Loop, "idle", idle)
    worker.run()

    assert not worker.crashed
    assert len(tries) == 4 and pauses[:3] == [0.25, 0.5, 1.0]
    assert seen and all(seen)
    assert not WorkerProcess.objects.filter(pk=worker.worker_id).exists()  # left at the stop
    error = summary(lost_connection())
    assert heartbeat_lines(caplog) == [
        (logging.WARNING, OUTAGE_OF_THREE[0].format(error=error)),
        (logging.WARNING, OUTAGE_OF_THREE[1]),
    ]
    assert not any(r.exc_info for r in loud(caplog))


@pytest.mark.django_db(transaction=True)
def test_kumiflow_resume_starts_through_a_lost_first_heartbeat(monkeypatch, caplog, registry):
    """The same for the single-loop command, which writes its own heartbeat row."""
    from django.core.management import call_command

    from kumiflow_django import define_workflow
    from kumiflow_django import steps as s
    from kumiflow_django.workers import worker as worker_module

    caplog.set_level(logging.INFO, logger="kumiflow_django")
    define_workflow("beating", steps=[s.return_(1)])
    tries = snapshots_fail(monkeypatch, 3)
    heartbeats: list[list[float]] = []

    class Recorded(worker_module.Heartbeat):
        def __init__(self, worker_id: str) -> None:
            super().__init__(worker_id)
            heartbeats.append(paused_heartbeat(self))

    monkeypatch.setattr("kumiflow_django.management.loop_command.Heartbeat", Recorded)
    monkeypatch.setattr(ResumeLoop, "idle", lambda self, seconds: self.stop())
    call_command("kumiflow_resume", "--max-interval", "30", verbosity=1)  # used to raise

    [pauses] = heartbeats
    assert len(tries) == 4 and pauses[:3] == [0.25, 0.5, 1.0]
    error = summary(lost_connection())
    assert heartbeat_lines(caplog) == [
        (logging.WARNING, OUTAGE_OF_THREE[0].format(error=error)),
        (logging.WARNING, OUTAGE_OF_THREE[1]),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_stop_ends_a_first_heartbeat_that_waits_for_the_database(monkeypatch, registry):
    """A signal while the database is still away stops the worker without a beat."""
    from kumiflow_django import define_workflow
    from kumiflow_django import steps as s
    from kumiflow_django.workers.worker import Worker

    define_workflow("beating", steps=[s.return_(1)])
    snapshots_fail(monkeypatch, 1000)
    worker = Worker(dispatch=False, cron=False, tasks=False)
    pauses = paused_heartbeat(worker.services[0])
    heartbeat: Any = worker.services[0]
    real_wait = heartbeat._wait

    def wait(event: Any, seconds: float) -> bool:
        if len(pauses) == 2:
            worker.stop()  # what SIGTERM does
        return bool(real_wait(event, seconds))

    heartbeat._wait = wait
    monkeypatch.setattr(Loop, "idle", lambda self, seconds: pytest.fail("no loop polls"))
    worker.run()
    assert pauses == [0.25, 0.5, 1.0]
    assert not worker.crashed


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_thread_keeps_beating_through_an_outage_with_one_line_each_way(
    monkeypatch, caplog, registry
):
    """No traceback per failed beat: the outage's two lines, and its backoff
    (at most the heartbeat interval) between the beats."""
    from kumiflow_django.definition import serving
    from kumiflow_django.workers.worker import Heartbeat

    caplog.set_level(logging.INFO, logger="kumiflow_django")
    heartbeat = Heartbeat("h-thread")
    pauses = paused_heartbeat(heartbeat)
    beats: list[int] = []
    real_beat = serving.beat

    def beat(worker_id: str, **kwargs: Any) -> None:
        beats.append(1)
        if len(beats) <= 3:
            raise lost_connection()
        if len(beats) == 5:
            heartbeat._stop.set()
        real_beat(worker_id, **kwargs)

    monkeypatch.setattr(serving, "beat", beat)
    heartbeat._run()  # the thread's loop, here
    interval = serving.heartbeat_interval()
    assert pauses == [interval, 0.25, 0.5, 1.0, interval, interval]
    error = summary(lost_connection())
    assert heartbeat_lines(caplog) == [
        (logging.WARNING, OUTAGE_OF_THREE[0].format(error=error)),
        (logging.WARNING, OUTAGE_OF_THREE[1]),
    ]
