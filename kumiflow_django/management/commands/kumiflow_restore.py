"""``manage.py kumiflow_restore FILE…``: put archived runs back into the log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiflow_django.management.loop_command import configure_logging, positive_int
from kumiflow_django.projections.retention import Restore
from kumiflow_django.store.archive import ArchiveError


class Command(BaseCommand):
    help = (
        "Put runs archived by kumiflow_retention back: their events at their own positions, "
        "their rows folded from them. Runs already in the log are skipped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
        parser.add_argument(
            "--batch-size", type=positive_int, default=200, help="Runs per transaction."
        )

    def handle(
        self, *args: Any, files: list[Path], batch_size: int, verbosity: int = 1, **options: Any
    ) -> None:
        configure_logging(verbosity, self.stdout)
        missing = [str(path) for path in files if not path.is_file()]
        if missing:
            raise CommandError(f"no such file: {', '.join(missing)}")
        try:
            report = Restore(batch_size=batch_size).restore(files)
        except ArchiveError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"restored {report.runs} run(s) with {report.events} event(s); "
            f"{report.present} already in the log"
        )
        if report.conflicts:
            for line in report.conflicts:
                self.stderr.write(line)
            raise CommandError(f"{len(report.conflicts)} run(s) could not be restored")
