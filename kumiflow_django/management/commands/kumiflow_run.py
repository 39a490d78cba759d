"""``manage.py kumiflow_run``: cancel, retry or wake runs from the command line."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiflow_django.engine.operations import cancel_run, retry_run, wake_run
from kumiflow_django.store.errors import KumiflowError


class Command(BaseCommand):
    help = "Operate runs through the same functions as the admin: cancel, retry, wake."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="operation", required=True)
        cancel = sub.add_parser("cancel", help="Cancel unfinished runs.")
        cancel.add_argument("run_ids", nargs="+")
        cancel.add_argument("--reason", default="", help="Recorded on the run.")
        retry = sub.add_parser("retry", help="Retry failed runs from their failed step.")
        retry.add_argument("run_ids", nargs="+")
        retry.add_argument(
            "--adopt-current-definition",
            action="store_true",
            help="Move the runs onto the workflow's current definition first.",
        )
        wake = sub.add_parser("wake", help="Make waiting runs due now.")
        wake.add_argument("run_ids", nargs="+")

    def handle(self, *args: Any, operation: str, run_ids: list[str], **options: Any) -> None:
        failed = 0
        for run_id in run_ids:
            try:
                if operation == "cancel":
                    cancel_run(run_id, reason=options["reason"])
                elif operation == "retry":
                    retry_run(run_id, adopt_current_definition=options["adopt_current_definition"])
                else:
                    wake_run(run_id)
            except KumiflowError as exc:
                failed += 1
                self.stderr.write(f"{run_id}: {exc}")
            else:
                self.stdout.write(f"{run_id}: {operation} done")
        if failed:
            raise CommandError(f"{failed} of {len(run_ids)} run(s) not changed")
