"""The shop's workflows: the reference engine's three sample workflows.

- ``user-onboarding``: welcome mail, wait a day, tips or a reminder depending
  on engagement, wait a week, tell the CRM.
- ``webhook-delivery``: one webhook per processed data event.
- ``daily-report``: a webhook every morning at 09:00 UTC.
- ``order-invoice``: renders an invoice outside the transaction (a task step).
- ``refund-approval``: a refund waits for a person's approval (the console's
  "Send event"), or is declined after three days.
- ``invoice-reminder``: reminds a customer of an overdue invoice; an invoice
  of a customer the shop does not know fails (the demo's failed run).

And the probes the tests start: task steps (``task-*``), compensation and
branches under SIGKILL and four workers.
"""

from __future__ import annotations

import os

from django.conf import settings

from kumiflow_django import Limit, define_projection, define_workflow, on_cron, on_event
from kumiflow_django import steps as s
from testproject.shop import tasks as shop_tasks


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
    marker = payload.get("marker")
    if marker and not os.path.exists(marker):
        # A durability test kills the process now: the update above is in the
        # open transaction, and must be rolled back and done once more.
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(payload.get("hold", 60))
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


def _order(ctx):
    return ctx.event.payload["order"]


# Used by the HTTP tests: started through the API, driven by the test's events
# (an approval, then a shipment), followed through its live stream.
http_approval = define_workflow(
    "http-approval",
    steps=[
        s.compute("order", _order),
        s.wait_for_event(
            "approval.granted", match={"payload.order": _order}, timeout="P1D", name="granted"
        ),
        s.wait_for_event(
            "approval.shipped", match={"payload.order": _order}, timeout="P1D", name="shipped"
        ),
        s.return_(lambda ctx: {"order": _order(ctx), "by": ctx.steps["granted"]["payload"]["by"]}),
    ],
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


def rolling_deploy(release):
    """Two releases of one workflow, as a rolling deploy runs them side by side:
    release "b" has one more step. The result names the process that ran the
    last segment and the release it had."""
    extra = [s.wait("PT0.01S")] if release == "b" else []
    return define_workflow(
        "rolling-deploy",
        steps=[
            s.wait("PT0.3S"),
            *extra,
            s.return_(lambda ctx: {"release": settings.SHOP_RELEASE, "pid": os.getpid()}),
        ],
    )


def _run_id(ctx):
    return str(ctx.run.id)


def safe_deploy(release):
    """A compatible change across a rolling deploy: a run charges once, waits
    for its "go", and release "b" appends a receipt. A run of release "a"
    carried on by a worker of "b" gets the receipt too, and is charged once."""
    receipt = (
        [s.call("receipt", "shop.count", lambda ctx: {"key": f"receipt:{ctx.run.id}"})]
        if release == "b"
        else []
    )
    return define_workflow(
        "safe-deploy",
        steps=[
            s.call("charged", "shop.count", lambda ctx: {"key": f"charge:{ctx.run.id}"}),
            s.wait_for_event("deploy.go", match={"payload.run": _run_id}, name="go"),
            *receipt,
        ],
    )


if settings.SHOP_RELEASE:
    rolling_deploy(settings.SHOP_RELEASE)
    safe_deploy(settings.SHOP_RELEASE)

# -- task steps: work outside the transaction ---------------------------------

invoice = define_workflow(
    "order-invoice",
    steps=[
        s.task(
            "invoice",
            shop_tasks.render_invoice,
            args=lambda ctx: [ctx.event.payload["order_id"], ctx.event.payload["lines"]],
            timeout=30,
        ),
        s.return_(lambda ctx: ctx.steps["invoice"]),
    ],
)


def _task_args(ctx):
    return ctx.event.payload.get("args", [])


def _task_probe(name, fn, **options):
    """A workflow of one task step (probing it) whose result is the run's."""
    return define_workflow(
        name,
        steps=[
            s.task("result", fn, args=_task_args, **options),
            s.return_(lambda ctx: ctx.steps["result"]),
        ],
    )


# The probes of tests/tasks/: one workflow per behaviour, the same in every process.
_FAST_RETRY = {"attempts": 3, "base": 0.1, "jitter": 0.0}
_task_probe("task-double", shop_tasks.double)
_task_probe("task-double-immediate", shop_tasks.double_immediate)
if "db" in settings.TASKS:
    _task_probe("task-double-db", shop_tasks.double_db)
if "rq" in settings.TASKS:
    _task_probe("task-double-rq", shop_tasks.double_rq)
_task_probe("task-held", shop_tasks.held_then, timeout=60)
_task_probe("task-slow-first", shop_tasks.slow_first, timeout=1, retry=_FAST_RETRY)
_task_probe("task-heartbeat", shop_tasks.heartbeating, timeout=60, heartbeat_timeout=2)
_task_probe("task-cancellable", shop_tasks.until_cancelled, timeout=60)
_task_probe("task-sigkill", shop_tasks.marker_then_sleep, timeout=3, retry=_FAST_RETRY)
_task_probe("task-flaky", shop_tasks.fails, retry=_FAST_RETRY)
_task_probe("task-outage", shop_tasks.fails_until_fixed, retry={**_FAST_RETRY, "attempts": 2})
_task_probe("task-bad-input", shop_tasks.bad_value, non_retryable=(ValueError,))
_task_probe(
    "task-bad-input-result",
    shop_tasks.bad_value,
    non_retryable=(ValueError,),
    on_error="result",
)
_task_probe("task-unstorable", shop_tasks.unstorable)
_task_probe("task-too-large", shop_tasks.too_large)


# -- compensation: the durability test kills a worker while it compensates ----


def _probe_key(suffix):
    return lambda ctx: {"key": f"{ctx.event.payload['id']}:{suffix}"}


def _undo_b(ctx):
    return {"key": f"{ctx.event.payload['id']}:undo-b", "marker": ctx.event.payload.get("marker")}


compensation_probe = define_workflow(
    "compensation-probe",
    steps=[
        s.call(
            "a",
            "shop.count",
            _probe_key("a"),
            compensate=[s.call(None, "shop.count", _probe_key("undo-a"))],
        ),
        s.wait("PT1S"),
        s.call(
            "b", "shop.count", _probe_key("b"), compensate=[s.call(None, "shop.count", _undo_b)]
        ),
        s.wait("PT1S"),
        s.compute("boom", lambda ctx: 1 / 0),
    ],
)


# -- branches of one run never run at the same time (four workers) -------------


@s.handler("shop.interval")
def interval(payload):
    """Append when this step ran (start and end, wall clock) to a log file."""
    import time

    start = time.time()
    time.sleep(0.02)
    with open(payload["log"], "a") as f:
        f.write(f"{payload['run']} {payload['branch']} {start!r} {time.time()!r}\n")
    return payload["branch"]


def _interval(branch):
    return lambda ctx: {"log": ctx.event.payload["log"], "run": str(ctx.run.id), "branch": branch}


branches_probe = define_workflow(
    "branches-probe",
    start_mode="deferred",
    steps=[
        s.parallel(
            "ran",
            {
                f"b{n}": [
                    s.wait(f"PT{n % 3}S"),
                    s.call(f"first{n}", "shop.interval", _interval(f"b{n}.1")),
                    s.wait("PT1S"),
                    s.call(f"second{n}", "shop.interval", _interval(f"b{n}.2")),
                ]
                for n in range(6)
            },
        ),
        s.return_(lambda ctx: sorted(ctx.steps["ran"])),
    ],
)


# -- flow control under four workers (tests/test_flow_control_workers.py) -------


@s.handler("shop.flow_mark")
def flow_mark(payload):
    """Append "key run edge time" to a log file (wall clock: one machine)."""
    import time

    with open(payload["log"], "a") as f:
        f.write(f"{payload['key']} {payload['run']} {payload['edge']} {time.time()!r}\n")
    return payload["edge"]


def _mark(edge):
    return lambda ctx: {
        "log": ctx.event.payload["log"],
        "key": ctx.event.payload["key"],
        "run": str(ctx.run.id),
        "edge": edge,
    }


flow_probe = define_workflow(
    "flow-probe",
    start_mode="deferred",
    concurrency=Limit(key=lambda event: event.payload["key"], max=1),
    steps=[
        s.call("began", "shop.flow_mark", _mark("start")),
        s.wait("PT0.05S"),
        s.call("ended", "shop.flow_mark", _mark("end")),
    ],
)

flow_task_probe = define_workflow(
    "flow-task-probe",
    start_mode="deferred",
    steps=[
        s.task(
            "slow",
            shop_tasks.limited_call,
            args=lambda ctx: [ctx.event.payload["log"], ctx.event.payload["key"]],
            concurrency=Limit(key=lambda ctx: ctx.event.payload["key"], max=3),
            # an outcome lost to the database is tried again soon (at least once)
            timeout="PT20S",
        ),
    ],
)
