"""Delivering ``webhook`` dispatches with ``requests``.

- http and https only; the SSRF rules of :mod:`kumiflow_django.outbox.ssrf` apply:
  :func:`check` refuses at request time what needs no DNS (user info,
  backslashes, a URL the parsers read differently, literal non-public
  addresses, ``localhost``), and the connection resolves the host itself,
  refuses it if any address is not public and connects only to a checked
  address (no DNS rebinding), unless ``KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS``
  allows it;
- no proxies and no ``.netrc`` (the session ignores the environment, except
  ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``): a proxy would pick the address;
- redirects are never followed (a 3xx is a permanent failure);
- the body is compact JSON, signed with HMAC-SHA256 over
  ``"<timestamp>.<body>"`` when the request names a secret of
  ``KUMIFLOW_WEBHOOK_SECRETS``: header ``X-Kumiflow-Signature: v1=<hex>``
  with ``X-Kumiflow-Timestamp``;
- the dispatch id goes in ``Idempotency-Key``, the same on every attempt;
- 2xx is success; 5xx, 429 (honouring ``Retry-After``), network errors and
  names that do not resolve are retried; other 4xx and refused addresses are
  not;
- when the step awaits the response (``capture_response``), its status, the
  headers it names and its body are recorded with the outcome: JSON decoded
  where the response says it is JSON, text otherwise, at most
  ``KUMIFLOW_MAX_RESULT_BYTES`` (a longer body is cut there, as text, and
  marked ``truncated``); the rest is never read.
"""

from __future__ import annotations

import email.utils
import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import requests

from kumiflow_django import __version__
from kumiflow_django.conf import settings
from kumiflow_django.outbox import ssrf
from kumiflow_django.projections.dispatches import Dispatch
from kumiflow_django.store import clock, telemetry
from kumiflow_django.store.errors import DeliveryFailure, InvalidEvent, PermanentFailure
from kumiflow_django.store.values import clean_text, to_json

METHODS = ("POST", "PUT", "PATCH", "DELETE", "GET")
#: Headers the delivery sets itself from the trace context of the delivery's
#: span: a request that names them is refused (not silently overridden).
TRACE_HEADERS = {telemetry.TRACEPARENT, telemetry.TRACESTATE}
_RESERVED_HEADERS = {"idempotency-key", "x-kumiflow-signature", "x-kumiflow-timestamp"}

_local = threading.local()


def session() -> requests.Session:
    """One session per thread (``requests.Session`` is not thread-safe).

    Its transport connects to checked addresses only. It ignores the
    environment (``trust_env``): no ``HTTP(S)_PROXY``, whose proxy would
    choose the address, and no ``.netrc`` credentials sent to webhook hosts;
    the CA bundle variables still apply.
    """
    s = getattr(_local, "session", None)
    if s is None:
        s = requests.Session()
        s.trust_env = False
        s.verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
        adapter = ssrf.GuardedAdapter()
        s.mount("http://", adapter)
        s.mount("https://", adapter)
        _local.session = s
    return s


def check(request: Mapping[str, Any]) -> str | None:
    url = request.get("url")
    if not isinstance(url, str):
        return f"a webhook url must be a string, not {type(url).__name__}"
    problem = ssrf.url_problem(url)
    if problem:
        return problem
    if request.get("method") not in METHODS:
        return f"webhook method must be one of {', '.join(METHODS)}: {request.get('method')!r}"
    headers = request.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        return "webhook headers must map strings to strings"
    names = request.get("response_headers")
    if names is not None and not (
        isinstance(names, list) and all(isinstance(n, str) and 0 < len(n) <= 200 for n in names)
    ):
        return "webhook response_headers must be a list of header names"
    traced = sorted(k for k in headers if k.lower() in TRACE_HEADERS)
    if traced:
        return (
            f"webhook headers must not set {', '.join(traced)}: kumiflow-django sends "
            "the trace context of the delivery itself"
        )
    timeout = request.get("timeout")
    if timeout is not None and not (
        isinstance(timeout, list) and len(timeout) == 2 and all(_positive(t) for t in timeout)
    ):
        return f"webhook timeout must be (connect, read) seconds: {timeout!r}"
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


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


#: The response headers an awaiting step gets when it names none.
DEFAULT_RESPONSE_HEADERS = (
    "Content-Type",
    "Content-Length",
    "ETag",
    "Last-Modified",
    "Location",
    "Link",
    "Retry-After",
    "X-Request-Id",
)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def read_response(response: requests.Response, header_names: Sequence[str]) -> dict[str, Any]:
    """What an awaiting step gets: status, the named headers, the body (capped)."""
    cap = int(settings.MAX_RESULT_BYTES)
    raw = b""
    truncated = False
    for chunk in response.iter_content(chunk_size=65_536):
        raw += chunk
        if len(raw) > cap:
            raw, truncated = raw[:cap], True
            break
    headers = {
        name: clean_text(response.headers[name], 2000)
        for name in header_names
        if name in response.headers
    }
    content_type = response.headers.get("Content-Type", "")
    text = raw.decode(response.encoding or "utf-8", errors="replace") if raw else ""
    body: Any = clean_text(text, cap)
    if raw and not truncated and _is_json(content_type):
        try:
            body = to_json(json.loads(text), "a webhook response's body", max_bytes=cap)
        except (ValueError, InvalidEvent):
            pass  # not JSON after all (or not storable as such): the text
    return {
        "status": response.status_code,
        "headers": headers,
        "body": body if raw else None,
        "truncated": truncated,
    }


#: A body nobody awaits is read up to this many bytes (so that the connection
#: can be kept alive); a longer one is not read, its connection is closed.
DRAIN_BYTES = 65_536


def _drain(response: requests.Response) -> None:
    read = 0
    for chunk in response.iter_content(chunk_size=16_384):
        read += len(chunk)
        if read > DRAIN_BYTES:
            return


def deliver(request: Mapping[str, Any], dispatch: Dispatch) -> dict[str, Any]:
    url = request["url"]
    problem = ssrf.url_problem(url)
    if problem:
        raise PermanentFailure(problem)
    body = b""
    if "body" in request:
        body = json.dumps(request["body"], separators=(",", ":"), ensure_ascii=False).encode()
    timestamp = str(int(time.time()))
    headers = {
        k: v
        for k, v in (request.get("headers") or {}).items()
        if k.lower() not in _RESERVED_HEADERS and k.lower() not in TRACE_HEADERS
    }
    headers.setdefault("Content-Type", "application/json")
    headers.setdefault("User-Agent", f"kumiflow-django/{__version__}")
    headers["Idempotency-Key"] = dispatch.idempotency_key
    headers["X-Kumiflow-Timestamp"] = timestamp
    headers.update(telemetry.carrier() or {})  # traceparent: the delivery's span
    secret_name = request.get("secret")
    if secret_name:
        secret = settings.WEBHOOK_SECRETS.get(secret_name)
        if not secret:
            raise PermanentFailure(
                f"webhook secret {secret_name!r} is not in KUMIFLOW_WEBHOOK_SECRETS"
            )
        headers["X-Kumiflow-Signature"] = sign(secret, timestamp, body)
    timeout = tuple(request.get("timeout") or settings.WEBHOOK_TIMEOUT)
    # The connection refuses a non-public address with ssrf.Refused, a
    # PermanentFailure that requests lets through unwrapped.
    capture = bool(request.get("capture_response"))
    try:
        response = session().request(
            request["method"],
            url,
            data=body or None,
            headers=headers,
            timeout=timeout,
            allow_redirects=False,
            stream=True,  # the body is read only when awaited, and only up to the cap
        )
        try:
            answer = None
            if capture:
                names = request.get("response_headers") or DEFAULT_RESPONSE_HEADERS
                answer = read_response(response, names)
            else:
                _drain(response)
        finally:
            response.close()
    except requests.Timeout as exc:
        raise DeliveryFailure(f"webhook request timed out ({type(exc).__name__})") from exc
    except requests.RequestException as exc:
        raise DeliveryFailure(f"webhook request failed ({type(exc).__name__}: {exc})") from exc
    status = response.status_code
    if 200 <= status < 300:
        return {"status_code": status, "response": answer}
    reason = f"HTTP {status}: {response.reason}"
    if 300 <= status < 400:
        location = response.headers.get("Location", "")
        raise PermanentFailure(
            f"{reason}; redirects are not followed (to {location!r})",
            status_code=status,
            response=answer,
        )
    if status == 429 or status >= 500:
        retry_after = _retry_after(response.headers.get("Retry-After"))
        raise DeliveryFailure(reason, status_code=status, retry_after=retry_after, response=answer)
    raise PermanentFailure(reason, status_code=status, response=answer)
