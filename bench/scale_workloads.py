"""W9-W11 on kumiflow-django: more processes, years of history, retention under load.

Sizes come from the environment (``bench/run.py --w9-runs`` and so on set it):

- ``BENCH_W9_RUNS`` (2,000), ``BENCH_W9_PROCESSES`` ("1,2,4");
- ``BENCH_W10_RUNS`` (1,000,000 finished runs, five events each);
- ``BENCH_W11_RUNS`` (1,000,000), ``BENCH_W11_BASELINE_S`` (30),
  ``BENCH_W11_RETENTION_ARGS`` (more options of ``kumiflow_retention``: none).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    clear_peak_rss,
    cpu_seconds,
    database_pids,
    database_url,
    machine_cpu,
    median,
    percentile,
    proc_status,
    setup_django,
)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def _manage(
    url: str, *args: str, log: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        **(env or {}),
    }
    out = log.open("wb") if log else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def _wait(condition: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return False


def _load_history(url: str, runs: int, **days: float) -> dict[str, Any]:
    """Bulk-load finished runs in a process of its own (bench/history.py)."""
    extra = [arg for k, v in days.items() for arg in (f"--{k.replace('_', '-')}", str(v))]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.history", url, str(runs), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    import json

    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# -- W9 ---------------------------------------------------------------------


def _drain(url: str, name: str, processes: int, n: int) -> dict[str, Any]:
    """``n`` runs of three segments, committed at once, drained by ``processes`` workers."""
    from django.core.management import call_command
    from django.db import connection, connections, transaction

    from kumiflow_django import start_workflow
    from kumiflow_django.models import Event, WorkflowRun
    from testproject.shop.models import Tally

    call_command("flush", interactive=False, verbosity=0)  # empty tables for each round
    vendor = connection.vendor
    logs = [
        Path(tempfile.mkstemp(prefix=f"w9-{processes}-", suffix=".log")[1])
        for _ in range(processes)
    ]
    # BENCH_W9_PROFILE=dir: a cProfile of each worker process (bench/instrument.py).
    profiles = os.environ.get("BENCH_W9_PROFILE")
    workers = [
        _manage(
            url,
            "kumiflow_worker",
            "--max-interval",
            "1",
            "-v",
            "1",
            log=log,
            env={"BENCH_PROCESS_PROFILE": f"{profiles}/w9-{processes}p-{i}.prof"}
            if profiles
            else None,
        )
        for i, log in enumerate(logs)
    ]
    ready = "listening for notifications" if vendor == "postgresql" else "resume loop started"
    try:
        up = _wait(lambda: all(ready in log.read_text() for log in logs), 60)
        assert up, "the workers did not start: " + logs[0].read_text()[-1000:]
        server = database_pids(vendor, name)
        idle = machine_cpu()
        time.sleep(1.0)  # what the rest of the machine uses meanwhile (a shared machine)
        background = _busy(idle, machine_cpu())
        cpu_before = {
            "workers": sum(cpu_seconds(w.pid) for w in workers),
            "database": sum(_cpu_or_zero(pid) for pid in server),
            "machine": machine_cpu(),
        }
        with transaction.atomic():
            for _ in range(n):
                start_workflow("bench-w9")
            began = time.perf_counter()
        done = WorkflowRun.objects.filter(status="completed")
        drained = _wait(lambda: done.count() == n, 600, poll=0.1)
        seconds = time.perf_counter() - began
        server = sorted(set(server) | set(database_pids(vendor, name)))
        busy, total = machine_cpu()
        worker_cpu = sum(cpu_seconds(w.pid) for w in workers) - cpu_before["workers"]
        db_cpu = sum(_cpu_or_zero(pid) for pid in server) - cpu_before["database"]
        rss = max(proc_status(w.pid)["VmHWM"] for w in workers)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(60)
        for log in logs:
            log.unlink(missing_ok=True)
    counts = list(Tally.objects.values_list("count", flat=True))
    segments = Event.objects.filter(type="kumiflow.workflow.step.resumed").count()
    connections.close_all()
    return {
        "runs_per_s": round(n / seconds, 1),
        "drain_s": round(seconds, 2),
        "completed": drained,
        # Every segment exactly once: three counted side effects per run, each
        # counted once, and three segments per run (a deferred run's first
        # segment is a resume too).
        "exactly_once": len(counts) == 3 * n and set(counts) == {1} and segments == 3 * n,
        "worker_cpu_s": round(worker_cpu, 1),
        # What the comparison across process counts is made of: the machine
        # is shared, so CPU time per run, not wall time.
        "worker_cpu_ms_per_run": round(worker_cpu * 1000 / n, 2),
        "database_cpu_s": round(db_cpu, 1),
        # Share of all CPUs busy during the drain, and in the second before it
        # (other work on the machine; the workers and the database were idle).
        "machine_busy": round(_busy(cpu_before["machine"], (busy, total)), 2),
        "machine_busy_before": round(background, 2),
        "worker_peak_rss_mb": round(rss, 1),
    }


def _busy(before: tuple[float, float], after: tuple[float, float]) -> float:
    return (after[0] - before[0]) / max(after[1] - before[1], 1e-9)


def _cpu_or_zero(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:  # a backend that ended meanwhile: its time is lost (a few ms)
        return 0.0


def w9(db: str) -> dict[str, Any]:
    """2,000 runs of three segments drained by 1, 2 and 4 worker processes."""
    n = _env_int("BENCH_W9_RUNS", 2000)
    counts = [int(x) for x in (os.environ.get("BENCH_W9_PROCESSES") or "1,2,4").split(",")]
    result: dict[str, Any] = {"runs": n, "cpus": os.cpu_count()}
    name = "kumiflow_bench_w9"
    url = database_url(db, name)
    setup_django(url)
    for processes in counts:
        for key, value in _drain(url, name, processes, n).items():
            result[f"{key}_{processes}p"] = value
    one = result.get("runs_per_s_1p")
    if one:
        for processes in counts[1:]:
            result[f"speedup_{processes}p"] = round(result[f"runs_per_s_{processes}p"] / one, 2)
    result["exactly_once"] = all(result[f"exactly_once_{p}p"] for p in counts)
    result["worker_peak_rss_mb"] = max(result[f"worker_peak_rss_mb_{p}p"] for p in counts)
    return result


# -- W10 --------------------------------------------------------------------

#: Admin pages W10 renders: (name, path after login). Another workload (the
#: console's) may add its own pages here.
ADMIN_PAGES: list[tuple[str, Callable[[], str]]] = []


def _default_pages() -> list[tuple[str, Callable[[], str]]]:
    from django.urls import reverse

    from kumiflow_django.models import WorkflowRun

    def run_page() -> str:
        # A run of the history (five events) once it is loaded; a W1 run before.
        run = (
            WorkflowRun.objects.filter(workflow="bench-w10").order_by("-started_at").first()
            or WorkflowRun.objects.order_by("-started_at").first()
        )
        assert run is not None
        return reverse("admin:kumiflow_workflowrun_change", args=[run.pk])

    runs = reverse("admin:kumiflow_workflowrun_changelist")
    return [
        ("run_list", lambda: runs),
        ("run_page", run_page),
        # Search attributes (bench/history.py): a customer has 1,000 runs of a
        # million, a tier a quarter of them; newest first, a page of 50.
        ("run_list_by_attribute", lambda: f"{runs}?attr=customer:C-17"),
        ("run_list_by_common_attribute", lambda: f"{runs}?attr=tier:gold"),
    ]


def _render_ms(repeat: int = 10) -> dict[str, float]:
    """Median server time of each admin page, rendered in this process (Django's
    test client: no network, the whole request and response cycle)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    out = {}
    for name, path in _default_pages() + ADMIN_PAGES:
        url = path()
        assert client.get(url).status_code == 200, url
        samples = []
        for _ in range(repeat):
            begin = time.perf_counter()
            response = client.get(url)
            samples.append((time.perf_counter() - begin) * 1000)
            assert response.status_code == 200
        out[name] = round(median(samples), 1)
    return out


def _w1_rate(label: str, n: int = 1000) -> float:
    from django.db import transaction

    from kumiflow_django import append_event

    for i in range(50):
        with transaction.atomic():
            append_event(f"{label}-warm-{i}", "bench.w1", {"n": i})
    start = time.perf_counter()
    for i in range(n):
        with transaction.atomic():
            append_event(f"{label}-{i}", "bench.w1", {"n": i})
    return n / (time.perf_counter() - start)


def _poll_ms(repeat: int = 1000) -> float:
    from kumiflow_django.workers.resume import due_runs

    now = datetime.now(UTC)
    for _ in range(100):
        due_runs(now, 100)
    samples = []
    for _ in range(repeat):
        begin = time.perf_counter()
        due_runs(now, 100)
        samples.append((time.perf_counter() - begin) * 1000)
    return median(samples)


def _server_side() -> dict[str, float] | None:
    """PostgreSQL's own time and buffers for the poll: the server's part of it,
    without the client's (which a busy machine blurs)."""
    from django.db import connection

    from bench.kumiflow_workloads import _server_side as measure

    return measure() if connection.vendor == "postgresql" else None


def _due(count: int) -> None:
    from kumiflow_django import start_workflow
    from kumiflow_django.models import WorkflowRun

    ids = [start_workflow("bench-w6").id for _ in range(count)]  # sleeping for an hour
    WorkflowRun.objects.filter(id__in=ids).update(wake_at=datetime.now(UTC) - timedelta(minutes=1))


def w10(db: str) -> dict[str, Any]:
    """W1, the due poll and the admin pages on an empty store, then with 1,000,000
    finished runs and 5,000,000 events loaded in bulk."""
    n = _env_int("BENCH_W10_RUNS", 1_000_000)
    url = database_url(db, "kumiflow_bench_w10")
    setup_django(url)
    from kumiflow_django.models import WorkflowRun

    clear_peak_rss()
    machine = machine_cpu()
    empty = {"w1": _w1_rate("empty"), "poll_0": _poll_ms()}
    busy_empty = _busy(machine, machine_cpu())
    server = {"server_empty_0_due": _server_side()}
    _due(100)
    empty["poll_100"] = _poll_ms()
    server["server_empty_100_due"] = _server_side()
    empty_pages = _render_ms()
    WorkflowRun.objects.filter(workflow="bench-w6").delete()
    rss_empty = proc_status(os.getpid())["VmHWM"]

    from django.db import connections

    connections.close_all()
    loaded = _load_history(url, n)
    clear_peak_rss()
    machine = machine_cpu()
    full = {"w1": _w1_rate("full"), "poll_0": _poll_ms()}
    busy_full = _busy(machine, machine_cpu())
    server["server_history_0_due"] = _server_side()
    _due(100)
    full["poll_100"] = _poll_ms()
    server["server_history_100_due"] = _server_side()
    full_pages = _render_ms()
    rss_full = proc_status(os.getpid())["VmHWM"]
    result: dict[str, Any] = {k: v for k, v in server.items() if v} | {
        "history_runs": loaded["runs"],
        "history_events": loaded["events"],
        "load_s": loaded["load_s"],
        "load_rows_per_s": loaded["rows_per_s"],
        "w1_empty_per_s": round(empty["w1"], 1),
        "w1_history_per_s": round(full["w1"], 1),
        "w1_slowdown": round(empty["w1"] / full["w1"], 3),
        "poll_empty_ms": round(empty["poll_0"], 3),
        "poll_history_ms": round(full["poll_0"], 3),
        "poll_slowdown": round(full["poll_0"] / empty["poll_0"], 3),
        "poll_100_due_empty_ms": round(empty["poll_100"], 3),
        "poll_100_due_history_ms": round(full["poll_100"], 3),
        "poll_100_due_slowdown": round(full["poll_100"] / empty["poll_100"], 3),
        # Share of the machine's CPUs busy while W1 and the poll ran (this
        # process and the database use one each at most; the rest is others').
        "machine_busy_empty": round(busy_empty, 2),
        "machine_busy_history": round(busy_full, 2),
        # The engine runs in this process here (no worker process): its peak
        # while measuring, the bulk load having run in a process of its own.
        "worker_peak_rss_mb": round(max(rss_empty, rss_full), 1),
    }
    for page, ms in empty_pages.items():
        result[f"{page}_empty_ms"] = ms
    for page, ms in full_pages.items():
        result[f"{page}_history_ms"] = ms
    return result


# -- W11 --------------------------------------------------------------------


def _start_latencies(label: str, until: Callable[[int], bool]) -> list[float]:
    """W1's workflows one after the other, each in its own transaction, until
    ``until(count)``: the latency of each start (append, run, commit), in ms."""
    from django.db import transaction

    from kumiflow_django import append_event

    latencies: list[float] = []
    i = 0
    while not until(i):
        begin = time.perf_counter()
        with transaction.atomic():
            append_event(f"{label}-{i}", "bench.w1", {"n": i})
        latencies.append((time.perf_counter() - begin) * 1000)
        i += 1
    return latencies


_DELETED = re.compile(
    r"deleted (\d+) run\(s\) .* with (\d+) event\(s\) and (.*) in \d+ batch\(es\), ([\d.]+) s"
)


def w11(db: str) -> dict[str, Any]:
    """Deleting 1,000,000 finished runs while W1 runs: W1's start latency with
    and without retention, and the rows retention deletes per second."""
    n = _env_int("BENCH_W11_RUNS", 1_000_000)
    baseline_s = _env_int("BENCH_W11_BASELINE_S", 30)
    url = database_url(db, "kumiflow_bench_w11")
    setup_django(url)
    from django.db import connections

    from kumiflow_django.models import WorkflowRun

    loaded = _load_history(url, n, newest_days=100, oldest_days=400)
    clear_peak_rss()
    _start_latencies("warm", lambda i: i >= 200)
    began, machine = time.monotonic(), machine_cpu()
    alone = _start_latencies("alone", lambda i: time.monotonic() - began >= baseline_s)
    busy_alone = _busy(machine, machine_cpu())

    log = Path(tempfile.mkstemp(prefix="w11-", suffix=".log")[1])
    extra = (os.environ.get("BENCH_W11_RETENTION_ARGS") or "").split()
    retention = _manage(
        url, "kumiflow_retention", "--finished-before", "P90D", "-v", "1", *extra, log=log
    )
    peak = {"rss": 0.0}

    def finished(i: int) -> bool:
        if retention.poll() is not None:
            return True
        if i % 50 == 0:
            # A process that exits after the poll is a zombie for an instant:
            # its status has no memory lines then (and none once reaped).
            try:
                peak["rss"] = max(peak["rss"], proc_status(retention.pid).get("VmHWM", 0.0))
            except OSError:
                pass
        return False

    during_began, machine = time.monotonic(), machine_cpu()
    during = _start_latencies("during", finished)
    during_s = time.monotonic() - during_began
    busy_during = _busy(machine, machine_cpu())
    output = log.read_text()
    log.unlink(missing_ok=True)
    assert retention.returncode == 0, output[-2000:]
    match = _DELETED.search(output)
    assert match, output[-2000:]
    runs, events, seconds = int(match[1]), int(match[2]), float(match[4])
    # the owned rows, by kind: "0 dispatches, 0 tasks"
    owned = sum(int(part.split()[0]) for part in match[3].split(", "))
    cutoff = datetime.now(UTC) - timedelta(days=90)
    left = WorkflowRun.objects.filter(finished_at__lt=cutoff).count()
    w1_runs = WorkflowRun.objects.filter(workflow="bench-w1").count()
    connections.close_all()
    p99_alone, p99_during = percentile(alone, 99) or 0, percentile(during, 99) or 0
    return {
        "retention_args": " ".join(extra),
        "history_runs": loaded["runs"],
        "history_events": loaded["events"],
        "retention_runs_deleted": runs,
        "retention_rows_deleted": runs + events + owned,
        "retention_s": seconds,
        "retention_rows_per_s": round((runs + events + owned) / max(seconds, 1e-9)),
        "old_runs_left": left,
        "w1_runs_kept": w1_runs == 200 + len(alone) + len(during),
        "w1_alone_p50_ms": round(percentile(alone, 50) or 0, 2),
        "w1_alone_p99_ms": round(p99_alone, 2),
        "w1_alone_per_s": round(len(alone) / baseline_s, 1),
        "w1_during_p50_ms": round(percentile(during, 50) or 0, 2),
        "w1_during_p99_ms": round(p99_during, 2),
        "w1_during_per_s": round(len(during) / max(during_s, 1e-9), 1),
        "p99_ratio": round(p99_during / max(p99_alone, 1e-9), 2),
        "machine_busy_alone": round(busy_alone, 2),
        "machine_busy_during": round(busy_during, 2),
        "retention_peak_rss_mb": round(peak["rss"], 1),
        "worker_peak_rss_mb": round(proc_status(os.getpid())["VmHWM"], 1),
    }


WORKLOADS = {"W9": w9, "W10": w10, "W11": w11}
