"""W14: the HTTP API side by side with a plain Django JSON view on the same server.

Two uvicorn processes serve the testproject with the benchmark's URLs
(:mod:`bench.urls`: the API and the floor views): one as ASGI, where each
request runs in a thread of its own and opens and closes its own database
connection whatever ``CONN_MAX_AGE`` says, and one as WSGI
(:mod:`bench.wsgi`, uvicorn's pool of 10 threads) with ``CONN_MAX_AGE``,
each thread keeping its connection, as deployments behind a WSGI server do.
A fixed number of client threads, each with its own keep-alive
``requests.Session``, drive one endpoint of one server at a time for a fixed
time; the endpoints, the floor and the two servers take turns, several
rounds, so that the machine's load falls on all of them alike. Per endpoint
and server: requests/s, p50/p99 latency, the server's CPU per request, and
the ratio of each to that server's floor (the WSGI server's figures are
named ``kept_<endpoint>_...``; ``BENCH_W14_CLIENTS``, ``BENCH_W14_SECONDS``,
``BENCH_W14_ROUNDS`` change the size).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from bench.common import ROOT, cpu_seconds, database_url, median, percentile, setup_django

#: What each endpoint sends: (method, path, body) of a client's i-th request.
Request = Callable[[int, int], tuple[str, str, dict[str, Any] | None]]


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: How long the WSGI server's threads keep their database connections.
KEPT_SECONDS = 600

#: The two servers W14 compares: (prefix of its figures, how it is described,
#: its uvicorn arguments, its environment).
SERVERS: tuple[tuple[str, str, tuple[str, ...], dict[str, str]], ...] = (
    ("", "uvicorn ASGI", ("testproject.asgi:application",), {}),
    (
        "kept_",
        f"uvicorn WSGI, CONN_MAX_AGE={KEPT_SECONDS}",
        ("--interface", "wsgi", "bench.wsgi:application"),
        {"BENCH_CONN_MAX_AGE": str(KEPT_SECONDS)},
    ),
)


def _serve(
    url: str, port: int, arguments: tuple[str, ...], extra: dict[str, str]
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "PYTHONWARNINGS": "ignore::DeprecationWarning",  # uvicorn's WSGI interface
        **extra,
    }
    options = ["--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", *arguments, *options, "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_until_up(base: str, server: subprocess.Popen[bytes]) -> None:
    import requests

    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(base + "/bench/floor/", timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            raise RuntimeError("uvicorn did not come up")
        time.sleep(0.1)


def _drive(
    base: str, token: str, request: Request, expect: int, clients: int, seconds: float
) -> tuple[list[float], int]:
    """``clients`` threads sending ``request`` for ``seconds``: the latencies in
    ms and the number of answers that were not ``expect``."""
    import requests

    latencies: list[list[float]] = [[] for _ in range(clients)]
    wrong = [0] * clients
    ready = threading.Barrier(clients + 1)
    deadline: list[float] = []

    def client(n: int) -> None:
        with requests.Session() as session:
            session.headers["Authorization"] = f"Bearer {token}"
            ready.wait()
            i = 0
            while time.perf_counter() < deadline[0]:
                method, path, body = request(n, i)
                began = time.perf_counter()
                answer = session.request(method, base + path, json=body, timeout=60)
                latencies[n].append((time.perf_counter() - began) * 1000)
                if answer.status_code != expect:
                    wrong[n] += 1
                i += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    deadline.append(time.perf_counter() + seconds)
    ready.wait()
    for thread in threads:
        thread.join()
    return [ms for per in latencies for ms in per], sum(wrong)


def w14(db: str) -> dict[str, Any]:
    """The API's start, read, list and append against the floor views."""
    url = database_url(db, "kumiflow_bench_w14")
    setup_django(url)
    from django.db import connections

    from kumiflow_django import start_workflow
    from kumiflow_django.http.tokens import API_PERMISSIONS, create_token

    _token, secret = create_token("w14", permissions=API_PERMISSIONS)
    runs = [str(start_workflow("bench-w1", payload={"n": i}).id) for i in range(100)]
    connections.close_all()

    clients = _env_int("BENCH_W14_CLIENTS", 16)
    seconds = float(_env_int("BENCH_W14_SECONDS", 4))
    rounds = _env_int("BENCH_W14_ROUNDS", 2)
    api = "/api/kumiflow"
    endpoints: dict[str, tuple[Request, int]] = {
        "floor": (lambda n, i: ("GET", "/bench/floor/", None), 200),
        "floor_db": (lambda n, i: ("GET", f"/bench/floor-db/{runs[i % 100]}/", None), 200),
        "start": (
            lambda n, i: ("POST", f"{api}/runs/", {"workflow": "bench-w1", "payload": {"n": i}}),
            201,
        ),
        "read": (lambda n, i: ("GET", f"{api}/runs/{runs[i % 100]}/", None), 200),
        "list": (lambda n, i: ("GET", f"{api}/runs/", None), 200),
        "append": (
            lambda n, i: (
                "POST",
                f"{api}/events/",
                {"stream_id": f"w14-{n}-{i}", "type": "bench.w14.note", "payload": {"n": i}},
            ),
            201,
        ),
    }
    servers = []
    try:
        for prefix, _described, arguments, extra in SERVERS:
            port = _free_port()
            servers.append(
                (prefix, f"http://127.0.0.1:{port}", _serve(url, port, arguments, extra))
            )
        for _prefix, base, server in servers:
            _wait_until_up(base, server)
            for request, expect in endpoints.values():  # warm-up: imports, connections
                _drive(base, secret, request, expect, clients, 0.5)
        measured: dict[str, dict[str, list[float]]] = {
            prefix + name: {"latencies": [], "rate": [], "cpu_ms": [], "wrong": []}
            for prefix, _base, _server in servers
            for name in endpoints
        }
        for _ in range(rounds):
            for name, (request, expect) in endpoints.items():
                for prefix, base, server in servers:
                    cpu = cpu_seconds(server.pid)
                    began = time.perf_counter()
                    latencies, wrong = _drive(base, secret, request, expect, clients, seconds)
                    elapsed = time.perf_counter() - began
                    cpu = cpu_seconds(server.pid) - cpu
                    m = measured[prefix + name]
                    m["latencies"] += latencies
                    m["rate"].append(len(latencies) / elapsed)
                    m["cpu_ms"].append(cpu / max(len(latencies), 1) * 1000)
                    m["wrong"].append(wrong)
    finally:
        for _prefix, _base, server in servers:
            server.terminate()
            server.wait(timeout=30)
    result: dict[str, Any] = {"clients": clients, "seconds_per_phase": seconds, "rounds": rounds}
    for prefix, described, _arguments, _extra in SERVERS:
        result[f"{prefix}server"] = described
        result.update(_figures(measured, prefix, endpoints))
    return result


def _figures(
    measured: dict[str, dict[str, list[float]]], prefix: str, endpoints: dict[str, Any]
) -> dict[str, Any]:
    """One server's figures, each endpoint's against that server's floor."""
    result: dict[str, Any] = {}
    floor = measured[prefix + "floor"]
    floor_rate, floor_cpu = median(floor["rate"]), median(floor["cpu_ms"])
    floor_p50 = percentile(floor["latencies"], 50) or 0
    for name in endpoints:
        m, key = measured[prefix + name], prefix + name
        rate, cpu = median(m["rate"]), median(m["cpu_ms"])
        p50 = percentile(m["latencies"], 50) or 0
        result[f"{key}_per_s"] = round(rate, 1)
        result[f"{key}_p50_ms"] = round(p50, 2)
        result[f"{key}_p99_ms"] = round(percentile(m["latencies"], 99) or 0, 2)
        result[f"{key}_server_cpu_ms"] = round(cpu, 3)
        result[f"{key}_wrong_answers"] = int(sum(m["wrong"]))
        if name != "floor":
            result[f"{key}_floor_ratio"] = round(floor_rate / max(rate, 1e-9), 2)
            result[f"{key}_p50_floor_ratio"] = round(p50 / max(floor_p50, 1e-9), 2)
            result[f"{key}_cpu_floor_ratio"] = round(cpu / max(floor_cpu, 1e-9), 2)
    return result


WORKLOADS = {"W14": w14}
