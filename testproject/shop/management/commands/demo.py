"""The project's main job: the onboarding workflow from sign-up to completion.

On the configured database (SQLite by default) it saves two ``user.signed-up``
events (an engaged and a cold user), runs the worker with a fast-forwarded
clock through both waits, delivers the mails (told one line each, dated by
that clock: testproject/shop/demo_mail.py) and the CRM webhook (to a receiver
it starts on loopback), prints each run's timeline with the steps' names and
tells how to open the same runs in the admin. The engine's warnings are one
line each while it runs (the intended failure's traceback is on its run's
page); errors keep their traceback.

It also leaves two runs to look at in the console: a refund waiting for a
person's approval (send it from the run's page) and an invoice reminder that
failed (a customer the shop does not know: the failure panel shows why).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import django
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail.message import EmailMessage
from django.core.management.base import BaseCommand, CommandParser
from django.test import override_settings
from django.utils import timezone

from kumiflow_django import VersionConflict, append_event, load_stream
from kumiflow_django.cron.schedules import sync_schedules
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.step import get_kind
from kumiflow_django.models import Dispatch, Event, WorkflowRun
from kumiflow_django.testing import VirtualClock, virtual_clock
from kumiflow_django.workers.worker import Worker
from testproject.shop.demo_mail import StoryBackend
from testproject.shop.receiver import DemoReceiver

ADMIN_USER, ADMIN_PASSWORD = "admin", "admin"
STORY_MAIL = "testproject.shop.demo_mail.StoryBackend"


class OneLineWarnings(logging.Formatter):
    """The engine's warnings in one line each, without their traceback (the
    run's page shows it); errors and worse as the handler's own formatter has them."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.ERROR:
            return self.inner.format(record)
        return f"  log: {record.levelname} {record.name}: {record.getMessage()}"


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """For the demo command only: its intended failure is a line, not a traceback."""
    handlers = [*logging.getLogger("kumiflow_django").handlers, *logging.getLogger().handlers]
    saved = [(h, h.formatter) for h in dict.fromkeys(handlers)]  # each handler once
    for handler, formatter in saved:
        handler.setFormatter(OneLineWarnings(formatter))
    try:
        yield
    finally:
        for handler, formatter in saved:
            handler.setFormatter(formatter)


def story_mail() -> dict[str, Any]:
    """Settings that send the demo's mails to :class:`StoryBackend`."""
    if django.VERSION >= (6, 1):
        return {"MAILERS": {"default": {"BACKEND": STORY_MAIL}}}
    return {"EMAIL_BACKEND": STORY_MAIL}  # Django 5.2 LTS


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
        self.start = start = timezone.now() - timedelta(days=8, minutes=5)
        StoryBackend.tell = self.mail
        with (
            one_line_warnings(),
            override_settings(**story_mail()),
            contextlib.ExitStack() as done,
        ):
            done.callback(setattr, StoryBackend, "tell", None)
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

        self.step(
            f"Day 0 ({self.date(clock.now())}): two users sign up; "
            "each user.signed-up event starts a run"
        )
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
            self.say(f"run {str(run.id)[:8]} is {run.status} at {self.at(run, run.cursor)}")

        self.step("The worker delivers the welcome mails (the outbox, after the commit)")
        self.flush()
        worker.run_once()

        for days, label in ((1, "Day 1"), (7, "Day 8")):
            clock.advance(days=days)
            self.step(
                f"{label} ({self.date(clock.now())}): the clock moves on; "
                "the worker resumes the runs and delivers"
            )
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
        self.say(f"run {str(waiting.id)[:8]} waits at {self.at(waiting, waiting.cursor)}")
        self.say(
            f"run {str(failed.id)[:8]} failed at {self.at(failed, failed.cursor)}, as intended: "
            "the invoice's customer is not in the shop (the two log lines above; "
            "its page in the console shows the traceback)"
        )
        return {"waiting": waiting, "failed": failed}

    # -- output -------------------------------------------------------------
    def timelines(self, runs: list[WorkflowRun], start: Any) -> None:
        for run in runs:
            key = run.idempotency_key
            self.heading(f"Timeline of {run.workflow} {str(run.id)[:8]} ({key}): {run.status}")
            self.stdout.write(f"  {'day':>4}  {'date':<16}  {'v':>2}  {'event':<39} detail")
            for event in load_stream(str(run.id), tenant=run.tenant_id):
                self.stdout.write(
                    f"  {self.day(event.created_at):>4}  {self.date(event.created_at):<16}  "
                    f"{event.version:>2}  {event.type:<39} {self.detail(run, event)}"
                )
            self.stdout.write("  the outbox (its rows are Dispatch, one per mail or webhook):")
            for dispatch in Dispatch.objects.filter(run_id=run.id).order_by("created_at"):
                what = dispatch.request.get("subject") or dispatch.request.get("url")
                sent = dispatch.delivered_at or dispatch.updated_at
                self.stdout.write(
                    f"  {self.day(sent):>4}  {self.date(sent):<16}      {dispatch.kind} {what!r} "
                    f"from {self.at(run, dispatch.step_path)}: {dispatch.status} "
                    f"after {dispatch.attempts} attempt(s)"
                )

    def detail(self, run: WorkflowRun, event: Event) -> str:
        p = event.payload
        if "wake_at" in p:
            wake = datetime.fromisoformat(str(p["wake_at"]).replace("Z", "+00:00"))
            return (
                f"at {self.at(run, p['cursor'])}: sleeps until {self.date(wake)} "
                f"(day {self.day(wake)})"
            )
        if event.type.endswith("resumed"):
            return f"at {self.at(run, p.get('cursor'))}: woken by {p['by']}"
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

    # -- words ----------------------------------------------------------------
    def at(self, run: WorkflowRun, cursor: Any) -> str:
        """``step 1 (wait P1D)``: a step by its path and its label, as the console shows it."""
        if isinstance(cursor, str):
            cursor = [int(p) if p.isdigit() else p for p in cursor.split(".")] if cursor else []
        if not cursor:
            return "the start"
        path = ".".join(map(str, cursor))
        try:
            step = registry.get(run.workflow).step_at(list(cursor))
            return f"step {path} ({get_kind(step.kind).describe(step)})"
        except (LookupError, ValueError):
            return f"step {path}"

    def day(self, when: datetime) -> str:
        return f"{(when - self.start).total_seconds() / 86400:.1f}"

    def date(self, when: datetime) -> str:
        return timezone.localtime(when).strftime("%a %d %b %H:%M")

    def mail(self, message: EmailMessage, sent: datetime) -> None:
        """A mail the outbox delivered, in one line (testproject/shop/demo_mail.py)."""
        self.say(
            f"mail to {', '.join(message.to)}: {message.subject!r}, "
            f"dated {self.date(sent)} (day {self.day(sent)})"
        )

    def heading(self, text: str) -> None:
        self.stdout.write("\n" + self.style.MIGRATE_HEADING(text))

    def step(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_LABEL(f"\n» {text}"))
        self.flush()  # before the engine's log lines (stderr) of the step

    def say(self, text: str) -> None:
        self.stdout.write(f"  {text}")

    def flush(self) -> None:
        self.stdout.flush()
