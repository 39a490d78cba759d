"""Who is calling: a bearer token or a signed-in user, with rights and tenants.

Two schemes, both Django's own building blocks:

- ``Authorization: Bearer <token>``: an :class:`~kumiflow_django.http.models.ApiToken`,
  with the permissions and the one tenant it was created with. No cookies
  are involved, so no CSRF check applies.
- The session (a user signed in through Django's auth, as in the admin):
  the user's Django permissions, the tenants of ``KUMIFLOW_API_USER_TENANTS``,
  and Django's CSRF check on every unsafe request, because a browser sends
  the session cookie along with any site's request.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.module_loading import import_string

from kumiflow_django.conf import settings
from kumiflow_django.http.errors import ApiError
from kumiflow_django.http.tokens import find_token_by_hash, hash_token

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Principal:
    """The caller of one request."""

    #: Who, for logs and ``created_by``: ``token:<name>`` or ``user:<username>``.
    name: str
    #: The tenants the caller sees; the first is where its writes go by default.
    tenants: tuple[str, ...]
    #: The token's permissions; None for a user (Django's ``has_perm`` decides).
    token_permissions: frozenset[str] | None = None
    user: Any = None
    #: The token's hash, to look it up again (:meth:`current`); None for a user.
    key_hash: str | None = field(default=None, repr=False)

    def current(self) -> Principal:
        """The caller as of now, for a request that lasts (a live stream): a token is
        looked up again as a new request looks it up, so a revoked or expired one
        raises the same 401 and changed permissions or tenant count at once. A user
        is as the request's session found them."""
        if self.key_hash is None:
            return self
        return _token_principal(self.key_hash)

    def has_perm(self, perm: str) -> bool:
        if self.token_permissions is not None:
            return perm in self.token_permissions
        return bool(self.user is not None and self.user.has_perm(perm))

    def require(self, perm: str) -> None:
        if not self.has_perm(perm):
            raise ApiError("forbidden", f"this needs the permission {perm}")

    def tenant(self, requested: str | None, field: str = "tenant") -> str:
        """The tenant a write goes to: the requested one if the caller may use it."""
        if requested is None:
            if not self.tenants:
                raise ApiError("forbidden", "you may see no tenant", field)
            return self.tenants[0]
        if requested not in self.tenants:
            raise ApiError("forbidden", f"you may not use tenant {requested!r}", field)
        return requested


def authenticate(request: HttpRequest) -> Principal:
    """The caller of ``request``, or an :class:`ApiError` (401, or 403 for CSRF)."""
    header = request.META.get("HTTP_AUTHORIZATION")
    if header is not None:
        return _token_principal(_bearer_hash(header))
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        raise ApiError(
            "unauthenticated", "send Authorization: Bearer <token>, or sign in (session)"
        )
    if request.method not in SAFE_METHODS:
        reason = _csrf_failure(request)
        if reason is not None:
            raise ApiError("forbidden", f"CSRF check failed: {reason}")
    username = user.get_username()
    return Principal(name=f"user:{username}", tenants=user_tenants(user), user=user)


def _bearer_hash(header: str) -> str:
    scheme, _, secret = header.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise ApiError("unauthenticated", "the Authorization header must be: Bearer <token>")
    return hash_token(secret)


def _token_principal(key_hash: str) -> Principal:
    """The caller of a token: what every request checks, and a stream again while it lasts."""
    token = find_token_by_hash(key_hash)
    if token is None:
        raise ApiError("unauthenticated", "the token is unknown, revoked or expired")
    return Principal(
        name=f"token:{token.name}",
        tenants=(token.tenant_id,),
        token_permissions=frozenset(token.permissions),
        key_hash=key_hash,
    )


def user_tenants(user: Any) -> tuple[str, ...]:
    """The tenants a signed-in user sees (``KUMIFLOW_API_USER_TENANTS``)."""
    path = settings.API_USER_TENANTS
    if path is None:
        return (settings.DEFAULT_TENANT,)
    found = import_string(path)(user)
    if isinstance(found, str):
        return (found,)
    if found is None:
        return ()
    return tuple(dict.fromkeys(_check_tenants(found, path)))


def _check_tenants(found: Iterable[Any], path: str) -> Iterable[str]:
    for tenant in found:
        if not isinstance(tenant, str) or not tenant:
            raise TypeError(f"{path} returned {tenant!r}, which is not a tenant (a string)")
        yield tenant


class _Csrf(CsrfViewMiddleware):
    """Django's CSRF check, answering the reason instead of a page."""

    def _reject(self, request: HttpRequest, reason: str) -> HttpResponse:
        response = HttpResponse(status=403)
        response.reason_phrase = reason
        return response


def _csrf_failure(request: HttpRequest) -> str | None:
    """Why Django's CSRF check refuses ``request``; None if it passes."""

    def no_response(request: HttpRequest) -> HttpResponse:  # pragma: no cover - never called
        raise AssertionError

    check = _Csrf(no_response)
    check.process_request(request)
    response = check.process_view(request, _csrf_protected, (), {})
    return None if response is None else response.reason_phrase


def _csrf_protected(request: HttpRequest) -> HttpResponse:  # pragma: no cover - only inspected
    """What the CSRF check sees as the view: not exempt, whatever the API's views are."""
    raise AssertionError
