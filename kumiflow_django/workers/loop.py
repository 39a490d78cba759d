"""The shape every background loop shares (resume, dispatch, cron).

A loop does a batch of work, then sleeps until the earliest wake time it
knows, bounded by ``max_interval``. It knows the one its database had when
the batch ended (``next_due``) and every one announced since the batch
began: work committed in this process, or (PostgreSQL) by another process,
whose ``NOTIFY`` carries the wake time. Work due now ends the sleep at once;
a timer earlier than the one it sleeps for shortens it, without a poll; a
later one changes nothing. ``stop()`` makes it finish the item at hand and
return. Commands are thin shells around these classes; tests call
``run_once()`` directly.

A batch that raises (the database is away: restarting, unreachable) is an
:class:`Outage`: one line when it starts, a capped exponential backoff with
jitter between tries, one line when a try succeeds again.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

from django.conf import settings as django_settings
from django.db import reset_queries
from django.db.backends.signals import connection_created

from kumiflow_django.definition.backoff import BackoffPolicy
from kumiflow_django.store import clock, db, wakeups
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.workers.loop")

#: The pauses between tries while a loop's database is away: 0.25 s, doubled
#: after each failed try up to 4 s, give or take a quarter (so the workers of
#: a fleet do not come back in step). Short, so that a loop is back within
#: seconds of the database.
OUTAGE_BACKOFF = BackoffPolicy(backoff="exponential", base=0.25, max_delay=4.0, jitter=0.25)


def summary(error: BaseException) -> str:
    """An error on one line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class Outage:
    """What a loop does while its work keeps failing (the database is away).

    The first failure logs one line: a warning with the error's summary when
    the database is away for now (:func:`~kumiflow_django.store.db.is_transient`),
    an error with its traceback otherwise (something nobody expected). The
    failures after it log at debug level only. Each failure answers how long
    to pause (:data:`OUTAGE_BACKOFF`); the first success after them logs one
    line with how long the outage lasted and ends it. One per loop (its pool
    threads share it) and one for the LISTEN thread: each says its own start
    and end.
    """

    def __init__(
        self,
        name: str,
        *,
        backoff: BackoffPolicy = OUTAGE_BACKOFF,
        rng: random.Random | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.backoff = backoff
        self.rng = rng
        self.monotonic = monotonic
        #: Failed tries since the last success (0: no outage).
        self.failures = 0
        self._since = 0.0
        self._lock = threading.Lock()

    def failed(self, error: BaseException, *, away: bool | None = None) -> float:
        """Count a failed try; the seconds to pause before the next one.
        ``away``: whether ``error`` says the database is away (default: what
        :func:`~kumiflow_django.store.db.is_transient` says of a Django error)."""
        with self._lock:
            self.failures += 1
            failures = self.failures
            if failures == 1:
                self._since = self.monotonic()
        pause = self.backoff.delay(failures, self.rng).total_seconds()
        if failures == 1:
            if db.is_transient(error) if away is None else away:
                logger.warning(
                    "%s: the database is unavailable (%s); trying again with backoff",
                    self.name,
                    summary(error),
                )
            else:
                logger.error(
                    "%s: failed (%s); trying again with backoff",
                    self.name,
                    summary(error),
                    exc_info=error,
                )
        else:
            logger.debug(
                "%s: still failing (%s); next try in %.2f s", self.name, summary(error), pause
            )
        return pause

    def succeeded(self) -> None:
        """A try worked: end the outage, if there was one, with one line."""
        with self._lock:
            failures, self.failures = self.failures, 0
        if failures:
            logger.warning(
                "%s: working again after %.1f s (%d failed tries)",
                self.name,
                self.monotonic() - self._since,
                failures,
            )


class Loop:
    name: ClassVar[str] = "loop"
    #: The kinds of committed work (see ``wakeups``) that wake this loop.
    kinds: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, batch_size: int = 100, max_interval: float = 5.0) -> None:
        self.batch_size = batch_size
        self.max_interval = max_interval
        self._stopping = threading.Event()
        #: Guards the two below; ``idle`` waits on it.
        self._wakeup = threading.Condition()
        #: Poll at once: work due now was announced, or ``stop()`` was called.
        self._poll_now = False
        #: The earliest wake time announced since the current batch began
        #: (what was announced before it is in the database, for the batch
        #: and ``next_due`` to read).
        self._announced: datetime | None = None
        self.outage = Outage(f"{self.name} loop")

    # -- to implement ------------------------------------------------------
    def run_once(self) -> int:
        """Handle one batch of due work; return how many items were handled."""
        raise NotImplementedError

    def next_due(self) -> datetime | None:
        """When the next known item becomes due, if any."""
        return None

    # -- running -----------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        self._stopping.set()
        self.wake()

    def wake(self) -> None:
        """End the current (or the next) sleep at once: there is work to do now."""
        with self._wakeup:
            self._poll_now = True
            self._wakeup.notify_all()

    def notify(self, kind: str, when: datetime | None = None) -> None:
        """Work of ``kind`` was committed, due at ``when`` (None: now).

        Due now: the loop polls at once. Due later: the loop's sleep ends no
        later than ``when`` (a sleep for an earlier time goes on unchanged)."""
        if kind not in self.kinds:
            return
        if when is None or when <= clock.now():
            self.wake()
            return
        with self._wakeup:
            if self._announced is None or when < self._announced:
                self._announced = when
                self._wakeup.notify_all()

    def sleep_seconds(self) -> float:
        """Seconds until the earliest known wake time (``next_due`` or one
        announced since the batch began), at most ``max_interval``."""
        due = self.next_due()
        with self._wakeup:
            announced = self._announced
        if announced is not None and (due is None or announced < due):
            due = announced
        if due is None:
            return self.max_interval
        seconds = (due - clock.now()).total_seconds()
        return min(max(seconds, 0.0), self.max_interval)

    def idle(self, seconds: float) -> None:
        """Pause up to ``seconds``, and not past a wake time announced
        meanwhile: until then, until work due now is announced, or until
        ``stop()`` is called. A wait the system ends early is resumed: the
        loop does not poll before its time."""
        end = time.monotonic() + seconds
        with self._wakeup:
            while not self._poll_now:
                remaining = end - time.monotonic()
                if self._announced is not None:
                    until = (self._announced - clock.now()).total_seconds()
                    remaining = min(remaining, until)
                if remaining <= 0:
                    break
                self._wakeup.wait(remaining)
            self._poll_now = False

    def poll(self) -> float | None:
        """One batch; the pause before the next (None: more is due). A batch that
        raises is a failed try of the outage: it answers the backoff's pause."""
        with self._wakeup:
            # Announced before the batch: committed, so the batch (or next_due) sees it.
            self._announced = None
        try:
            handled = self.run_once()
            pause = None if handled >= self.batch_size else self.sleep_seconds()
        except Exception as exc:
            return self.outage.failed(exc)
        self.outage.succeeded()
        return pause

    def run_forever(self) -> None:
        wakeups.subscribe(self.notify)
        logger.info("%s loop started", self.name)
        try:
            while not self.stopping:
                refresh_connection()
                if django_settings.DEBUG:
                    reset_queries()
                pause = self.poll()
                if self._stopping.is_set():
                    break
                if pause is not None:  # else more is due: no sleep
                    logger.debug("%s loop: idle for up to %.1f s", self.name, pause)
                    self.idle(pause)
        finally:
            wakeups.unsubscribe(self.notify)
            self.close()
            db.connection().close()
            logger.info("%s loop stopped", self.name)

    def drain(self) -> None:
        """Wait for the work ``run_once`` started elsewhere (a pool's threads) to end."""

    def close(self) -> None:
        """Release what the loop holds besides this thread's connection."""


def refresh_connection() -> None:
    """Keep this thread's connection from one poll to the next, unless it broke.

    Django's ``close_old_connections()`` closes it after every "request" when
    ``CONN_MAX_AGE`` is 0 (the default): for a loop that polls every few
    seconds, reconnecting would cost more than the poll itself. A positive
    ``CONN_MAX_AGE`` is honoured.
    """
    connection = db.connection()
    if connection.connection is None:
        return
    if connection.errors_occurred and not connection.is_usable():
        connection.close()
        return
    max_age = connection.settings_dict.get("CONN_MAX_AGE")
    if max_age and connection.close_at is not None and time.monotonic() >= connection.close_at:
        connection.close()


def limit_idle_transactions(seconds: float) -> None:
    """Make the database end a worker's transaction that sits idle longer than
    the lease (a hung step): its locks are freed and another worker goes on."""

    def configure(sender: Any, connection: Any, **kwargs: Any) -> None:
        if connection.alias != db.alias():
            return
        statements = db.session_limits(connection, seconds)
        if statements:
            with connection.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)

    connection_created.connect(configure, dispatch_uid="kumiflow-idle-transactions", weak=False)
