"""The SSRF guard of webhook delivery.

A webhook URL often comes from user data, so it must not reach the
loopback interface, the private network or a cloud metadata address. Two
things make a guard in front of the HTTP client unsound: a URL that two
parsers read differently (``http://127.0.0.1:80\\@8.8.8.8/`` is host
8.8.8.8 to ``urlsplit`` and 127.0.0.1 to urllib3), and a name that resolves
to a public address for the check and to a private one for the connection
(DNS rebinding). So the guard works in two places:

- :func:`url_problem`, at request time and without DNS, reads the URL with
  the client's own parser and refuses what is wrong without a lookup: other
  schemes, user info, backslashes, control characters, a URL the parsers
  read differently, odd IPv4 spellings, ``localhost`` names, literal
  non-public addresses;
- :class:`GuardedAdapter`, at connection time: its urllib3 connections
  resolve the host themselves, check every address and connect only to a
  checked one. The Host header, the TLS server name (SNI) and certificate
  verification keep using the host name, so pinning the address changes
  nothing else.

``KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS`` lists host names (compared with
the name as the client reads it) and IP networks that may be reached
although they are not public.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import sys
import unicodedata
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util import parse_url
from urllib3.util.connection import allowed_gai_family

from kumiflow_django.conf import settings
from kumiflow_django.store.errors import PermanentFailure

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_ALLOW_HINT = "allow it in KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS if that is intended"


class Refused(PermanentFailure):
    """A webhook target the SSRF rules refuse: final, never retried.

    Raised inside the HTTP client at connection time; neither urllib3 nor
    requests wrap it, so it reaches the dispatch loop as it is.
    """


# Ranges that are not public, first match names the reason. Python's
# ``is_global`` (checked as well) misses several of them, differently in each
# version: multicast, 192.0.0.0/24, the 6to4 relays, IPv4-compatible and
# IPv4-translated IPv6, NAT64 of a private address, site-local, ...
_V4_REFUSED = tuple(
    (ipaddress.IPv4Network(network), what)
    for network, what in (
        ("0.0.0.0/8", "this network"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared address space"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
    )
)
# The forms that embed an IPv4 address are refused whatever they embed, except
# NAT64's well-known prefix (DNS64 networks answer it for IPv4-only hosts),
# whose embedded address is checked like any IPv4 address.
_V6_REFUSED = tuple(
    (ipaddress.IPv6Network(network), what)
    for network, what in (
        ("::1/128", "loopback"),
        ("::/128", "unspecified"),
        ("::ffff:0:0/96", "IPv4-mapped"),
        ("::ffff:0:0:0/96", "IPv4-translated"),
        ("::/96", "IPv4-compatible"),
        ("64:ff9b:1::/48", "local-use NAT64"),
        ("100::/64", "discard-only"),
        ("2001::/32", "Teredo"),
        ("2001::/23", "IETF protocol assignments"),
        ("2001:db8::/32", "documentation"),
        ("2002::/16", "6to4"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "segment routing"),
        ("fc00::/7", "unique local"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    )
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")


def address_problem(address: IPAddress) -> str | None:
    """Why ``address`` is not a public unicast address, or None if it is one."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
            problem = address_problem(embedded)
            return f"NAT64 of {embedded}, {problem}" if problem else None
        for network6, what in _V6_REFUSED:
            if address in network6:
                return f"{network6}: {what}"
        if address not in _GLOBAL_UNICAST:
            return f"outside global unicast {_GLOBAL_UNICAST}"
    else:
        for network4, what in _V4_REFUSED:
            if address in network4:
                return f"{network4}: {what}"
    if not address.is_global:
        return "not globally reachable"
    return None


# -- reading a URL as the client does ---------------------------------------------

_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
_NUMBER = re.compile(r"0x[0-9a-f]*|[0-9]+")  # a label inet_aton() reads as a number


def _odd_character(url: str) -> bool:
    return any(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in url)


def _client_host_port(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url`` as requests hands it to its connection pool.

    requests prepares the URL with urllib3's parser (which also applies IDNA
    and percent-decodes the host), then reads the prepared URL with
    ``urlsplit`` (requests >= 2.32) or urllib3 (older): both must agree.
    Raises ``ValueError`` with the client's reason.
    """
    prepared = requests.PreparedRequest()
    try:
        prepared.prepare_url(url, None)
    except requests.RequestException as exc:
        raise ValueError(str(exc)) from exc
    assert prepared.url is not None
    split = urlsplit(prepared.url)
    parsed = parse_url(prepared.url)
    host = split.hostname or ""
    if (
        split.scheme != parsed.scheme
        or host != (parsed.host or "").strip("[]").lower()
        or split.port != parsed.port
    ):
        raise ValueError(f"the client's parsers disagree on {prepared.url!r}")
    return split.scheme, host, split.port


def client_host(name: str) -> str | None:
    """A host name as the client reads it (IDNA, lower case), or None if it reads none."""
    try:
        _, host, _ = _client_host_port(f"http://{name}/")
    except ValueError:
        return None
    return host


def _allow_list() -> tuple[set[str], list[IPNetwork]]:
    names: set[str] = set()
    networks: list[IPNetwork] = []
    for entry in settings.WEBHOOK_ALLOWED_PRIVATE_HOSTS:
        try:
            networks.append(ipaddress.ip_network(entry.strip().strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        name = client_host(entry.strip())
        if name:
            names.add(name.removesuffix("."))
    return names, networks


def address_refusal(host: str, address: IPAddress, *, literal: bool = False) -> str | None:
    """Why ``host`` may not be reached at ``address``, or None (the allow-list applies).

    ``literal``: the host is that address, written in the URL.
    """
    problem = address_problem(address)
    if problem is None:
        return None
    names, networks = _allow_list()
    if host.removesuffix(".").lower() in names or any(address in n for n in networks):
        return None
    verb = "is" if literal else "resolves to"
    return (
        f"webhook host {host!r} {verb} the non-public address {address} ({problem}); " + _ALLOW_HINT
    )


def url_problem(url: str) -> str | None:
    """Why the webhook ``url`` is refused before any DNS lookup, or None.

    The rest (what a host name resolves to) is checked when connecting.
    """
    if _odd_character(url):
        return f"webhook url {url!r} contains whitespace or a control character"
    if "\\" in url:
        return f"webhook url {url!r} contains a backslash (URL parsers disagree on its host)"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"only http and https webhooks are allowed, not {parts.scheme or 'no scheme'!r}"
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        return f"webhook url {url!r} has an invalid port (a number from 1 to 65535)"
    if "@" in parts.netloc:
        return "a webhook url must not carry a user name or password; send credentials in a header"
    if not parts.hostname:
        return f"webhook url {url!r} has no host"
    try:
        scheme, host, client_port = _client_host_port(url)
    except ValueError as exc:
        return f"webhook url {url!r} is not a valid URL for the HTTP client ({exc})"
    # The host we check must be the host we connect to: compare our reading
    # (urlsplit, names put through the client's IDNA) with the client's.
    ours = parts.hostname if parts.hostname.isascii() else client_host(parts.hostname)
    if (scheme, host, client_port) != (parts.scheme, ours, port):
        return (
            f"webhook url {url!r} reads differently to different URL parsers "
            f"(host {parts.hostname!r} or {host!r})"
        )
    return host_problem(host)


def host_problem(host: str) -> str | None:
    """Why the host (as the client reads it) is refused without DNS, or None."""
    if "%" in host:
        return f"webhook host {host!r} has a percent sign (zone ids are not allowed)"
    if ":" in host:
        try:
            address: IPAddress = ipaddress.IPv6Address(host)
        except ValueError:
            return f"webhook host {host!r} is not a valid IPv6 address"
        return address_refusal(host, address, literal=True)
    name = host.removesuffix(".")
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return f"webhook host {host!r} is not a valid host name"
    if _NUMBER.fullmatch(labels[-1]):
        # What the resolver would read as an IPv4 address: only the canonical
        # dotted-decimal spelling is accepted (not 2130706433, 0177.0.0.1,
        # 0x7f.1 or 127.1).
        try:
            address = ipaddress.IPv4Address(name)
        except ValueError:
            return (
                f"webhook host {host!r} is not an IPv4 address in dotted decimal "
                "(a.b.c.d, no octal, hex or short forms)"
            )
        return address_refusal(host, address, literal=True)
    if (name == "localhost" or name.endswith(".localhost")) and name not in _allow_list()[0]:
        return f"webhook host {host!r} is a loopback name; {_ALLOW_HINT}"
    return None


# -- connecting to a checked address ------------------------------------------------


def resolve(host: str, port: int) -> list[tuple[Any, ...]]:
    """The one DNS lookup of a connection; its answer is checked, then used."""
    return socket.getaddrinfo(host, port, allowed_gai_family(), socket.SOCK_STREAM)


def checked_addresses(host: str, port: int) -> list[tuple[Any, ...]]:
    """Resolve ``host`` and refuse it if any of its addresses is refused.

    Raises :class:`Refused`, or ``socket.gaierror`` when the name does not
    resolve (a retryable failure).
    """
    infos = resolve(host, port)
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        reason = address_refusal(host, address)
        if reason:
            raise Refused(reason)
    return infos


def _open_socket(conn: HTTPConnection) -> socket.socket:
    """What urllib3's ``create_connection`` does, to checked addresses only."""
    host = conn._dns_host.strip("[]")
    try:
        infos = checked_addresses(host, conn.port)
    except socket.gaierror as exc:
        raise NewConnectionError(conn, f"Failed to resolve {conn.host!r} ({exc})") from exc
    error: OSError = OSError(f"{conn.host!r} resolves to no address")
    for family, type_, proto, _, sockaddr in infos:
        sock = socket.socket(family, type_, proto)
        try:
            for option in conn.socket_options or ():
                sock.setsockopt(*option)
            sock.settimeout(conn.timeout)
            if conn.source_address:
                sock.bind(conn.source_address)
            sock.connect(sockaddr)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        sys.audit("http.client.connect", conn, conn.host, conn.port)
        return sock
    if isinstance(error, TimeoutError):
        raise ConnectTimeoutError(
            conn, f"Connection to {conn.host} timed out. (connect timeout={conn.timeout})"
        ) from error
    raise NewConnectionError(conn, f"Failed to establish a new connection: {error}") from error


class GuardedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return _open_socket(self)


class GuardedHTTPSConnection(HTTPSConnection):
    # Only the TCP connection is pinned: SNI, certificate verification and the
    # Host header still use ``self.host``, the name.
    def _new_conn(self) -> socket.socket:
        return _open_socket(self)


class _GuardedHTTPPool(HTTPConnectionPool):
    ConnectionCls = GuardedHTTPConnection


class _GuardedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = GuardedHTTPSConnection


class GuardedAdapter(HTTPAdapter):
    """A requests transport whose connections go to checked addresses only.

    Proxies are refused: through a proxy the proxy would choose the address.
    """

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _GuardedHTTPPool,
            "https": _GuardedHTTPSPool,
        }

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        raise Refused("webhooks are never sent through a proxy")
