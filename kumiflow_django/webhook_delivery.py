"""Delivering ``webhook`` dispatches with ``requests``.

- http and https only; a host that resolves to a private, loopback,
  link-local or otherwise non-public address is refused unless allowed by
  ``KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS``;
- redirects are never followed (a 3xx is a permanent failure);
- the body is compact JSON, signed with HMAC-SHA256 over
  ``"<timestamp>.<body>"`` when the request names a secret of
  ``KUMIFLOW_WEBHOOK_SECRETS``: header ``X-Kumiflow-Signature: v1=<hex>``
  with ``X-Kumiflow-Timestamp``;
- the dispatch id goes in ``Idempotency-Key``, the same on every attempt;
- 2xx is success; 5xx, 429 (honouring ``Retry-After``) and network errors
  are retried; other 4xx are not.
"""

from __future__ import annotations

import email.utils
import hashlib
import hmac
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import requests

from kumiflow_django import __version__, clock
from kumiflow_django.conf import settings
from kumiflow_django.delivery_errors import DeliveryFailure, PermanentFailure
from kumiflow_django.models.dispatch import Dispatch

METHODS = ("POST", "PUT", "PATCH", "DELETE", "GET")
_RESERVED_HEADERS = {"idempotency-key", "x-kumiflow-signature", "x-kumiflow-timestamp"}

_local = threading.local()


def session() -> requests.Session:
    """One session per thread (``requests.Session`` is not thread-safe)."""
    s = getattr(_local, "session", None)
    if s is None:
        s = requests.Session()
        _local.session = s
    return s


def check(request: Mapping[str, Any]) -> str | None:
    url = request.get("url")
    if not isinstance(url, str):
        return f"a webhook url must be a string, not {type(url).__name__}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"only http and https webhooks are allowed, not {parts.scheme or 'no scheme'!r}"
    if not parts.hostname:
        return f"webhook url {url!r} has no host"
    if request.get("method") not in METHODS:
        return f"webhook method must be one of {', '.join(METHODS)}: {request.get('method')!r}"
    headers = request.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        return "webhook headers must map strings to strings"
    timeout = request.get("timeout")
    if timeout is not None and not (
        isinstance(timeout, list) and len(timeout) == 2 and all(_positive(t) for t in timeout)
    ):
        return f"webhook timeout must be (connect, read) seconds: {timeout!r}"
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _allowed(host: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    for entry in settings.WEBHOOK_ALLOWED_PRIVATE_HOSTS:
        if entry.lower() == host.lower():
            return True
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def check_host(host: str, port: int) -> None:
    """Refuse hosts that resolve to non-public addresses (SSRF guard)."""
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise DeliveryFailure(f"webhook host {host!r} does not resolve ({exc})") from exc
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if not address.is_global and not _allowed(host, address):
            raise PermanentFailure(
                f"webhook host {host!r} resolves to the non-public address {address}; "
                "allow it in KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS if that is intended"
            )


def sign(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + digest.hexdigest()


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - clock.now()).total_seconds())


def deliver(request: Mapping[str, Any], dispatch: Dispatch) -> dict[str, Any]:
    url = request["url"]
    parts = urlsplit(url)
    host = parts.hostname or ""
    check_host(host, parts.port or (443 if parts.scheme == "https" else 80))
    body = b""
    if "body" in request:
        body = json.dumps(request["body"], separators=(",", ":"), ensure_ascii=False).encode()
    timestamp = str(int(time.time()))
    headers = {
        k: v
        for k, v in (request.get("headers") or {}).items()
        if k.lower() not in _RESERVED_HEADERS
    }
    headers.setdefault("Content-Type", "application/json")
    headers.setdefault("User-Agent", f"kumiflow-django/{__version__}")
    headers["Idempotency-Key"] = dispatch.idempotency_key
    headers["X-Kumiflow-Timestamp"] = timestamp
    secret_name = request.get("secret")
    if secret_name:
        secret = settings.WEBHOOK_SECRETS.get(secret_name)
        if not secret:
            raise PermanentFailure(
                f"webhook secret {secret_name!r} is not in KUMIFLOW_WEBHOOK_SECRETS"
            )
        headers["X-Kumiflow-Signature"] = sign(secret, timestamp, body)
    timeout = tuple(request.get("timeout") or settings.WEBHOOK_TIMEOUT)
    try:
        response = session().request(
            request["method"],
            url,
            data=body or None,
            headers=headers,
            timeout=timeout,
            allow_redirects=False,
        )
    except requests.Timeout as exc:
        raise DeliveryFailure(f"webhook request timed out ({type(exc).__name__})") from exc
    except requests.RequestException as exc:
        raise DeliveryFailure(f"webhook request failed ({type(exc).__name__}: {exc})") from exc
    status = response.status_code
    response.close()
    if 200 <= status < 300:
        return {"status_code": status}
    reason = f"HTTP {status}: {response.reason}"
    if 300 <= status < 400:
        location = response.headers.get("Location", "")
        raise PermanentFailure(
            f"{reason}; redirects are not followed (to {location!r})", status_code=status
        )
    if status == 429 or status >= 500:
        retry_after = _retry_after(response.headers.get("Retry-After"))
        raise DeliveryFailure(reason, status_code=status, retry_after=retry_after)
    raise PermanentFailure(reason, status_code=status)
