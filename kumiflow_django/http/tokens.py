"""Creating, finding and revoking API tokens.

A token is shown once, when it is created; afterwards only its hash exists.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from kumiflow_django.conf import settings
from kumiflow_django.http.models import ApiToken
from kumiflow_django.store import sql

#: Every permission the HTTP API checks, as ``app_label.codename``. The first
#: four are the app's own (the admin checks them too); the last two are new.
VIEW = "kumiflow.view_workflowrun"
CANCEL = "kumiflow.cancel_workflowrun"
RETRY = "kumiflow.retry_workflowrun"
WAKE = "kumiflow.wake_workflowrun"
START = "kumiflow.start_workflowrun"
APPEND = "kumiflow.append_event"
#: Deciding approvals (``decide_approval``); the admin checks it too.
DECIDE = "kumiflow.decide_approval_workflowrun"
PAUSE = "kumiflow.pause_workflowrun"
FAIL = "kumiflow.fail_workflowrun"
API_PERMISSIONS = (VIEW, START, APPEND, CANCEL, RETRY, WAKE, PAUSE, FAIL, DECIDE)

#: Tokens start with this, so that a leaked one is recognisable (secret scanners).
PREFIX = "kf_"
#: A token's last use is written at most this often: not one write per request.
LAST_USED_EVERY = timedelta(minutes=1)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def normalize_permissions(perms: Iterable[str]) -> list[str]:
    """``perms`` as full names (``view_workflowrun`` becomes ``kumiflow.view_workflowrun``),
    sorted and without duplicates; ValueError names one the API does not know."""
    result = set()
    for perm in perms:
        full = perm if "." in perm else f"kumiflow.{perm}"
        if full not in API_PERMISSIONS:
            known = ", ".join(API_PERMISSIONS)
            raise ValueError(f"{perm!r} is not a permission of the HTTP API (known: {known})")
        result.add(full)
    return sorted(result)


def create_token(
    name: str,
    *,
    permissions: Iterable[str],
    tenant: str | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token and return it with its secret, which is not stored anywhere."""
    tenant_id = settings.DEFAULT_TENANT if tenant is None else tenant
    if not name or len(name) > 100:
        raise ValueError("a token's name is a non-empty string of at most 100 characters")
    if not tenant_id or len(tenant_id) > 64:
        raise ValueError("a tenant is a non-empty string of at most 64 characters")
    secret = PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(
        name=name,
        key_hash=hash_token(secret),
        permissions=normalize_permissions(permissions),
        tenant_id=tenant_id,
        expires_at=expires_at,
    )
    with transaction.atomic():
        if ApiToken.objects.filter(name=name).exists():
            raise ValueError(f"a token named {name!r} exists already")
        token.save()
    return token, secret


def find_token(secret: str) -> ApiToken | None:
    """The usable token with this secret, or None; records its use (at most once a minute)."""
    return find_token_by_hash(hash_token(secret))


def find_token_by_hash(key_hash: str) -> ApiToken | None:
    """:func:`find_token` by the secret's hash: how a live stream looks its token up
    again without keeping the secret.

    One indexed read of the token's row on every call, never a cached answer: a
    revoked token (its row deleted) or one past its expiry is refused at once.
    The read is :func:`~kumiflow_django.store.sql.select_one`, the expiry the
    condition of ``ApiToken.objects.usable()`` checked on the row read."""
    token = sql.select_one(ApiToken, key_hash=key_hash)
    now = timezone.now()
    if token is None or (token.expires_at is not None and token.expires_at <= now):
        return None
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def revoke_token(name: str) -> bool:
    """Delete the token of this name; False if there is none."""
    deleted, _ = ApiToken.objects.filter(name=name).delete()
    return bool(deleted)
