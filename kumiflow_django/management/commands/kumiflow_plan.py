"""``manage.py kumiflow_plan``: what deploying this code does to the runs in flight.

Run it with the new code against the production database, before the deploy
(in CI, in the release step). For each workflow with runs in flight, grouped
by definition and position: whether they are unchanged, carried on to the
new definition, pinned to a version still registered, will fail, or wait
for a worker that has their definition; with counts and a sample run id,
and whether a live worker process (its heartbeat row) serves them now.
Exits with status 1 when runs would fail, so a release step can stop.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from kumiflow_django.engine.deploys import DeployPlan, Fate


class Command(BaseCommand):
    help = "Show what the registered definitions will do to the runs in flight."
    # The plan itself is what the deploy-plan check would report.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print the plan as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        plan = DeployPlan()
        groups = plan.groups()
        failing = plan.failing(groups)
        if options["json"]:
            data = {
                "groups": [g.as_data() for g in groups],
                "failing": failing,
                "truncated": plan.truncated,
            }
            self.stdout.write(json.dumps(data, indent=2))
        else:
            self._table(groups, failing)
        if failing:
            sys.exit(1)

    def _table(self, groups: list[Any], failing: int) -> None:
        if not groups:
            self.stdout.write("No runs in flight.")
            return
        rows = [("workflow", "definition", "position", "runs", "fate", "now", "sample run")]
        for g in groups:
            version = f" v{g.version}" if g.version else ""
            rows.append(
                (
                    g.workflow,
                    f"{g.fingerprint[:12]}{version}",
                    g.position,
                    str(g.count),
                    str(g.fate),
                    "live worker" if g.served else "",
                    g.sample,
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            cells = (c.ljust(w) for c, w in zip(row, widths, strict=True))
            self.stdout.write("  ".join(cells).rstrip())
        for g in groups:
            if g.why and g.fate in (Fate.FAILS, Fate.WAITS):
                self.stdout.write(f"\n{g.workflow} at {g.position} ({g.fate}): {g.why}")
        if any(g.served and g.fate != Fate.WAITS for g in groups):
            self.stdout.write(
                "\nnow = live worker: a live worker process (the old release) serves these "
                "runs and keeps them while it lives; the fate applies once none does."
            )
        self.stdout.write("")
        if failing:
            self.stdout.write(self.style.ERROR(f"{failing} run(s) would fail."))
        else:
            self.stdout.write(self.style.SUCCESS("OK: no run would fail."))
