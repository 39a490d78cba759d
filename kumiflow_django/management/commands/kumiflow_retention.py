"""``manage.py kumiflow_retention``: delete finished runs older than a cut-off
(and the rows of flow-control keys that nothing uses any more)."""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiflow_django.definition.durations import parse_duration, parse_instant
from kumiflow_django.flow.limits import purge_idle_keys
from kumiflow_django.management.loop_command import (
    configure_logging,
    install_signal_handlers,
    non_negative_float,
    positive_int,
)
from kumiflow_django.projections.retention import LockLost, Retention
from kumiflow_django.store import clock
from kumiflow_django.store.locks import LockHeld


def cutoff(text: str) -> datetime:
    """An ISO 8601 duration before now (``P90D``) or an aware instant."""
    try:
        if text.startswith("P"):
            return clock.now() - parse_duration(text)
        return parse_instant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Command(BaseCommand):
    help = (
        "Delete runs that finished (completed, failed, cancelled) before a cut-off, with "
        "their event streams and outbox rows, in short batches; optionally archive them "
        "first (gzip JSON Lines that kumiflow_restore loads back). One process at a time."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--finished-before",
            type=cutoff,
            required=True,
            metavar="P90D|INSTANT",
            help="An ISO 8601 duration back from now (P90D) or an instant (2026-01-01T00:00Z).",
        )
        parser.add_argument(
            "--archive",
            type=Path,
            default=None,
            metavar="DIR",
            help="Write the runs to a new .jsonl.gz file in DIR before deleting them.",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=None,
            help="Runs per transaction (default: KUMIFLOW_RETENTION_BATCH_SIZE, 500).",
        )
        parser.add_argument(
            "--pause",
            type=non_negative_float,
            default=None,
            help="Seconds to sleep between batches, leaving the database to others "
            "(default: KUMIFLOW_RETENTION_PAUSE, 0.05; 0: no pause).",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count, delete nothing.")

    def handle(
        self,
        *args: Any,
        finished_before: datetime,
        archive: Path | None,
        batch_size: int | None,
        pause: float | None,
        dry_run: bool,
        verbosity: int = 1,
        **options: Any,
    ) -> None:
        configure_logging(verbosity, self.stdout)
        retention = Retention(
            finished_before, batch_size=batch_size, archive_dir=archive, pause=pause
        )
        when = f"{finished_before:%Y-%m-%d %H:%M:%S %Z}"
        if dry_run:
            self.stdout.write(f"would delete {retention.count()} run(s) finished before {when}")
            return
        install_signal_handlers(retention.stop)
        try:
            report = retention.run()
        except (LockHeld, LockLost) as exc:
            raise CommandError(f"another kumiflow_retention is running: {exc}") from exc
        owned = ", ".join(f"{n} {name}" for name, n in report.owned.items())
        self.stdout.write(
            f"deleted {report.runs} run(s) finished before {when} with {report.events} "
            f"event(s) and {owned} in {report.batches} batch(es), {report.seconds:.1f} s; "
            f"{report.kept} kept (work still to do)"
        )
        if report.archive is not None:
            self.stdout.write(f"archived to {report.archive}")
        # Flow control's keys (one row per key, so one per run for a per-run key).
        keys = purge_idle_keys(finished_before)
        if keys:
            self.stdout.write(f"deleted {keys} idle flow key(s)")
