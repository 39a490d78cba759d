"""The shop's workflows: the reference engine's three sample workflows.

- ``user-onboarding``: welcome mail, wait a day, tips or a reminder depending
  on engagement, wait a week, tell the CRM.
- ``webhook-delivery``: one webhook per processed data event.
- ``daily-report``: a webhook every morning at 09:00 UTC.
- ``refund-approval``: a refund waits for a person's approval (the console's
  "Send event"), or is declined after three days.
- ``invoice-reminder``: reminds a customer of an overdue invoice; an invoice
  of a customer the shop does not know fails (the demo's failed run).
"""

from __future__ import annotations

from django.conf import settings

from kumiflow_django import define_projection, define_workflow, on_cron, on_event
from kumiflow_django import steps as s


def _email(ctx):
    return ctx.event.payload["email"]


onboarding = define_workflow(
    "user-onboarding",
    trigger=on_event("user.signed-up"),
    idempotency_key=lambda event: f"onboarding:{event.payload['user_id']}",
    steps=[
        s.mail_send(
            to=_email,
            subject="Welcome!",
            body="Thanks for signing up — we'll check in soon.",
        ),
        s.wait("P1D"),
        # The engagement flag, as in the reference sample. A real shop would
        # read it: s.read.find_one("customer", "shop.Customer", ...).
        s.compute("engaged", lambda ctx: ctx.event.payload["user_id"].startswith("active-")),
        s.branch(
            if_=lambda ctx: ctx.steps["engaged"],
            then=[
                s.mail_send(
                    to=_email,
                    subject="Engagement tips",
                    body="You're off to a great start — try these next.",
                )
            ],
            else_=[
                s.mail_send(
                    to=_email,
                    subject="Getting started",
                    body="Need a hand? Here's how to begin.",
                )
            ],
        ),
        s.wait("P7D"),
        s.webhook_send(
            url=lambda ctx: settings.SHOP_CRM_WEBHOOK_URL,
            body=lambda ctx: {"userId": ctx.event.payload["user_id"], "stage": "day8"},
            secret="crm",
        ),
        s.return_({"ok": True}),
    ],
)

webhook_delivery = define_workflow(
    "webhook-delivery",
    trigger=on_event("data.processed"),
    steps=[
        s.webhook_send(
            url=lambda ctx: ctx.event.payload["webhook_url"],
            body=lambda ctx: ctx.event.payload["data"],
        ),
        s.return_({"ok": True}),
    ],
)

daily_report = define_workflow(
    "daily-report",
    trigger=on_cron("0 9 * * *"),
    steps=[
        s.webhook_send(
            url=lambda ctx: settings.SHOP_REPORT_WEBHOOK_URL,
            body=lambda ctx: {"ts": ctx.event.payload["scheduled_for"]},
        ),
        s.return_({"ok": True}),
    ],
)


refund_approval = define_workflow(
    "refund-approval",
    trigger=on_event("refund.requested"),
    idempotency_key=lambda event: f"refund:{event.payload['refund_id']}",
    steps=[
        s.mail_send(
            to="support@shop.example",
            subject=lambda ctx: f"Refund {ctx.event.payload['refund_id']} needs an approval",
            body=lambda ctx: (
                f"{ctx.event.payload['cents'] / 100:.2f} EUR for "
                f"{ctx.event.payload['user_id']}; approve it in the console."
            ),
        ),
        s.wait_for_event(
            "refund.approved",
            match={"payload.refund_id": lambda ctx: ctx.event.payload["refund_id"]},
            timeout="P3D",
            name="approval",
        ),
        s.branch(
            if_=lambda ctx: not ctx.steps["approval"]["timed_out"],
            then=[s.compute("outcome", lambda ctx: "refunded")],
            else_=[s.compute("outcome", lambda ctx: "declined: no approval within 3 days")],
        ),
        s.return_(
            lambda ctx: {"refund": ctx.event.payload["refund_id"], "outcome": ctx.steps["outcome"]}
        ),
    ],
)

invoice_reminder = define_workflow(
    "invoice-reminder",
    trigger=on_event("invoice.overdue"),
    business_key="payload.invoice",
    steps=[
        s.read.find_one(
            "customer",
            "shop.Customer",
            lambda ctx: {"user_id": ctx.event.payload["user_id"]},
            fields=["user_id", "email"],
        ),
        s.mail_send(
            to=lambda ctx: ctx.steps["customer"]["email"],
            subject=lambda ctx: f"Invoice {ctx.event.payload['invoice']} is overdue",
            body="Please pay it at your convenience.",
        ),
        s.return_({"reminded": True}),
    ],
)


@s.handler("shop.count")
def count(payload):
    """A side effect in the database: add one to a tally (slowly, if asked)."""
    import time

    from django.db.models import F

    from testproject.shop.models import Tally

    time.sleep(payload.get("sleep", 0))
    tally, _ = Tally.objects.get_or_create(key=payload["key"])
    Tally.objects.filter(pk=tally.pk).update(count=F("count") + 1)
    return payload["key"]


# Used by the durability tests: recorded by the appender, run by workers.
tally = define_workflow(
    "tally",
    trigger=on_event("tally.requested"),
    start_mode="deferred",
    steps=[
        s.call(
            "counted",
            "shop.count",
            lambda ctx: {"key": str(ctx.run.id), "sleep": ctx.event.payload.get("sleep", 0)},
        ),
        s.return_(lambda ctx: ctx.steps["counted"]),
    ],
)

# Used by the poison-run tests: recorded by the appender, run by workers; a
# worker started with SHOP_POISON=1 has a projection that the database makes
# fail for this workflow's waits (the database refuses its segment).
poison_pill = define_workflow(
    "poison-pill",
    trigger=on_event("poison.requested"),
    start_mode="deferred",
    steps=[s.wait("PT1H"), s.return_("never")],
)

if settings.SHOP_POISON:

    def _refused_by_the_database(event):
        from kumiflow_django.models import WorkflowRun
        from testproject.shop.models import Tally

        if WorkflowRun.objects.filter(pk=event.stream_id, workflow="poison-pill").exists():
            Tally.objects.get_or_create(key="poison")
            Tally.objects.create(key="poison")  # a real unique-constraint violation

    define_projection(
        "poison", {"kumiflow.workflow.step.waiting": _refused_by_the_database}, replace=True
    )

if settings.SHOP_CRON_EVERY_SECOND:
    # Only for the two-scheduler test: a schedule with an occurrence every second.
    every_second = define_workflow(
        "every-second",
        trigger=on_cron("* * * * * *", misfire="all", max_catch_up=1000),
        steps=[s.return_(lambda ctx: ctx.event.payload["scheduled_for"])],
    )

if settings.SHOP_BROKEN_CRON:
    # Only for the test that `manage.py check` reports an invalid definition.
    define_workflow("broken-cron", trigger=on_cron("61 25 * * *"), steps=[])
