"""``webhook_send``: request an HTTP call through the outbox.

Like ``mail_send`` the step only records the request in the segment's
transaction. The secret is named, not given: the dispatcher looks it up in
``KUMIFLOW_WEBHOOK_SECRETS``, so it never enters the event log.
"""

from __future__ import annotations

import enum
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


class _NoBody(enum.Enum):
    """The default of ``body=``: send no request body (``None`` sends JSON ``null``).

    It never enters the step's arguments (they omit ``body`` instead), so the
    definition fingerprint holds no trace of it.
    """

    NO_BODY = "no body"


_NO_BODY = _NoBody.NO_BODY


class WebhookSendKind(StepKind):
    kind = "webhook_send"
    resolver_args = ("url", "body", "headers")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        if resume is not None:
            return delivery_result(ctx)
        a = step.args
        message: dict[str, Any] = {
            "url": resolve(a["url"], ctx),
            "method": a["method"].upper(),
            "headers": resolve(a["headers"], ctx) or {},
            "secret": a["secret"],
            "timeout": list(a["timeout"]) if a["timeout"] else None,
        }
        if "body" in a:
            message["body"] = resolve(a["body"], ctx)
        if a["await_delivery"]:
            message["capture_response"] = True
            if a.get("response_headers") is not None:
                message["response_headers"] = list(a["response_headers"])
        return request(ctx, path, "webhook", message, a["retry"], a["await_delivery"])

    def describe(self, step: Step) -> str:
        url = step.args["url"]
        return f"webhook {url}" if isinstance(url, str) else "webhook"


def webhook_send(
    url: Resolver,
    *,
    body: Resolver = _NO_BODY,
    method: str = "POST",
    headers: Resolver = None,
    secret: str | None = None,
    timeout: tuple[float, float] | None = None,
    retry: Mapping[str, Any] | None = None,
    await_delivery: bool = False,
    response_headers: Sequence[str] | None = None,
    name: str | None = None,
    compensate: Sequence[Step] | None = None,
) -> Step:
    """Request an HTTP call with a JSON ``body``. ``secret`` names an entry of
    ``KUMIFLOW_WEBHOOK_SECRETS`` used to sign it; ``timeout`` is (connect,
    read) seconds; ``retry`` as for ``mail_send``.

    With ``await_delivery=True`` the run waits for the outcome, and the step's
    result carries the response: ``status_code``, ``headers`` (those named in
    ``response_headers``, or a default set without cookies), ``body`` (JSON
    decoded where the response is JSON, text otherwise, at most
    ``KUMIFLOW_MAX_RESULT_BYTES``) and ``truncated``.
    """
    args: dict[str, Any] = {
        "url": url,
        "method": method,
        "headers": headers,
        "secret": secret,
        "timeout": tuple(timeout) if timeout else None,
        "retry": dict(retry) if retry else None,
        "await_delivery": await_delivery,
    }
    if response_headers is not None:
        if isinstance(response_headers, str) or not all(
            isinstance(h, str) and h for h in response_headers
        ):
            raise ValueError("response_headers must be a list of header names")
        if not await_delivery:
            raise ValueError("response_headers needs await_delivery=True")
        args["response_headers"] = tuple(response_headers)
    if body is not _NO_BODY:
        args["body"] = body
    return compensated(Step("webhook_send", name, args), compensate)


register_step_kind(WebhookSendKind())
