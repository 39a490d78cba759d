"""``manage.py kumiflow_prune_outbox``: retention for delivered dispatches."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from kumiflow_django.management.loop_command import positive_float
from kumiflow_django.outbox.actions import prune
from kumiflow_django.store import clock


class Command(BaseCommand):
    help = (
        "Delete delivered and cancelled dispatches older than --min-age-days, with "
        "their event streams. Dead and pending ones are kept."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--min-age-days",
            type=positive_float,
            default=30.0,
            help="Only dispatches last changed at least this many days ago (default: %(default)s).",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count, delete nothing.")

    def handle(self, *args: Any, min_age_days: float, dry_run: bool, **options: Any) -> None:
        cutoff = clock.now() - timedelta(days=min_age_days)
        count = prune(cutoff, dry_run=dry_run)
        verb = "would delete" if dry_run else "deleted"
        self.stdout.write(
            f"{verb} {count} dispatch(es) last changed before {cutoff:%Y-%m-%d %H:%M}"
        )
