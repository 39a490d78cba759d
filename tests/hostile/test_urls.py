"""Hostile webhook URLs against the SSRF guard, through the real dispatch path.

Every URL of the table aims at a receiver on loopback (its real port) in
some disguise. No private host is allowed, so nothing may arrive there, and
each dispatch ends dead with the guard's reason: at request time (dead before
the dispatch loop runs) when no DNS is needed, at connection time otherwise.

DNS is faked (``socket.getaddrinfo``): numeric hosts resolve as the system
resolves them (``inet_aton`` forms included), names under ``.test`` resolve
as each test says, every other name does not resolve. A "public" address
(``PUBLIC``) is routed by a patched ``socket.connect`` to a second receiver on
loopback, which plays the host at that address: a test can see where a
connection went without leaving the machine.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import Dispatch
from kumiflow_django.workers.dispatch import DispatchLoop
from tests.receiver import Receiver, Reply

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.216.34"
TLS = Path(__file__).parent / "tls"

Answer = list[str] | Callable[[], list[str]]


class FakeDNS:
    """``socket.getaddrinfo`` with a table of names; records the names asked."""

    def __init__(self) -> None:
        self.real = socket.getaddrinfo
        self.answers: dict[str, Answer] = {}
        self.asked: list[str] = []

    def __call__(self, host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002
        try:
            return self.real(host, port, family, type, proto, flags | socket.AI_NUMERICHOST)
        except socket.gaierror:
            pass
        # What the system resolver is asked: Python encodes names with IDNA 2003.
        name = host.encode("idna").decode("ascii").rstrip(".").lower()
        self.asked.append(name)
        answer = self.answers.get(name)
        if answer is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        addresses = answer() if callable(answer) else answer
        infos: list[tuple] = []
        for address in addresses:
            if ":" in address:
                infos.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                infos.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        return [i for i in infos if family in (0, i[0])]


@pytest.fixture
def dns(monkeypatch) -> FakeDNS:
    fake = FakeDNS()
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


@pytest.fixture
def routes(monkeypatch) -> dict[str, int]:
    """address -> port of a loopback receiver: connections to it go there."""
    table: dict[str, int] = {}
    real_connect = socket.socket.connect

    def connect(sock, address):
        if address[0] in table:
            address = ("127.0.0.1", table[address[0]])
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return table


@pytest.fixture(autouse=True)
def no_private_hosts(settings):
    settings.KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = []


@pytest.fixture(scope="module")
def module_receiver() -> Iterator[Receiver]:
    with Receiver() as the_receiver:
        yield the_receiver


@pytest.fixture
def receiver(module_receiver: Receiver) -> Receiver:
    """One receiver for the module (shutting one down takes half a second)."""
    module_receiver.seen.clear()
    return module_receiver


def send(url: str) -> Dispatch:
    define_workflow("hook", steps=[s.webhook_send(url, body={"n": 1}, timeout=(1, 1))])
    start_workflow("hook")
    return Dispatch.objects.get()


def deliver() -> None:
    DispatchLoop(batch_size=10).run_once()


BACKSLASH = "contains a backslash"
CONTROL = "contains whitespace or a control character"
CREDENTIALS = "must not carry a user name or password"
DIFFERENT = "reads differently to different URL parsers"
CLIENT = "is not a valid URL for the HTTP client"
PORT = "has an invalid port"
DOTTED = "is not an IPv4 address in dotted decimal"
LOOPBACK_NAME = "is a loopback name"
SCHEME = "only http and https webhooks are allowed"


def is_(address: str, why: str) -> str:
    return f"is the non-public address {address} ({why})"


def resolves(address: str, why: str) -> str:
    return f"resolves to the non-public address {address} ({why})"


# (url, the reason's text, when it is refused); PORT in the url is the receiver's port.
R, C = "request", "connection"
URLS = [
    # Parsers that disagree on the host.
    pytest.param(r"http://127.0.0.1:PORT\@8.8.8.8/a", BACKSLASH, R, id="backslash-userinfo"),
    pytest.param(r"http://8.8.8.8\@127.0.0.1:PORT/", BACKSLASH, R, id="backslash-reversed"),
    pytest.param(r"http:\\127.0.0.1:PORT\a", BACKSLASH, R, id="backslashes-for-slashes"),
    pytest.param("http://user@127.0.0.1:PORT/", CREDENTIALS, R, id="userinfo"),
    pytest.param("http://u:p@127.0.0.1:PORT/", CREDENTIALS, R, id="userinfo-password"),
    pytest.param("http://8.8.8.8@127.0.0.1:PORT/", CREDENTIALS, R, id="userinfo-an-address"),
    pytest.param("http://%31%32%37.0.0.1:PORT/", DIFFERENT, R, id="percent-encoded-host"),
    pytest.param("http://127%2E0.0.1:PORT/", DIFFERENT, R, id="percent-encoded-dot"),
    pytest.param(
        "http://127.0.0.1:PORT#@8.8.8.8/",
        is_("127.0.0.1", "127.0.0.0/8: loopback"),
        R,
        id="fragment-userinfo",
    ),
    pytest.param(
        "http://127.0.0.1:PORT?@8.8.8.8/",
        is_("127.0.0.1", "127.0.0.0/8: loopback"),
        R,
        id="query-userinfo",
    ),
    # Ports.
    pytest.param("http://127.0.0.1:0/", PORT, R, id="port-0"),  # requests drops it: port 80
    pytest.param("http://127.0.0.1:65536/", PORT, R, id="port-too-large"),
    pytest.param("http://127.0.0.1:+PORT/", PORT, R, id="port-signed"),
    pytest.param("http://127.0.0.1:PORT:80/", PORT, R, id="port-twice"),
    # Whitespace and control characters (urlsplit drops some of them).
    pytest.param(" http://127.0.0.1:PORT/", CONTROL, R, id="leading-space"),
    pytest.param("http://8.8.8.8\t@127.0.0.1:PORT/", CONTROL, R, id="tab-in-authority"),
    pytest.param("http://127.0.0.\n1:PORT/", CONTROL, R, id="newline-in-host"),
    # (Not NUL: PostgreSQL cannot store it in the request's JSON at all.)
    pytest.param("http://127.0.0.1:PORT\x01@8.8.8.8/", CONTROL, R, id="control-character"),
    pytest.param("http://127.0.0.1\x7f:PORT/", CONTROL, R, id="del"),
    pytest.param("http://127.0.0.1\u200b:PORT/", CONTROL, R, id="zero-width-space"),
    pytest.param("http://127.0.0.1:PORT/\u00a0", CONTROL, R, id="no-break-space"),
    # IPv4 spellings that inet_aton() reads as 127.0.0.1 (or 0.0.0.0).
    pytest.param("http://2130706433:PORT/", DOTTED, R, id="ipv4-decimal"),
    pytest.param("http://0177.0.0.1:PORT/", DOTTED, R, id="ipv4-octal"),
    pytest.param("http://0x7f.1:PORT/", DOTTED, R, id="ipv4-hex-short"),
    pytest.param("http://0x7F000001:PORT/", DOTTED, R, id="ipv4-hex"),
    pytest.param("http://127.1:PORT/", DOTTED, R, id="ipv4-short"),
    pytest.param("http://127.000.000.001:PORT/", DOTTED, R, id="ipv4-leading-zeros"),
    pytest.param("http://0:PORT/", DOTTED, R, id="ipv4-zero"),
    pytest.param(
        "http://0.0.0.0:PORT/", is_("0.0.0.0", "0.0.0.0/8: this network"), R, id="ipv4-unspecified"
    ),
    pytest.param(
        "http://127.0.0.1.:PORT/", is_("127.0.0.1", "127.0.0.0/8: loopback"), R, id="trailing-dot"
    ),
    pytest.param(
        "http://127.9.9.9:PORT/", is_("127.9.9.9", "127.0.0.0/8: loopback"), R, id="loopback-not-1"
    ),
    # Names of the loopback interface.
    pytest.param("http://localhost:PORT/", LOOPBACK_NAME, R, id="localhost"),
    pytest.param("http://LocalHost:PORT/", LOOPBACK_NAME, R, id="localhost-case"),
    pytest.param("http://localhost.:PORT/", LOOPBACK_NAME, R, id="localhost-trailing-dot"),
    pytest.param("http://hooks.localhost:PORT/", LOOPBACK_NAME, R, id="sub-localhost"),
    # Unicode: only what the client's IDNA reads as a valid name.
    pytest.param("http://１２７.０.０.１:PORT/", CLIENT, R, id="fullwidth-digits"),
    pytest.param("http://127。0。0。1:PORT/", CLIENT, R, id="ideographic-dots"),
    pytest.param("http://ｌｏｃａｌｈｏｓｔ:PORT/", CLIENT, R, id="fullwidth-localhost"),
    pytest.param("http://ⓛocalhost:PORT/", CLIENT, R, id="circled-localhost"),
    # IPv6 literals, and the forms that embed an IPv4 address.
    pytest.param("http://[::1]:PORT/", is_("::1", "::1/128: loopback"), R, id="ipv6-loopback"),
    pytest.param("http://[::]:PORT/", is_("::", "::/128: unspecified"), R, id="ipv6-unspecified"),
    pytest.param("http://[::ffff:127.0.0.1]:PORT/", "IPv4-mapped", R, id="ipv4-mapped"),
    pytest.param("http://[::ffff:7f00:1]:PORT/", "IPv4-mapped", R, id="ipv4-mapped-hex"),
    pytest.param("http://[::ffff:0:127.0.0.1]:PORT/", "IPv4-translated", R, id="ipv4-translated"),
    pytest.param("http://[::127.0.0.1]:PORT/", "IPv4-compatible", R, id="ipv4-compatible"),
    pytest.param("http://[64:ff9b::127.0.0.1]:PORT/", "NAT64 of 127.0.0.1", R, id="nat64"),
    pytest.param("http://[64:ff9b:1::7f00:1]:PORT/", "local-use NAT64", R, id="nat64-local-use"),
    pytest.param("http://[2002:7f00:1::1]:PORT/", "6to4", R, id="6to4"),
    pytest.param("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]:PORT/", "Teredo", R, id="teredo"),
    pytest.param("http://[fe80::1%25lo]:PORT/", CLIENT, R, id="ipv6-zone-id"),
    pytest.param("http://[fc00::1]:PORT/", "unique local", R, id="ipv6-unique-local"),
    pytest.param("http://[fec0::1]:PORT/", "site-local", R, id="ipv6-site-local"),
    pytest.param("http://[ff02::1]:PORT/", "multicast", R, id="ipv6-multicast"),
    # Other non-public IPv4 ranges (is_global misses some of them).
    pytest.param("http://169.254.169.254/latest/meta-data/", "link-local", R, id="metadata"),
    pytest.param("http://10.0.0.1:PORT/", "10.0.0.0/8: private", R, id="private-10"),
    pytest.param("http://100.64.0.1:PORT/", "shared address space", R, id="cgnat"),
    pytest.param("http://224.0.0.1:PORT/", "multicast", R, id="multicast"),
    pytest.param("http://192.0.0.8:PORT/", "IETF protocol assignments", R, id="ietf-192-0-0"),
    pytest.param("http://192.88.99.1:PORT/", "6to4 relay anycast", R, id="6to4-relay"),
    pytest.param("http://255.255.255.255:PORT/", "reserved", R, id="broadcast"),
    # Other schemes, no scheme.
    pytest.param("ftp://127.0.0.1:PORT/", SCHEME, R, id="ftp"),
    pytest.param("file:///etc/passwd", SCHEME, R, id="file"),
    pytest.param("gopher://127.0.0.1:PORT/_POST", SCHEME, R, id="gopher"),
    pytest.param("//127.0.0.1:PORT/", SCHEME, R, id="no-scheme"),
    # Names whose addresses are not public: refused when connecting.
    pytest.param(
        "http://loopback.test:PORT/",
        resolves("127.0.0.1", "127.0.0.0/8: loopback"),
        C,
        id="name-loopback",
    ),
    pytest.param(
        "http://mixed.test:PORT/",
        resolves("127.0.0.1", "127.0.0.0/8: loopback"),
        C,
        id="name-public-and-loopback",
    ),
    pytest.param(
        "http://zero.test:PORT/", resolves("0.0.0.0", "0.0.0.0/8: this network"), C, id="name-zero"
    ),
    pytest.param("http://mapped.test:PORT/", "IPv4-mapped", C, id="name-ipv4-mapped"),
    pytest.param("http://nat64.test:PORT/", "NAT64 of 127.0.0.1", C, id="name-nat64"),
    pytest.param("http://metadata.test/", "link-local", C, id="name-metadata"),
    pytest.param("http://multicast.test:PORT/", "multicast", C, id="name-multicast"),
    # IDNA 2003 (the system resolver) reads faß as fass, IDNA 2008 (requests) as
    # xn--fa-hia: the name checked must be the one connected to.
    pytest.param(
        "http://faß.test:PORT/",
        resolves("127.0.0.1", "127.0.0.0/8: loopback"),
        C,
        id="name-idna-2003-vs-2008",
    ),
]

NAMES = {
    "loopback.test": ["127.0.0.1"],
    "mixed.test": [PUBLIC, "127.0.0.1"],
    "zero.test": ["0.0.0.0"],
    "mapped.test": ["::ffff:127.0.0.1"],
    "nat64.test": ["64:ff9b::7f00:1"],
    "metadata.test": ["169.254.169.254"],
    "multicast.test": ["224.0.0.1"],
    "fass.test": [PUBLIC],
    "xn--fa-hia.test": ["127.0.0.1"],
}


@pytest.mark.parametrize(("url", "reason", "when"), URLS)
def test_a_hostile_url_never_reaches_the_receiver(
    url, reason, when, receiver, dns, routes, registry, clock
):
    dns.answers.update(NAMES)
    routes[PUBLIC] = receiver.port  # were the guard to connect to PUBLIC, it would be seen
    dispatch = send(url.replace("PORT", str(receiver.port)))
    deliver()

    assert receiver.seen == []
    dispatch.refresh_from_db()
    assert dispatch.status == "dead"
    assert reason in dispatch.last_error
    # Refused at request time: dead before any attempt; else at the first one.
    assert dispatch.attempts == (0 if when == R else 1)


def test_a_name_that_does_not_resolve_is_retried_not_dead(receiver, dns, registry, clock):
    dispatch = send(f"http://nowhere.test:{receiver.port}/")
    deliver()
    dispatch.refresh_from_db()
    assert (dispatch.status, dispatch.attempts) == ("failed", 1)
    assert "Failed to resolve 'nowhere.test'" in dispatch.last_error
    assert receiver.seen == []


def test_the_table_is_long_enough():
    assert len(URLS) >= 40


# -- DNS rebinding and pinning --------------------------------------------------------


def public_then_loopback() -> Callable[[], list[str]]:
    """A rebinding name server: a public answer first, loopback ever after."""
    answers = iter([[PUBLIC]])
    return lambda: next(answers, ["127.0.0.1"])


def test_a_name_that_rebinds_to_loopback_after_the_check_never_reaches_loopback(
    dns, routes, registry, clock
):
    with Receiver() as public, Receiver() as victim:
        dns.answers["rebind.test"] = public_then_loopback()
        routes[PUBLIC] = public.port
        dispatch = send(f"http://rebind.test:{victim.port}/in")
        deliver()

    assert victim.seen == []
    assert dns.asked == ["rebind.test"], "one lookup: the checked answer is the one used"
    [request] = public.seen
    assert request.headers["Host"] == f"rebind.test:{victim.port}"
    dispatch.refresh_from_db()
    assert dispatch.status == "delivered"


def test_a_name_that_turns_private_between_attempts_is_refused_on_the_next(
    dns, routes, registry, clock
):
    with Receiver(Reply(503)) as public, Receiver() as victim:
        dns.answers["rebind.test"] = public_then_loopback()
        routes[PUBLIC] = public.port
        dispatch = send(f"http://rebind.test:{victim.port}/in")
        deliver()
        clock.advance(hours=1)
        deliver()

    assert victim.seen == []
    assert len(public.seen) == 1
    dispatch.refresh_from_db()
    assert (dispatch.status, dispatch.attempts) == ("dead", 2)
    assert resolves("127.0.0.1", "127.0.0.0/8: loopback") in dispatch.last_error


class TLSReceiver(Receiver):
    """The receiver behind TLS with the certificate of ``hooks.test``; records SNI."""

    def __init__(self) -> None:
        super().__init__()
        self.server_names: list[str | None] = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(TLS / "hooks.test.pem")
        context.sni_callback = lambda sock, name, ctx: self.server_names.append(name)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)


@pytest.fixture
def trust_test_ca(monkeypatch):
    from kumiflow_django.outbox.webhook import session

    monkeypatch.setattr(session(), "verify", str(TLS / "ca.pem"))


def test_https_connects_to_the_checked_address_with_the_name_in_sni_host_and_certificate(
    dns, routes, trust_test_ca, registry, clock
):
    with TLSReceiver() as server:
        dns.answers["hooks.test"] = [PUBLIC]
        routes[PUBLIC] = server.port
        dispatch = send(f"https://hooks.test:{server.port}/in")
        deliver()

    dispatch.refresh_from_db()
    assert dispatch.status == "delivered", dispatch.last_error
    assert server.server_names == ["hooks.test"]
    [request] = server.seen
    assert request.headers["Host"] == f"hooks.test:{server.port}"


def test_https_verifies_the_certificate_against_the_name_not_the_address(
    dns, routes, trust_test_ca, registry, clock
):
    with TLSReceiver() as server:
        dns.answers["other.test"] = [PUBLIC]
        routes[PUBLIC] = server.port
        dispatch = send(f"https://other.test:{server.port}/in")
        deliver()

    dispatch.refresh_from_db()
    assert dispatch.status == "failed"
    assert "CERTIFICATE_VERIFY_FAILED" in dispatch.last_error
    assert server.seen == []


def test_proxies_and_netrc_of_the_environment_are_ignored(
    dns, routes, monkeypatch, tmp_path, registry, clock
):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine hooks.test login ada password s3cret\n")
    netrc.chmod(0o600)
    with Receiver() as proxy, Receiver() as server:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NETRC", str(netrc))
        dns.answers["hooks.test"] = [PUBLIC]
        routes[PUBLIC] = server.port
        dispatch = send(f"http://hooks.test:{server.port}/in")
        deliver()

    assert proxy.seen == []
    [request] = server.seen
    assert "Authorization" not in request.headers
    dispatch.refresh_from_db()
    assert dispatch.status == "delivered"


# -- the allow-list -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "url_host"),
    [
        pytest.param("hooks.test", "HOOKS.test.", id="case-and-trailing-dot"),
        pytest.param("Hooks.Test.", "hooks.test", id="entry-case-and-trailing-dot"),
        pytest.param("bücher.test", "BÜCHER.test", id="unicode-as-idna"),
        pytest.param("xn--bcher-kva.test", "bücher.test", id="punycode-entry"),
        pytest.param("hooks.localhost", "hooks.localhost", id="a-localhost-name"),
    ],
)
def test_an_allowed_name_matches_the_name_as_the_client_reads_it(
    entry, url_host, receiver, dns, settings, registry, clock
):
    settings.KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = [entry]
    for name in ("hooks.test", "xn--bcher-kva.test", "hooks.localhost"):
        dns.answers[name] = ["127.0.0.1"]
    dispatch = send(f"http://{url_host}:{receiver.port}/in")
    deliver()
    dispatch.refresh_from_db()
    assert dispatch.status == "delivered", dispatch.last_error
    assert len(receiver.seen) == 1


def test_an_allowed_name_allows_no_other_name(receiver, dns, settings, registry, clock):
    settings.KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = ["hooks.test"]
    dns.answers["other.test"] = ["127.0.0.1"]
    dispatch = send(f"http://other.test:{receiver.port}/in")
    deliver()
    dispatch.refresh_from_db()
    assert dispatch.status == "dead"
    assert receiver.seen == []


@pytest.mark.parametrize("entry", ["127.0.0.0/8", "127.0.0.1", "::ffff:127.0.0.0/104"])
def test_an_allowed_network_allows_its_addresses(entry, receiver, dns, settings, registry, clock):
    settings.KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = [entry]
    host = "[::ffff:127.0.0.1]" if ":" in entry else "127.0.0.1"
    dispatch = send(f"http://{host}:{receiver.port}/in")
    deliver()
    dispatch.refresh_from_db()
    assert dispatch.status == "delivered", dispatch.last_error
    assert len(receiver.seen) == 1
