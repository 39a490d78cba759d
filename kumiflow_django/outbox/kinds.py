"""Dispatch kinds: the ways of delivering (``mail``, ``webhook``, yours).

A kind is a ``deliver(request, dispatch)`` function that raises on failure
(``DeliveryFailure`` or ``PermanentFailure`` says whether to try again) and an
optional ``check(request)`` that names a reason the request can never be
delivered (then it is dead at once, without an attempt). Register your own
with :func:`register_dispatch_kind`; the registry is :data:`dispatch_kinds`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kumiflow_django.outbox import mail, webhook
from kumiflow_django.projections.dispatches import Dispatch
from kumiflow_django.store import limits
from kumiflow_django.store.registry import Registry


@dataclass(frozen=True)
class DispatchKind:
    """A way of delivering: ``deliver(request, dispatch)`` raises on failure.

    ``check(request)`` returns a reason the request can never be delivered
    (then it is dead at once), or None.
    """

    name: str
    deliver: Callable[[Mapping[str, Any], Dispatch], Any]
    check: Callable[[Mapping[str, Any]], str | None] | None = None


class DispatchKinds(Registry[DispatchKind]):
    what = "dispatch kind"

    def problem(self, kind: str, request: Mapping[str, Any]) -> str | None:
        """Why a request of ``kind`` can never be delivered, if it cannot."""
        found = self.find(kind)
        if found is None:
            return f"unknown dispatch kind {kind!r}"
        return found.check(request) if found.check is not None else None


#: The one registry of dispatch kinds, with the built-in ``mail`` and ``webhook``.
dispatch_kinds = DispatchKinds()


def register_dispatch_kind(
    name: str,
    deliver: Callable[[Mapping[str, Any], Dispatch], Any],
    *,
    check: Callable[[Mapping[str, Any]], str | None] | None = None,
    replace: bool = False,
) -> DispatchKind:
    """Add a way of delivering (for example ``"sms"``) without touching the engine."""
    if not isinstance(name, str) or not name or len(name) > limits.DISPATCH_KIND:
        raise ValueError(
            f"a dispatch kind needs a name of 1 to {limits.DISPATCH_KIND} characters: {name!r}"
        )
    if name in dispatch_kinds and not replace:
        raise ValueError(f"dispatch kind {name!r} is already registered")
    return dispatch_kinds.add(name, DispatchKind(name, deliver, check), replace=True)


register_dispatch_kind("mail", mail.deliver, check=mail.check)
register_dispatch_kind("webhook", webhook.deliver, check=webhook.check)
