"""The project's main job: the onboarding workflow from sign-up to completion.

On the configured database (SQLite by default) it saves two ``user.signed-up``
events (an engaged and a cold user), runs the worker with a fast-forwarded
clock through both waits, delivers the mails (console backend) and the CRM
webhook (to a receiver it starts on loopback), prints each run's timeline
and tells how to open the same runs in the admin.

It also leaves two runs to look at in the console: a refund waiting for a
person's approval (send it from the run's page) and an invoice reminder that
failed (a customer the shop does not know: the failure panel shows why).
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.test import override_settings
from django.utils import timezone

from kumiflow_django import VersionConflict, append_event, load_stream
from kumiflow_django.cron.schedules import sync_schedules
from kumiflow_django.models import Dispatch, Event, WorkflowRun
from kumiflow_django.testing import VirtualClock, virtual_clock
from kumiflow_django.workers.worker import Worker
from testproject.shop.receiver import DemoReceiver

ADMIN_USER, ADMIN_PASSWORD = "admin", "admin"


class Command(BaseCommand):
    help = "Run the onboarding workflow for two users, fast-forwarded, and print the timelines."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--superuser-only", action="store_true", help="Only make sure the admin user exists."
        )

    def handle(self, *args: Any, superuser_only: bool = False, **options: Any) -> None:
        self.ensure_superuser()
        if superuser_only:
            return
        self.heading("kumiflow-django demo: user onboarding, from sign-up to the CRM webhook")
        # The story spans eight days; it is told in a few seconds, ending about now.
        start = timezone.now() - timedelta(days=8, minutes=5)
        with (
            virtual_clock(start) as clock,
            DemoReceiver(settings.KUMIFLOW_WEBHOOK_SECRETS["crm"]) as crm,
        ):
            overrides = {
                "SHOP_CRM_WEBHOOK_URL": crm.url,
                "KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS": ["127.0.0.1"],
            }
            with override_settings(**overrides):
                runs = self.story(clock, crm)
        self.timelines(runs, start)
        leftovers = self.leftovers()
        self.footer(runs, leftovers)

    # -- the story ----------------------------------------------------------
    def story(self, clock: VirtualClock, crm: DemoReceiver) -> list[WorkflowRun]:
        tag = secrets.token_hex(2)
        users = [(f"active-ada-{tag}", "ada@example.com"), (f"cold-bob-{tag}", "bob@example.com")]
        worker = Worker(cron=False)

        self.step("Day 0: two users sign up; each user.signed-up event starts a run")
        for user_id, email in users:
            event = append_event(
                f"user-{user_id}",
                "user.signed-up",
                {"user_id": user_id, "email": email},
                stream_type="user",
                expected_version=0,
            )
            self.say(f"appended #{event.position} user.signed-up for {user_id}")
        try:
            append_event(f"user-{users[0][0]}", "user.signed-up", {}, expected_version=0)
        except VersionConflict as exc:
            self.say(f"a second sign-up for the same stream is refused: {exc}")
        runs = [
            WorkflowRun.objects.get(workflow="user-onboarding", idempotency_key=f"onboarding:{u}")
            for u, _ in users
        ]
        for run in runs:
            self.say(f"run {str(run.id)[:8]} is {run.status} at step {run.cursor_text}")

        self.step("The worker delivers the welcome mails (console backend)")
        self.flush()
        worker.run_once()

        for days, label in ((1, "Day 1"), (7, "Day 8")):
            clock.advance(days=days)
            self.step(f"{label}: the clock moves on; the worker resumes the runs and delivers")
            self.flush()
            worker.run_once()
            worker.run_once()

        self.step("The CRM receiver got")
        for call in crm.calls:
            self.say(
                f"POST {call['path']} {call['body']} signature "
                f"{'valid' if call['signature_ok'] else 'INVALID'}, "
                f"Idempotency-Key {call['idempotency_key'][:8]}…"
            )
        for run in runs:
            run.refresh_from_db()
        return runs

    def leftovers(self) -> dict[str, WorkflowRun]:
        """A run waiting for an approval and a failed run, for the console."""
        tag = secrets.token_hex(2)
        self.step("Left for you in the console: a refund waiting for approval, a failed reminder")
        append_event(
            f"refund-{tag}",
            "refund.requested",
            {"refund_id": f"R-{tag}", "user_id": "ada", "cents": 1999},
            stream_type="refund",
        )
        append_event(
            f"invoice-{tag}",
            "invoice.overdue",
            {"invoice": f"INV-{tag}", "user_id": f"nobody-{tag}"},
            stream_type="invoice",
        )
        self.flush()
        Worker(cron=False).run_once()  # the approval request mail
        sync_schedules()  # the daily report's schedule, for the overview's next fires
        waiting = WorkflowRun.objects.get(
            workflow="refund-approval", idempotency_key=f"refund:R-{tag}"
        )
        failed = WorkflowRun.objects.filter(workflow="invoice-reminder").latest("started_at")
        self.say(f"run {str(waiting.id)[:8]} waits for refund.approved (refund R-{tag})")
        self.say(f"run {str(failed.id)[:8]} failed: {failed.last_error}")
        return {"waiting": waiting, "failed": failed}

    # -- output -------------------------------------------------------------
    def timelines(self, runs: list[WorkflowRun], start: Any) -> None:
        for run in runs:
            key = run.idempotency_key
            self.heading(f"Timeline of {run.workflow} {str(run.id)[:8]} ({key}): {run.status}")
            self.stdout.write(f"  {'day':>5}  {'v':>2}  {'event':<40} detail")
            for event in load_stream(str(run.id), tenant=run.tenant_id):
                day = (event.created_at - start).total_seconds() / 86400
                self.stdout.write(
                    f"  {day:5.1f}  {event.version:>2}  {event.type:<40} {self.detail(event)}"
                )
            for dispatch in Dispatch.objects.filter(run_id=run.id).order_by("created_at"):
                what = dispatch.request.get("subject") or dispatch.request.get("url")
                self.stdout.write(
                    f"  {'':5}  {'':2}  outbox: {dispatch.kind} {what!r} -> {dispatch.status} "
                    f"after {dispatch.attempts} attempt(s)"
                )

    def detail(self, event: Event) -> str:
        p = event.payload
        if "wake_at" in p:
            return f"sleep until {p['wake_at']} at step {'.'.join(map(str, p['cursor']))}"
        if event.type.endswith("resumed"):
            return f"woken by {p['by']}"
        if event.type.endswith("run-started"):
            return f"by {p['trigger']['type']} #{p['trigger']['position']}"
        if event.type.endswith("run-completed"):
            return f"result {p['result']}"
        if event.type.endswith("run-failed"):
            return str(p["error"])
        return ""

    def footer(self, runs: list[WorkflowRun], leftovers: dict[str, WorkflowRun]) -> None:
        completed = sum(r.status == "completed" for r in runs)
        self.heading(f"{completed} of {len(runs)} onboarding runs completed.")
        base = "http://127.0.0.1:8000/admin/kumiflow/workflowrun"
        self.stdout.write(
            "See the same runs in the admin:\n"
            "  make serve        (or: DEBUG=true .venv/bin/python manage.py runserver)\n"
            f"  open http://127.0.0.1:8000/admin/kumiflow/workflowrun/overview/ and log in as "
            f"{ADMIN_USER} / {ADMIN_PASSWORD} (a development-only account)\n"
            f"  the refund waiting for approval: {base}/{leftovers['waiting'].id}/change/\n"
            f"  the failed reminder:             {base}/{leftovers['failed'].id}/change/\n"
            "Run the worker for real with: .venv/bin/python manage.py kumiflow_worker"
        )
        if completed != len(runs):
            raise SystemExit(1)

    def ensure_superuser(self) -> None:
        users = get_user_model()._default_manager
        if not users.filter(username=ADMIN_USER).exists():
            users.create_superuser(ADMIN_USER, "admin@example.com", ADMIN_PASSWORD)

    def heading(self, text: str) -> None:
        self.stdout.write("\n" + self.style.MIGRATE_HEADING(text))

    def step(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_LABEL(f"\n» {text}"))

    def say(self, text: str) -> None:
        self.stdout.write(f"  {text}")

    def flush(self) -> None:
        self.stdout.flush()
