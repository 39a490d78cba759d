"""Delivering ``mail`` dispatches through Django's configured email backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.mail import EmailMultiAlternatives

from kumiflow_django.projections.dispatches import Dispatch
from kumiflow_django.store.errors import PermanentFailure


def check(request: Mapping[str, Any]) -> str | None:
    if not request.get("to"):
        return "a mail needs at least one recipient in to"
    for field in ("to", "cc", "bcc", "reply_to"):
        values = request.get(field) or []
        if not isinstance(values, list) or not all(isinstance(v, str) and "@" in v for v in values):
            return f"mail {field} must be a list of email addresses: {values!r}"
    for field in ("subject", "body"):
        if not isinstance(request.get(field), str):
            return f"mail {field} must be a string"
    if request.get("html") is not None and not isinstance(request["html"], str):
        return "mail html must be a string"
    headers = request.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        return "mail headers must map strings to strings"
    return None


def deliver(request: Mapping[str, Any], dispatch: Dispatch) -> dict[str, Any]:
    headers = dict(request.get("headers") or {})
    headers.setdefault("X-Kumiflow-Dispatch", str(dispatch.id))
    message = EmailMultiAlternatives(
        subject=request["subject"],
        body=request["body"],
        from_email=request.get("from") or None,
        to=request["to"],
        cc=request.get("cc") or None,
        bcc=request.get("bcc") or None,
        reply_to=request.get("reply_to") or None,
        headers=headers,
    )
    if request.get("html"):
        message.attach_alternative(request["html"], "text/html")
    try:
        sent = message.send()
    except ValueError as exc:  # a malformed header or address: it will never go through
        raise PermanentFailure(f"mail refused: {exc}") from exc
    return {"sent": sent}
