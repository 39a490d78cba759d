"""W14: the HTTP API side by side with a plain Django JSON view on the same server.

One uvicorn process serves the testproject with the benchmark's URLs
(:mod:`bench.urls`: the API and the floor views). A fixed number of client
threads, each with its own keep-alive ``requests.Session``, drive one
endpoint at a time for a fixed time; the endpoints and the floor take turns,
several rounds, so that the machine's load falls on all of them alike. Per
endpoint: requests/s, p50/p99 latency, the server's CPU per request, and the
ratio of each to the floor's (``BENCH_W14_CLIENTS``, ``BENCH_W14_SECONDS``,
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


def _serve(url: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "bench.settings"}
    command = [sys.executable, "-m", "uvicorn", "testproject.asgi:application"]
    options = ["--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
    return subprocess.Popen(
        [*command, *options, "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


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
    port = _free_port()
    server = _serve(url, port)
    base = f"http://127.0.0.1:{port}"
    try:
        import requests

        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(base + "/bench/floor/", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("uvicorn did not come up")
            time.sleep(0.1)
        for request, expect in endpoints.values():  # warm-up: imports, connections
            _drive(base, secret, request, expect, clients, 0.5)
        measured: dict[str, dict[str, list[float]]] = {
            name: {"latencies": [], "rate": [], "cpu_ms": [], "wrong": []} for name in endpoints
        }
        for _ in range(rounds):
            for name, (request, expect) in endpoints.items():
                cpu = cpu_seconds(server.pid)
                began = time.perf_counter()
                latencies, wrong = _drive(base, secret, request, expect, clients, seconds)
                elapsed = time.perf_counter() - began
                cpu = cpu_seconds(server.pid) - cpu
                m = measured[name]
                m["latencies"] += latencies
                m["rate"].append(len(latencies) / elapsed)
                m["cpu_ms"].append(cpu / max(len(latencies), 1) * 1000)
                m["wrong"].append(wrong)
    finally:
        server.terminate()
        server.wait(timeout=30)
    result: dict[str, Any] = {"clients": clients, "seconds_per_phase": seconds, "rounds": rounds}
    floor = measured["floor"]
    floor_rate, floor_cpu = median(floor["rate"]), median(floor["cpu_ms"])
    floor_p50 = percentile(floor["latencies"], 50) or 0
    for name, m in measured.items():
        rate, cpu = median(m["rate"]), median(m["cpu_ms"])
        p50 = percentile(m["latencies"], 50) or 0
        result[f"{name}_per_s"] = round(rate, 1)
        result[f"{name}_p50_ms"] = round(p50, 2)
        result[f"{name}_p99_ms"] = round(percentile(m["latencies"], 99) or 0, 2)
        result[f"{name}_server_cpu_ms"] = round(cpu, 3)
        result[f"{name}_wrong_answers"] = int(sum(m["wrong"]))
        if name != "floor":
            result[f"{name}_floor_ratio"] = round(floor_rate / max(rate, 1e-9), 2)
            result[f"{name}_p50_floor_ratio"] = round(p50 / max(floor_p50, 1e-9), 2)
            result[f"{name}_cpu_floor_ratio"] = round(cpu / max(floor_cpu, 1e-9), 2)
    return result


WORKLOADS = {"W14": w14}
