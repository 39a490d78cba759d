"""``mail_send``: request an email through the outbox.

The step only writes the request (a ``Dispatch`` row and a
``step.dispatch-requested`` event) in the segment's transaction; the
dispatch loop delivers it after commit through Django's email backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kumiflow_django.definition.context import Context
from kumiflow_django.definition.step import (
    Resolver,
    Step,
    StepKind,
    compensated,
    register_step_kind,
    resolve,
)
from kumiflow_django.steps.dispatch import delivery_result, request


def _addresses(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


class MailSendKind(StepKind):
    kind = "mail_send"
    resolver_args = ("to", "subject", "body", "from_", "cc", "bcc", "reply_to", "html", "headers")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        if resume is not None:
            return delivery_result(ctx)
        a = step.args
        message = {
            "to": _addresses(resolve(a["to"], ctx)),
            "cc": _addresses(resolve(a["cc"], ctx)),
            "bcc": _addresses(resolve(a["bcc"], ctx)),
            "reply_to": _addresses(resolve(a["reply_to"], ctx)),
            "subject": resolve(a["subject"], ctx),
            "body": resolve(a["body"], ctx),
            "html": resolve(a["html"], ctx),
            "from": resolve(a["from_"], ctx),
            "headers": resolve(a["headers"], ctx) or {},
        }
        return request(ctx, path, "mail", message, a["retry"], a["await_delivery"])

    def describe(self, step: Step) -> str:
        subject = step.args["subject"]
        return f"mail {subject!r}" if isinstance(subject, str) else "mail"


def mail_send(
    to: Resolver,
    subject: Resolver,
    body: Resolver,
    *,
    from_: Resolver = None,
    cc: Resolver = None,
    bcc: Resolver = None,
    reply_to: Resolver = None,
    html: Resolver = None,
    headers: Resolver = None,
    retry: Mapping[str, Any] | None = None,
    await_delivery: bool = False,
    name: str | None = None,
    compensate: Sequence[Step] | None = None,
) -> Step:
    """Request an email. ``retry`` overrides ``KUMIFLOW_DISPATCH_RETRY`` for it;
    ``await_delivery=True`` suspends the run until it is delivered or dead, and
    stores the outcome under ``name``."""
    args = {
        "to": to,
        "subject": subject,
        "body": body,
        "from_": from_,
        "cc": cc,
        "bcc": bcc,
        "reply_to": reply_to,
        "html": html,
        "headers": headers,
        "retry": dict(retry) if retry else None,
        "await_delivery": await_delivery,
    }
    return compensated(Step("mail_send", name, args), compensate)


register_step_kind(MailSendKind())
