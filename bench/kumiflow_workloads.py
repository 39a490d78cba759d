"""W1-W6 on kumiflow-django. Each function runs in a fresh child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.common import (
    ROOT,
    Receiver,
    clear_peak_rss,
    database_url,
    idle_scale,
    median,
    percentile,
    proc_status,
    release_freed_memory,
    setup_django,
)
from bench.scale_workloads import WORKLOADS as SCALE_WORKLOADS


def _spawn_worker(url: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    environment = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        **(env or {}),
    }
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "kumiflow_worker",
            "--max-interval",
            "1",
            "-v",
            "0",
        ],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait(condition: Any, timeout: float, poll: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return False


def w1(db: str) -> dict[str, Any]:
    """1,000 workflows of 5 steps, one trigger event per transaction; and the
    machine's raw single-row insert-and-commit rate, measured alike."""
    setup_django(database_url(db, "kumiflow_bench_w1"))
    clear_peak_rss()  # the engine runs in this process: its peak from here on
    from django.db import transaction

    from kumiflow_django import append_event
    from kumiflow_django.models import WorkflowRun
    from testproject.shop.models import Tally

    for i in range(50):  # warm-up
        with transaction.atomic():
            append_event(f"warm-{i}", "bench.w1", {"n": i})
    n = 1000
    start = time.perf_counter()
    for i in range(n):
        with transaction.atomic():
            append_event(f"w1-{i}", "bench.w1", {"n": i})
    elapsed = time.perf_counter() - start
    assert WorkflowRun.objects.filter(status="completed").count() == n + 50

    start = time.perf_counter()
    for i in range(n):
        with transaction.atomic():
            Tally.objects.create(key=f"raw-{i}")
    raw = n / (time.perf_counter() - start)
    driver = _driver_inserts_per_s(n)
    rate = n / elapsed
    return {
        "worker_peak_rss_mb": _own_peak_mb(),
        "workflows_per_s": round(rate, 1),
        "raw_inserts_per_s": round(raw, 1),
        "ratio_to_raw_inserts": round(rate / raw, 3),
        "driver_inserts_per_s": round(driver, 1),
        "ratio_to_driver_inserts": round(rate / driver, 3),
    }


def _driver_inserts_per_s(n: int) -> float:
    """The physical floor: one single-row insert and commit at a time through
    the database driver itself (no Django), on the connection Django opened."""
    from django.db import connection

    from testproject.shop.models import Tally

    connection.ensure_connection()
    raw = connection.connection
    table = Tally._meta.db_table
    placeholder = "?" if connection.vendor == "sqlite" else "%s"
    sql = f"INSERT INTO {table} (key, count) VALUES ({placeholder}, 0)"  # noqa: S608
    if connection.vendor == "mysql":
        sql = sql.replace("(key,", "(`key`,")
    cursor = raw.cursor()
    start = time.perf_counter()
    for i in range(n):
        if connection.vendor == "sqlite":
            cursor.execute("BEGIN IMMEDIATE")
        cursor.execute(sql, (f"driver-{i}",))
        raw.commit()
    return n / (time.perf_counter() - start)


def w2(db: str) -> dict[str, Any]:
    """500 workflows of step, sleep 2 s, step, started together; one worker process."""
    url = database_url(db, "kumiflow_bench_w2")
    setup_django(url)
    from kumiflow_django import start_workflow
    from kumiflow_django.models import Event, WorkflowRun

    worker = _spawn_worker(url)
    time.sleep(3)  # the worker is up and polling
    n = 500
    try:
        start = time.perf_counter()
        for _ in range(n):
            start_workflow("bench-w2")
        done = _wait(lambda: WorkflowRun.objects.filter(status="completed").count() == n, 120)
        wall = time.perf_counter() - start
        rss = proc_status(worker.pid)["VmHWM"]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    lateness = []
    waits = {
        e.stream_id: e.payload["wake_at"]
        for e in Event.objects.filter(type="kumiflow.workflow.step.waiting")
    }
    for e in Event.objects.filter(type="kumiflow.workflow.step.resumed"):
        wake_at = datetime.fromisoformat(waits[e.stream_id])
        lateness.append((e.created_at - wake_at).total_seconds() * 1000)
    return {
        "completed": done,
        "wall_minus_sleep_s": round(wall - 2.0, 3),
        "lateness_p50_ms": round(percentile(lateness, 50) or 0, 1),
        "lateness_p99_ms": round(percentile(lateness, 99) or 0, 1),
        "worker_peak_rss_mb": round(rss, 1),
    }


def w3(db: str) -> dict[str, Any]:
    """500 workflows each waiting for its own event; then the 500 events."""
    setup_django(database_url(db, "kumiflow_bench_w3"))
    clear_peak_rss()
    from django.db import transaction

    from kumiflow_django import append_event
    from kumiflow_django.models import WorkflowRun

    n = 500
    for i in range(n):
        append_event(f"w3-{i}", "bench.w3.start", {"key": i})
    assert WorkflowRun.objects.filter(status="waiting_event").count() == n
    latencies = []
    first = time.perf_counter()
    for i in range(n):
        begin = time.perf_counter()
        with transaction.atomic():  # the run completes in the appending transaction
            append_event(f"signal-{i}", "bench.w3.signal", {"key": i})
        latencies.append((time.perf_counter() - begin) * 1000)
    done = _wait(lambda: WorkflowRun.objects.filter(status="completed").count() == n, 60)
    total = time.perf_counter() - first
    return {
        "worker_peak_rss_mb": _own_peak_mb(),
        "completed": done,
        "all_complete_s": round(total, 3),
        "latency_p50_ms": round(percentile(latencies, 50) or 0, 2),
        "latency_p99_ms": round(percentile(latencies, 99) or 0, 2),
    }


def _poll_ms(repeat: int = 1000) -> float:
    """The median round trip of one poll for due work, after a warm-up."""
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


def _server_side() -> dict[str, float]:
    """PostgreSQL's own execution time and buffers of the poll (no client noise)."""
    import json as _json

    from django.db import connection

    from kumiflow_django.models import WorkflowRun

    qs = WorkflowRun.objects.due(datetime.now(UTC)).order_by("wake_at").values_list("id")[:100]
    sql, params = qs.query.sql_with_params()
    times, buffers = [], 0
    with connection.cursor() as cursor:
        for _ in range(50):
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
            raw = cursor.fetchone()[0]
            plan = (raw if isinstance(raw, list) else _json.loads(raw))[0]
            times.append(plan["Execution Time"])
            top = plan["Plan"]
            buffers = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    return {"exec_ms": round(median(times), 4), "buffers": buffers}


def _runs(count: int, *, status: str, wake_at: datetime | None) -> None:
    import uuid

    from kumiflow_django.models import WorkflowRun

    now = datetime.now(UTC)
    batch = []
    for _ in range(count):
        batch.append(
            WorkflowRun(
                id=uuid.uuid4(),
                tenant_id="default",
                workflow="bench-w6",
                fingerprint="0" * 64,
                status=status,
                version=3,
                wake_at=wake_at,
                started_at=now,
                updated_at=now,
                finished_at=None if wake_at else now,
            )
        )
        if len(batch) == 5000:
            WorkflowRun.objects.bulk_create(batch)
            batch = []
    WorkflowRun.objects.bulk_create(batch)


def w4(db: str) -> dict[str, Any]:
    """One poll for due work: empty store vs 100,000 finished runs, 0 and 100 due."""
    setup_django(database_url(db, "kumiflow_bench_w4"))
    from django.db import connection

    from kumiflow_django.models import WorkflowRun

    past = datetime.now(UTC) - timedelta(minutes=1)
    pg = connection.vendor == "postgresql"
    server: dict[str, Any] = {}
    clear_peak_rss()
    empty_0 = _poll_ms()
    if pg:
        server["server_empty_0_due"] = _server_side()
    _runs(100, status="waiting", wake_at=past)
    empty_100 = _poll_ms()
    peak = _own_peak_mb()
    WorkflowRun.objects.all().delete()
    _runs(100_000, status="completed", wake_at=None)
    if pg:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE kumiflow_workflowrun")
    loaded_peak = _own_peak_mb()
    release_freed_memory()  # the 100,000 rows this process loaded are not the poll's
    clear_peak_rss()
    full_0 = _poll_ms()
    if pg:
        server["server_finished_100k_0_due"] = _server_side()
    _runs(100, status="waiting", wake_at=past)
    full_100 = _poll_ms()
    return server | {
        # The poll runs in this process: its peak while polling; and the peak
        # of the whole process, which loaded 100,000 rows through the ORM.
        "worker_peak_rss_mb": max(peak, _own_peak_mb()),
        "process_peak_rss_mb": max(peak, loaded_peak),
        "empty_0_due_ms": round(empty_0, 3),
        "empty_100_due_ms": round(empty_100, 3),
        "finished_100k_0_due_ms": round(full_0, 3),
        "finished_100k_100_due_ms": round(full_100, 3),
        "ratio_0_due": round(full_0 / empty_0, 3),
        "ratio_100_due": round(full_100 / empty_100, 3),
    }


def w5(db: str) -> dict[str, Any]:
    """200 workflows of 3 side-effecting steps, a 1 s sleep and a webhook; the
    worker is killed with SIGKILL mid-way and restarted."""
    url = database_url(db, "kumiflow_bench_w5")
    setup_django(url)
    from django.db import transaction

    from kumiflow_django import append_event
    from kumiflow_django.models import Dispatch, WorkflowRun
    from testproject.shop.models import Tally

    receiver = Receiver()
    env = {"BENCH_RECEIVER": receiver.url, "KUMIFLOW_LEASE_SECONDS": "2"}
    os.environ.update(env)
    n = 200
    with transaction.atomic():
        for i in range(n):
            append_event(f"w5-{i}", "bench.w5", {"n": i})
    completed = WorkflowRun.objects.filter(status="completed")
    first = _spawn_worker(url, env)
    # Mid-way: the kill lands when half the runs are done (the JSON says how
    # many were); the others are asleep, mid-segment or not yet started.
    _wait(lambda: completed.count() >= n // 2, 120, poll=0.002)
    rss = proc_status(first.pid)["VmHWM"]
    first.send_signal(signal.SIGKILL)
    first.wait()
    at_kill = completed.count()
    second = _spawn_worker(url, env)
    finished = _wait(
        lambda: (
            completed.count() == n and not Dispatch.objects.exclude(status="delivered").exists()
        ),
        180,
    )
    rss = max(rss, proc_status(second.pid)["VmHWM"])
    second.send_signal(signal.SIGTERM)
    second.wait(60)
    counts = list(Tally.objects.values_list("count", flat=True))
    keys = receiver.keys
    return {
        "completed_when_killed": at_kill,
        "done_when_killed": round(at_kill / n, 2),
        "runs_completed": completed.count(),
        "runs_lost": n - completed.count(),
        "side_effects_repeated": sum(1 for c in counts if c > 1),
        "side_effects_missing": 3 * n - len(counts),
        "deliveries_distinct_keys": len(keys),
        "deliveries_repeated": sum(1 for c in keys.values() if c > 1),
        "deliveries_max_per_key": max(keys.values(), default=0),
        "finished_in_time": finished,
        "worker_peak_rss_mb": round(rss, 1),
    }


def _sleeping(url: str, n: int) -> dict[str, float]:
    from kumiflow_django import start_workflow

    for _ in range(n):
        start_workflow("bench-w6")
    worker = _spawn_worker(url)
    try:
        time.sleep(8)  # several polls
        status = proc_status(worker.pid)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    return status


def w6(db: str) -> dict[str, Any]:
    """The worker's memory and threads while 200, then 20,000 runs sleep for an hour."""
    url = database_url(db, "kumiflow_bench_w6")
    setup_django(url)
    from kumiflow_django.models import WorkflowRun

    small = _sleeping(url, 200)
    WorkflowRun.objects.all().delete()
    large = _sleeping(url, 20_000)
    return idle_scale(small, large) | {"worker_peak_rss_mb": round(large["VmHWM"], 1)}


def _own_peak_mb() -> float:
    return round(proc_status(os.getpid())["VmHWM"], 1)


WORKLOADS = {"W1": w1, "W2": w2, "W3": w3, "W4": w4, "W5": w5, "W6": w6, **SCALE_WORKLOADS}
