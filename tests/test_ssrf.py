"""The SSRF rules as units: which addresses are public, which URLs pass the
request-time check (without DNS), and that the transport never uses a proxy.
The hostile URLs themselves are in tests/hostile/test_urls.py."""

from __future__ import annotations

import ipaddress
import socket

import pytest
import requests

from kumiflow_django.outbox.ssrf import GuardedAdapter, Refused, address_problem, url_problem
from tests.hostile.test_urls import URLS


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("0.0.0.0", "this network"),
        ("10.1.2.3", "private"),
        ("100.64.0.1", "shared address space"),
        ("127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("172.31.255.255", "private"),
        ("192.0.0.8", "IETF protocol assignments"),
        ("192.0.0.9", "IETF protocol assignments"),
        ("192.0.2.1", "documentation"),
        ("192.88.99.1", "6to4 relay anycast"),
        ("192.168.1.1", "private"),
        ("198.18.0.1", "benchmarking"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("::ffff:127.0.0.1", "IPv4-mapped"),
        ("::ffff:8.8.8.8", "IPv4-mapped"),  # embeds a public address: refused all the same
        ("::ffff:0:7f00:1", "IPv4-translated"),
        ("::7f00:1", "IPv4-compatible"),
        ("64:ff9b::7f00:1", "NAT64 of 127.0.0.1, 127.0.0.0/8: loopback"),
        ("64:ff9b::a9fe:a9fe", "NAT64 of 169.254.169.254"),
        ("64:ff9b:1::808:808", "local-use NAT64"),
        ("100::1", "discard-only"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo"),
        ("2001:2::1", "IETF protocol assignments"),
        ("2001:db8::1", "documentation"),
        ("2002:808:808::1", "6to4"),
        ("3fff::1", "documentation"),
        ("5f00::1", "segment routing"),
        ("fd12:3456::1", "unique local"),
        ("fe80::1", "link-local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("ff0e::1", "multicast"),
        ("4000::1", "outside global unicast 2000::/3"),
    ],
)
def test_a_non_public_address_is_refused_and_says_why(address, why):
    problem = address_problem(ipaddress.ip_address(address))
    assert problem is not None and why in problem


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700::1111", "64:ff9b::808:808"]
)
def test_a_public_address_passes(address):
    assert address_problem(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/in?x=1&y=%2F#frag",
        "HTTPS://Hooks.Example.COM./in",
        "http://hooks.example.com:8080/a/b",
        "http://bücher.example/grüße",
        "http://xn--bcher-kva.example/",
        "http://_acme.example.com/",
        "https://8.8.8.8/x",
        "http://[2606:4700::1111]:8443/",
        "http://[64:ff9b::8.8.8.8]/",
    ],
)
def test_an_ordinary_url_passes_the_request_time_check(url):
    assert url_problem(url) is None


def test_the_request_time_check_never_resolves_a_name(monkeypatch):
    def no_dns(*args, **kwargs):
        raise AssertionError("check() looked a name up")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    for param in URLS:
        url_problem(str(param.values[0]).replace("PORT", "8080"))
    assert url_problem("https://hooks.example.com/") is None


def test_the_transport_refuses_any_proxy():
    with requests.Session() as session:
        session.mount("http://", GuardedAdapter())
        with pytest.raises(Refused, match="never sent through a proxy"):
            session.get("http://hooks.example.com/", proxies={"http": "http://127.0.0.1:3128"})
