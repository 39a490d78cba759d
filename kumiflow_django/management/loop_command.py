"""The conventions every loop command shares: options, signals, logging.

- ``--once``: one batch, then exit; ``--batch-size``; ``--max-interval``.
- SIGINT/SIGTERM (and SIGQUIT): finish the item at hand and exit 0; a
  second signal exits at once with status 1.
- ``-v 0/1/2`` maps to WARNING/INFO/DEBUG on the ``kumiflow_django``
  logger; a handler on stdout is added only if none is configured.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiflow_django.conf import settings
from kumiflow_django.store import db
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.workers.listener import PgListener
from kumiflow_django.workers.loop import Loop, limit_idle_transactions
from kumiflow_django.workers.resume import ResumeLoop
from kumiflow_django.workers.worker import Heartbeat

logger = get_logger("kumiflow_django")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"must be 0 or more: {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def configure_logging(verbosity: int, stream: Any) -> None:
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        stream_handler = logging.StreamHandler(stream)
        stream_handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
        )
        logger.addHandler(stream_handler)
    for handler in logger.handlers:
        handler.setLevel(level)


def install_signal_handlers(stop: Callable[[], None]) -> None:
    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        if received:
            logger.warning("second signal: exiting now")
            logging.shutdown()
            # sys.exit() would only end the main thread; the loop threads
            # would keep the process alive. Open transactions roll back.
            os._exit(1)
        received.append(signum)
        logger.warning(
            "received %s: finishing the work at hand, then exiting (signal again to force)",
            signal.Signals(signum).name,
        )
        stop()

    for name in ("SIGINT", "SIGTERM", "SIGQUIT"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), handle)


class LoopCommand(BaseCommand):
    """Base of ``kumiflow_resume``, ``kumiflow_dispatch`` and ``kumiflow_cron``."""

    loop_class: type[Loop]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Handle one batch, then exit.")
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=None,
            help="Items per batch (default: KUMIFLOW_RESUME_BATCH_SIZE).",
        )
        parser.add_argument(
            "--max-interval",
            type=positive_float,
            default=None,
            help="Longest sleep between polls in seconds (default: KUMIFLOW_MAX_INTERVAL).",
        )

    def make_loop(self, batch_size: int, max_interval: float) -> Loop:
        return self.loop_class(batch_size=batch_size, max_interval=max_interval)

    def handle(
        self,
        *args: Any,
        once: bool = False,
        batch_size: int | None = None,
        max_interval: float | None = None,
        verbosity: int = 1,
        **options: Any,
    ) -> None:
        configure_logging(verbosity, self.stdout)
        loop = self.make_loop(
            batch_size or settings.RESUME_BATCH_SIZE, max_interval or settings.MAX_INTERVAL
        )
        if once:
            try:
                handled = loop.run_once()
                loop.drain()
            finally:
                loop.close()
            logger.info("%s: %d handled", loop.name, handled)
            return
        # A process that resumes runs says which definitions it serves
        # (kumiflow_resume, as kumiflow_worker does): one heartbeat row.
        heartbeat = Heartbeat(loop.worker_id) if isinstance(loop, ResumeLoop) else None

        def run() -> None:
            # Under the signal handlers: a start that waits for the database stops on a signal.
            if heartbeat is not None:
                heartbeat.start()
            try:
                loop.run_forever()
            finally:
                if heartbeat is not None:
                    heartbeat.stop()

        def stop() -> None:
            loop.stop()
            if heartbeat is not None:
                heartbeat.cancel()

        try:
            run_until_signalled(run, stop)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit(0) included: a loop never ends by itself
            logger.exception("the %s loop crashed", loop.name)
            raise CommandError(f"the {loop.name} loop crashed: {type(exc).__name__}") from exc
        if not loop.stopping:
            raise CommandError(f"the {loop.name} loop ended unasked")


def run_until_signalled(
    run: Callable[[], None], stop: Callable[[], None], *, signals: bool = True
) -> None:
    """Run a loop (or the worker) the way every command does: idle transactions
    limited to the lease, signals handled, PostgreSQL notifications relayed.
    ``signals=False``: outside the main thread (under the autoreloader), where
    the caller stops it another way."""
    limit_idle_transactions(settings.LEASE_SECONDS)
    if signals:
        install_signal_handlers(stop)
    listener = PgListener() if db.supports_listen() else None
    if listener is not None:
        listener.start()
    try:
        run()
    finally:
        if listener is not None:
            listener.stop()
