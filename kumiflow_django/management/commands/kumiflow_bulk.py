"""``manage.py kumiflow_bulk``: one operation on every run that matches a filter,
or the continuation of recorded ones (an interrupted one, the admin's)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiflow_django.engine import bulk
from kumiflow_django.store.errors import KumiflowError


def _filter(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep:
        raise CommandError(f"a filter is NAME=VALUE, not {text!r}")
    if value in ("true", "false"):
        return name, value == "true"
    return name, value.split(",") if name in ("status", "tenants", "ids") else value


class Command(BaseCommand):
    help = (
        "Cancel, retry, resume, pause, fail or restart (--from-step) every run that matches "
        "a filter, in batches "
        "(each run's event carries --by and --reason); or continue recorded operations "
        "(--continue), from their cursor."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", nargs="?", choices=sorted(bulk.ACTIONS))
        parser.add_argument(
            "--filter",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help=f"A run filter, repeatable: {', '.join(bulk.FILTERS)} (status=a,b for several).",
        )
        parser.add_argument(
            "--from-step", default=None, help="restart: the step path each run restarts from."
        )
        parser.add_argument(
            "--definition",
            default="run",
            choices=["run", "current"],
            help="restart: each run's own definition (default) or the current one.",
        )
        parser.add_argument("--reason", default="", help="Why (stored on every run's event).")
        parser.add_argument("--by", default="", help="Who (stored on every run's event).")
        parser.add_argument("--batch-size", type=int, default=bulk.DEFAULT_BATCH)
        parser.add_argument("--dry-run", action="store_true", help="Count the matching runs only.")
        parser.add_argument(
            "--continue",
            dest="resume",
            nargs="?",
            const="all",
            metavar="ID",
            help="Continue one recorded operation (or all unfinished ones).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["resume"]:
                self._continue(options["resume"])
                return
            action = options["action"]
            if action is None:
                raise CommandError("name an action, or --continue")
            filters = dict(_filter(f) for f in options["filter"])
            step = {"from_step": options["from_step"], "definition": options["definition"]}
            if options["dry_run"]:
                count = bulk.preflight(action, filters, **step)
                self.stdout.write(f"{count} runs match; {action} would be tried on each")
                return
            operation = bulk.bulk_runs(
                action,
                filters=filters,
                reason=options["reason"],
                by=options["by"],
                batch_size=options["batch_size"],
                **step,
            )
        except KumiflowError as exc:
            raise CommandError(str(exc)) from exc
        self._report(operation)

    def _continue(self, which: str) -> None:
        ids = list(bulk.unfinished().values_list("id", flat=True)) if which == "all" else [which]
        for operation_id in ids:
            self._report(bulk.continue_bulk(operation_id))
        if not ids:
            self.stdout.write("no unfinished bulk operation")

    def _report(self, operation: bulk.BulkOperation) -> None:
        self.stdout.write(
            f"bulk {operation.id} {operation.action}: {operation.status}, {operation.total} "
            f"matched, {operation.done} done, {operation.skipped} skipped, "
            f"{operation.errors} errors"
        )
        for reason, count in operation.skipped_reasons.items():
            self.stdout.write(f"  skipped {count}: {reason}")
        if operation.error_texts:
            self.stdout.write("  errors: " + json.dumps(operation.error_texts))
