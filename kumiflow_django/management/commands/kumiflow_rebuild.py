"""``manage.py kumiflow_rebuild``: rebuild runs, outbox, schedules and projections from the log."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from kumiflow_django.projections.rebuild import rebuild_all


class Command(BaseCommand):
    help = "Rebuild the runs, the outbox, the cron schedules and user projections from the log."

    def handle(self, *args: Any, verbosity: int = 1, **options: Any) -> None:
        counts = rebuild_all()
        if verbosity:
            for name, count in counts.items():
                self.stdout.write(f"{name}: {count}")
