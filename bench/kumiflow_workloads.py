"""W1-W6 on kumiflow-django. Each function runs in a fresh child process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.common import (
    COUNT_DIR,
    ROOT,
    Receiver,
    clear_peak_rss,
    counting,
    database_url,
    idle_scale,
    median,
    per_segment,
    percentile,
    proc_status,
    release_freed_memory,
    setup_django,
    workers_counted,
)
from bench.http_workloads import WORKLOADS as HTTP_WORKLOADS
from bench.scale_workloads import WORKLOADS as SCALE_WORKLOADS


def _spawn_worker(
    url: str, env: dict[str, str] | None = None, *extra: str
) -> subprocess.Popen[bytes]:
    environment = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "BENCH_WORKER": "1",  # it counts its statements (bench/apps.py)
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
            *extra,
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
    return _w1(db, "kumiflow_bench_w1", contextlib.nullcontext)


def w1_limited(db: str) -> dict[str, Any]:
    """W1 with a concurrency limit on a per-run key (so no run waits), side by
    side with W1 without one, in one process: blocks of 25 workflows
    alternate between the two, so that a busy machine slows both alike."""
    setup_django(database_url(db, "kumiflow_bench_w1l"))
    from django.db import transaction

    from kumiflow_django import append_event
    from kumiflow_django.models import WorkflowRun

    types = {"limited": "bench.w1l", "plain": "bench.w1"}
    wall: dict[str, list[float]] = {"limited": [], "plain": []}
    size, count = 25, 0
    for round_ in range(42):  # two rounds of warm-up, then 1,000 workflows each way
        for mode, event_type in types.items():
            began = time.perf_counter()
            for _ in range(size):
                count += 1
                with transaction.atomic():
                    append_event(f"w1-{count}", event_type, {"n": count})
            if round_ >= 2:
                wall[mode].append(time.perf_counter() - began)
    limited, plain = median(wall["limited"]), median(wall["plain"])
    done = WorkflowRun.objects.filter(workflow="bench-w1-limited", status="completed").count()
    return {
        "workflows_per_s": round(size / limited, 1),
        "workflows_per_s_without": round(size / plain, 1),
        "cost": round(limited / plain - 1, 3),
        "completed": done,
    }


def w1_observed(db: str) -> dict[str, Any]:
    """W1 with tracing and metrics on, side by side with W1 without them, in
    one process: blocks of 25 workflows take turns, so that a busy machine
    slows every mode alike. "On" is the OpenTelemetry SDK (spans batched into
    an exporter that drops them) and prometheus-client registered with the
    engine; "off" has neither. ``cost`` judges W1 as the issue defines it (no
    caller span); ``cost_traced_caller`` appends each trigger inside an
    application span in both modes (an instrumented request: the SDK is on
    either way, the engine's integrations are what differ); and
    ``cost_caller_span_included`` charges that caller's own span to the
    engine too (the figure of round 3)."""
    os.environ["BENCH_OBSERVED"] = "1"  # bench/settings.py: KUMIFLOW_TRACING/METRICS on
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Dropped(SpanExporter):
        exported = 0

        def export(self, spans: Any) -> SpanExportResult:
            Dropped.exported += len(spans)
            return SpanExportResult.SUCCESS

    # BENCH_SAMPLE_RATIO=0.1: the cost with a sampler that records one trace in ten.
    ratio = float(os.environ.get("BENCH_SAMPLE_RATIO", "1"))
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)
    tracer = provider.get_tracer("bench")
    setup_django(database_url(db, "kumiflow_bench_w1o"))
    from django.db import transaction
    from prometheus_client import REGISTRY

    from kumiflow_django import append_event
    from kumiflow_django.store import telemetry

    engine = (telemetry.set_tracer(None), telemetry.set_meter(None))
    assert engine[0] is not None and engine[1] is not None, "integrations installed"
    modes = {  # mode: (the engine's tracer and meter, a caller span around each append)
        "on": (engine, False),
        "off": ((None, None), False),
        "caller-on": (engine, True),
        "caller-off": ((None, None), True),
    }
    wall: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    size, count = 25, 0
    for round_ in range(42):  # two rounds of warm-up, then 1,000 workflows each way
        for mode, ((tracer_, meter), caller) in modes.items():
            telemetry.set_tracer(tracer_)
            telemetry.set_meter(meter)
            began, began_cpu = time.perf_counter(), time.process_time()
            for _ in range(size):
                count += 1
                request = tracer.start_as_current_span("POST /w1") if caller else _NO_SPAN
                with request, transaction.atomic():
                    append_event(f"w1-{count}", "bench.w1", {"n": count})
            if round_ >= 2:
                wall[mode].append(time.perf_counter() - began)
                cpu[mode].append(time.process_time() - began_cpu)
    provider.force_flush()
    t = {mode: median(values) for mode, values in wall.items()}
    c = {mode: median(values) for mode, values in cpu.items()}
    return {
        "workflows_per_s": round(size / t["on"], 1),
        "workflows_per_s_without": round(size / t["off"], 1),
        "cost": round(t["on"] / t["off"] - 1, 3),
        "cpu_ms_per_workflow": round(c["on"] / size * 1000, 3),
        "cpu_ms_per_workflow_without": round(c["off"] / size * 1000, 3),
        "cpu_cost": round(c["on"] / c["off"] - 1, 3),
        "cost_traced_caller": round(t["caller-on"] / t["caller-off"] - 1, 3),
        "cpu_cost_traced_caller": round(c["caller-on"] / c["caller-off"] - 1, 3),
        "cost_caller_span_included": round(t["caller-on"] / t["off"] - 1, 3),
        "sample_ratio": ratio,
        "spans_exported": Dropped.exported,
        "runs_counted": REGISTRY.get_sample_value(
            "kumiflow_runs_completed_total", {"workflow": "bench-w1"}
        ),
    }


_NO_SPAN = contextlib.nullcontext()


def _w1(db: str, name: str, request: Any) -> dict[str, Any]:
    setup_django(database_url(db, name))
    clear_peak_rss()  # the engine runs in this process: its peak from here on
    from django.db import transaction

    from kumiflow_django import append_event
    from kumiflow_django.models import WorkflowRun
    from testproject.shop.models import Tally

    for i in range(50):  # warm-up
        with request(), transaction.atomic():
            append_event(f"warm-{i}", "bench.w1", {"n": i})
    n = 1000
    with counting() as counted:
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            with request(), transaction.atomic():
                append_event(f"w1-{i}", "bench.w1", {"n": i})
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu  # this process's threads: steadier on a busy machine
    counts = per_segment(counted.statements, counted.transactions, counted.segments())
    assert WorkflowRun.objects.filter(status="completed").count() == n + 50

    start = time.perf_counter()
    for i in range(n):
        with transaction.atomic():
            Tally.objects.create(key=f"raw-{i}")
    raw = n / (time.perf_counter() - start)
    driver = _driver_inserts_per_s(n)
    floor, floor_cpu = _statements_floor(n)
    rate = n / elapsed
    return {
        "worker_peak_rss_mb": _own_peak_mb(),
        "workflows_per_s": round(rate, 1),
        "cpu_ms_per_workflow": round(cpu / n * 1000, 3),
        "raw_inserts_per_s": round(raw, 1),
        "ratio_to_raw_inserts": round(rate / raw, 3),
        "driver_inserts_per_s": round(driver, 1),
        "ratio_to_driver_inserts": round(rate / driver, 3),
        "statements_floor_per_s": round(floor, 1),
        "statements_floor_cpu_ms": round(floor_cpu / n * 1000, 3),
        "floor_ratio_to_driver_inserts": round(floor / driver, 3),
        **counts,
    }


_UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")


def _statements_floor(n: int) -> tuple[float, float]:
    """The floor of W1 as the engine writes it: one workflow's own statements
    (its savepoints, its INSERTs, the NOTIFY after its commit), captured as
    sent, replayed ``n`` times through Django's cursor with fresh keys and no
    engine code at all. What no change of the engine's Python can beat
    without sending fewer statements; (workflows/s, CPU seconds)."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from kumiflow_django import append_event

    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        append_event("floor-0", "bench.w1", {"n": 0})
    statements = [q["sql"] for q in captured.captured_queries]
    # Django logs the COMMIT of an atomic block; what follows it (the NOTIFY)
    # runs outside the transaction.
    commit = next((i for i, sql in enumerate(statements) if sql == "COMMIT"), len(statements))
    inside = [sql for sql in statements[:commit] if not sql.startswith("BEGIN")]
    after = statements[commit + 1 :]
    keys = sorted(set(_UUID.findall("\n".join(statements))))

    def fresh(i: int) -> list[list[str]]:
        new = {key: (uuid.uuid4().hex if "-" not in key else str(uuid.uuid4())) for key in keys}
        new["floor-0"] = f"floor-{i}"
        out = []
        for group in (inside, after):
            texts = []
            for sql in group:
                for old, key in new.items():
                    sql = sql.replace(old, key)
                texts.append(sql)
            out.append(texts)
        return out

    replays = [fresh(i) for i in range(1, n + 1)]  # built before the clock starts
    start, cpu = time.perf_counter(), time.process_time()
    for inside_i, after_i in replays:
        with transaction.atomic(), connection.cursor() as cursor:
            for sql in inside_i:
                cursor.execute(sql)
        with connection.cursor() as cursor:
            for sql in after_i:
                cursor.execute(sql)
    return n / (time.perf_counter() - start), time.process_time() - cpu


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
        with counting() as counted:  # the starts; the worker counts its own
            start = time.perf_counter()
            for _ in range(n):
                start_workflow("bench-w2")
        done = _wait(lambda: WorkflowRun.objects.filter(status="completed").count() == n, 120)
        wall = time.perf_counter() - start
        rss = proc_status(worker.pid)["VmHWM"]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    counts = _with_workers(counted)
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
        **counts,
    }


def _with_workers(counted: counting) -> dict[str, Any]:
    """The counts of a block of this process and of the whole life of the
    workers it started (their idle polls included), per segment written."""
    statements, transactions = workers_counted(os.environ[COUNT_DIR])
    return per_segment(
        counted.statements + statements,
        counted.transactions + transactions,
        counted.segments(),
        worker_statements=statements,
    )


def w3(db: str) -> dict[str, Any]:
    """500 workflows each waiting for its own event; then the 500 events."""
    setup_django(database_url(db, "kumiflow_bench_w3"))
    clear_peak_rss()
    from django.db import transaction

    from kumiflow_django import append_event
    from kumiflow_django.models import WorkflowRun

    n = 500
    with counting() as starts:
        for i in range(n):
            append_event(f"w3-{i}", "bench.w3.start", {"key": i})
    assert WorkflowRun.objects.filter(status="waiting_event").count() == n
    latencies = []
    with counting() as wakes:  # the segments of the awaited events
        first = time.perf_counter()
        for i in range(n):
            begin = time.perf_counter()
            with transaction.atomic():  # the run completes in the appending transaction
                append_event(f"signal-{i}", "bench.w3.signal", {"key": i})
            latencies.append((time.perf_counter() - begin) * 1000)
    done = _wait(lambda: WorkflowRun.objects.filter(status="completed").count() == n, 60)
    total = time.perf_counter() - first
    counts = per_segment(wakes.statements, wakes.transactions, wakes.segments())
    start_segments = starts.segments()
    counts["start_statements_per_segment"] = round(starts.statements / start_segments, 2)
    return {
        "worker_peak_rss_mb": _own_peak_mb(),
        "completed": done,
        "all_complete_s": round(total, 3),
        "latency_p50_ms": round(percentile(latencies, 50) or 0, 2),
        "latency_p99_ms": round(percentile(latencies, 99) or 0, 2),
        **counts,
    }


def w4_backlog(db: str) -> dict[str, Any]:
    """The due claim with a backlog larger than a batch: ranked in the database
    (priority, then tenants' turns) with a window function over the due range.
    Median time of one claim of 100 with 100, 1,000 and 10,000 runs due."""
    setup_django(database_url(db, "kumiflow_bench_w4b"))
    from kumiflow_django.models import WorkflowRun
    from kumiflow_django.workers.resume import due_runs

    past = datetime.now(UTC) - timedelta(minutes=1)
    out: dict[str, Any] = {}
    for n in (100, 1_000, 10_000):
        WorkflowRun.objects.all().delete()
        _runs(n, status="waiting", wake_at=past)
        now = datetime.now(UTC)
        for _ in range(5):
            due_runs(now, 100)
        samples = []
        for _ in range(30):
            begin = time.perf_counter()
            due_runs(now, 100)
            samples.append((time.perf_counter() - begin) * 1000)
        out[f"claim_100_of_{n}_due_ms"] = round(median(samples), 2)
    return out


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


class _LongestTransaction:
    """Samples pg_stat_activity every 5 ms from a connection of its own: the
    longest transaction any other session of the database held open, and
    who held it (pid, application name, backend type, state, its last query
    and when the transaction began), so that a long one names its holder."""

    def __init__(self, url: str) -> None:
        import threading

        import psycopg

        self.conn = psycopg.connect(
            url.replace("postgres://", "postgresql://"),
            autocommit=True,
            application_name="bench-sampler",
        )
        self.longest_ms = 0.0
        self.holder: dict[str, Any] = {}
        #: The longest transaction of each application name (the bench's driver,
        #: the worker): which side a long one is on.
        self.by_application: dict[str, float] = {}
        #: Samples that caught an idle LISTEN session reading a notification.
        self.notification_reads = 0
        self.samples = 0
        #: Sessions of this process (the bench's own driver connection): named
        #: in the holder so that a long transaction of the bench is told apart.
        self.own_pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            rows = self.conn.execute(
                "SELECT extract(epoch FROM clock_timestamp() - xact_start), pid, "
                "application_name, backend_type, state, left(query, 400), xact_start, "
                "backend_start, wait_event_type, wait_event "
                "FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL "
                "ORDER BY xact_start"
            ).fetchall()
            # An idle session has no transaction of its client's. One that
            # LISTENs reads each notification in a transaction of the server's
            # own, for an instant, and pg_stat_activity gives it the start of
            # the session's last statement (its LISTEN, seconds or hours ago):
            # counted apart, it is not a transaction anyone holds open.
            self.notification_reads += sum(1 for held in rows if held[4] == "idle")
            rows = [held for held in rows if held[4] != "idle"]
            for held in rows:
                app = "bench-driver" if held[1] in self.own_pids else (held[2] or "?")
                self.by_application[app] = max(
                    self.by_application.get(app, 0.0), round(float(held[0]) * 1000, 1)
                )
            row = rows[0] if rows else None
            if row is not None and float(row[0]) * 1000 > self.longest_ms:
                self.longest_ms = float(row[0]) * 1000
                self.holder = {
                    "pid": row[1],
                    "application_name": row[2],
                    "backend_type": row[3],
                    "state": row[4],
                    "query": row[5],
                    "xact_start": row[6].isoformat(),
                    "backend_start": row[7].isoformat(),
                    "wait_event": f"{row[8]}:{row[9]}" if row[8] else None,
                    "bench_driver": row[1] in self.own_pids,
                }
            self.samples += 1
            self._stop.wait(0.005)

    def __enter__(self) -> _LongestTransaction:
        from django.db import connection

        connection.ensure_connection()
        self.own_pids.add(connection.connection.info.backend_pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.conn.close()


def w7(db: str) -> dict[str, Any]:
    """500 workflows, each one task step that sleeps 200 ms, drained by one
    worker with 32 task threads; the longest transaction while it ran."""
    if db != "postgresql":
        return {"skipped": "measured on PostgreSQL (pg_stat_activity)"}
    url = database_url(db, "kumiflow_bench_w7")
    os.environ["PGAPPNAME"] = "bench-driver"  # libpq's: who holds a transaction
    setup_django(url)
    import json
    import tempfile
    from pathlib import Path

    from bench.instrument import summary
    from kumiflow_django import start_workflow
    from kumiflow_django.definition.serving import WorkerProcess
    from kumiflow_django.models import StepTask, WorkflowRun

    trace = Path(tempfile.mkstemp(prefix="w7-tx-", suffix=".json")[1])
    # BENCH_W7_PROFILE=path: a cProfile of the worker process (bench/instrument.py).
    profile = os.environ.get("BENCH_W7_PROFILE")
    worker = _spawn_worker(
        url,
        {"PGAPPNAME": "bench-worker", "BENCH_TX_TRACE": str(trace)}
        | ({"BENCH_PROCESS_PROFILE": profile} if profile else {}),
        "--task-threads",
        "32",
    )
    # Up once its heartbeat row is written (the loops start right after it),
    # and a second more: its start is not part of the drain.
    up = _wait(lambda: WorkerProcess.objects.exists(), 60)
    time.sleep(1)
    n = 500
    try:
        with _LongestTransaction(url) as longest:
            with counting() as counted:  # the starts; the worker counts its own
                start = time.perf_counter()
                for _ in range(n):
                    start_workflow("bench-w7")
            done = _wait(lambda: WorkflowRun.objects.filter(status="completed").count() == n, 120)
            wall = time.perf_counter() - start
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    transactions = json.loads(trace.read_text() or "{}")
    trace.unlink(missing_ok=True)
    return _with_workers(counted) | {
        "completed": up and done,
        "all_complete_s": round(wall, 3),
        "ideal_s": round(n * 0.2 / 32, 3),
        "attempts": sum(StepTask.objects.values_list("attempt", flat=True)),
        "longest_transaction_ms": round(longest.longest_ms, 1),
        "longest_transaction_holder": longest.holder,
        "longest_transaction_by_application_ms": longest.by_application,
        "transaction_samples": longest.samples,
        "notification_read_samples": longest.notification_reads,
        # The worker's own transactions, timed in the worker, by the function
        # that opened them (bench/instrument.py): the longest sites.
        "worker_transactions_ms": summary(transactions),
    }


def w8(db: str) -> dict[str, Any]:
    """One parent starts 1,000 child runs of one step each and joins them (a
    parallel for_each of child steps), drained by one worker process."""
    if db != "postgresql":
        return {"skipped": "measured on PostgreSQL"}
    url = database_url(db, "kumiflow_bench_w8")
    setup_django(url)
    from kumiflow_django import start_workflow
    from kumiflow_django.models import WorkflowRun

    worker = _spawn_worker(url)
    time.sleep(3)  # the worker is up and polling
    try:
        with counting() as counted:  # the parent's start; the worker counts its own
            start = time.perf_counter()
            parent = start_workflow("bench-w8")
        done = _wait(
            lambda: WorkflowRun.objects.filter(pk=parent.pk, status="completed").exists(), 300
        )
        wall = time.perf_counter() - start
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    parent.refresh_from_db()
    return _with_workers(counted) | {
        "completed": done and parent.result == 1000,
        "all_complete_s": round(wall, 3),
        "children": WorkflowRun.objects.filter(parent_id=parent.pk, status="completed").count(),
        "parent_segments": parent.version,
    }


# -- W12: the console on a million runs ----------------------------------------------

#: How many runs W12 loads (BENCH_W12_RUNS; the console's target is for 1,000,000).
W12_RUNS = int(os.environ.get("BENCH_W12_RUNS", "1000000"))
#: W12 spreads the runs' starts over this many days (33,333 a day at a million).
W12_DAYS = 30
W12_WORKFLOWS = ["bench-w1", "bench-w2", "bench-w3", "bench-w5", "bench-w6"]

_RUN_COLUMNS = (
    "id, tenant_id, workflow, workflow_version, fingerprint, status, start_mode, cursor, state, "
    "trail, wake_at, since_position, since_gaps, matched_position, attempt, last_error, reason, result, input, "
    "trigger_type, trigger_position, idempotency_key, version, recoveries, lease_owner, "
    "lease_until, started_at, updated_at, finished_at"
)
# Per mille of the runs in each status, by x % 1000: a store most of whose runs finished.
_STATUS = (
    "CASE WHEN m < 900 THEN 'completed' WHEN m < 930 THEN 'failed' "
    "WHEN m < 950 THEN 'cancelled' WHEN m < 980 THEN 'waiting' "
    "WHEN m < 995 THEN 'waiting_event' WHEN m < 998 THEN 'retry_scheduled' "
    "WHEN m < 999 THEN 'running' ELSE 'pending' END"
)


def _w12_sql(vendor: str, n: int) -> list[str]:
    """INSERT … SELECT statements that generate the runs and outbox rows in the
    database (a million rows in seconds, no Python per row)."""
    step = W12_DAYS * 86400 / n  # seconds between two starts
    pg = vendor == "postgresql"

    def series(count: int) -> str:
        if pg:
            return (
                f"SELECT x, x % 1000 AS m, now() - make_interval(secs => x * {step}) AS started "
                f"FROM generate_series(1, {count}) AS x"
            )
        return (  # SQLite: a recursive series; times as Django stores them (UTC text)
            f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {count}) "
            f"SELECT x, x % 1000 AS m, strftime('%Y-%m-%d %H:%M:%f', 'now', "
            f"'-' || (x * {step}) || ' seconds') AS started FROM c"
        )

    def later(seconds: str) -> str:
        if pg:
            return f"started + make_interval(secs => {seconds})"
        return f"strftime('%Y-%m-%d %H:%M:%f', started, '+' || ({seconds}) || ' seconds')"

    def js(text: str) -> str:
        return f"'{text}'::jsonb" if pg else f"'{text}'"

    uuid = "gen_random_uuid()" if pg else "lower(hex(randomblob(16)))"
    workflow = (
        "CASE x % 5 "
        + " ".join(f"WHEN {i} THEN '{w}'" for i, w in enumerate(W12_WORKFLOWS))
        + " END"
    )
    state = '{"steps": {}, "loops": {}, "retries": {}, "consumed": {}}'
    wake = (
        f"CASE WHEN m >= 950 AND m < 980 THEN {later('86400 * (1 + x % 7)')} "
        f"WHEN m >= 980 AND m < 995 THEN {later('259200')} "
        f"WHEN m >= 995 AND m < 998 THEN {later('3600')} "
        f"WHEN m = 999 THEN started END"
    )
    failed = "m >= 900 AND m < 930"
    runs = (
        f"INSERT INTO kumiflow_workflowrun ({_RUN_COLUMNS}) SELECT {uuid}, 'default', "
        f"{workflow}, '', '{'0' * 64}', {_STATUS}, 'inline', NULL, {js(state)}, {js('[]')}, "
        f"{wake}, 0, NULL, NULL, 1, "
        f"CASE WHEN {failed} THEN 'ValueError at step 2' ELSE '' END, "
        f"CASE WHEN {failed} THEN 'step_failed' ELSE '' END, NULL, NULL, 'manual', NULL, "
        f"CASE WHEN x % 2 = 0 THEN 'order:' || x END, 3, 0, '', NULL, started, started, "
        f"CASE WHEN m < 950 THEN {later('x % 600')} END FROM ({series(n)}) AS s"
    )
    outbox = (
        "INSERT INTO kumiflow_dispatch (id, tenant_id, run_id, step_path, kind, status, request, "
        "retry, attempts, next_attempt_at, last_error, last_status_code, version, created_at, "
        "updated_at, delivered_at) "
        f"SELECT {uuid}, 'default', NULL, '0', 'webhook', CASE WHEN m < 990 THEN 'delivered' "
        f"WHEN m < 999 THEN 'pending' ELSE 'dead' END, {js('{}')}, {js('{}')}, 1, "
        f"CASE WHEN m >= 990 AND m < 999 THEN started END, '', 200, 2, started, started, "
        f"CASE WHEN m < 990 THEN started END FROM ({series(n // 5)}) AS s"
    )
    # The waiting runs' waits (one RunWait row each, as wait_for_event leaves).
    waiting = (
        "INSERT INTO kumiflow_runwait (run_id, tenant_id, branch, event_type, correlation_key, "
        f"match, after, gaps) SELECT id, tenant_id, '', 'bench.approved', 'k' || "
        f"{'id::text' if pg else 'id'}, {js('{}')}, 0, NULL FROM kumiflow_workflowrun "
        "WHERE status = 'waiting_event'"
    )
    return [runs, waiting, outbox]


def _timed_get(client: Any, url: str, repeat: int) -> dict[str, float]:
    """Server time of a page: the request through Django in this process (URL
    routing, middleware, the view's queries, the template), no network."""
    for _ in range(3):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
    samples = []
    for _ in range(repeat):
        begin = time.perf_counter()
        client.get(url)
        samples.append((time.perf_counter() - begin) * 1000)
    return {
        "median_ms": round(median(samples), 1),
        "p95_ms": round(percentile(samples, 95) or 0, 1),
    }


def w12(db: str) -> dict[str, Any]:
    """The console's overview and run list with a million runs in the store (and
    200,000 outbox rows): each page's server time, median and p95 of 30 requests.

    Not in the default set (``--only W12``): loading takes a minute and a
    gigabyte of disk. ``BENCH_W12_RUNS`` sets the number of runs."""
    setup_django(database_url(db, "kumiflow_bench_w12"))
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    from kumiflow_django.models import WorkflowRun

    n = W12_RUNS
    began = time.perf_counter()
    with connection.cursor() as cursor:
        for statement in _w12_sql(connection.vendor, n):
            cursor.execute(statement)
        cursor.execute("ANALYZE")
    if connection.vendor == "postgresql":  # an index-only scan needs the visibility map
        connection.ensure_connection()
        raw = connection.connection
        raw.autocommit = True
        with raw.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE kumiflow_workflowrun")
            cursor.execute("VACUUM ANALYZE kumiflow_dispatch")
    load_s = time.perf_counter() - began
    assert WorkflowRun.objects.count() == n

    user = User.objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)
    sample = WorkflowRun.objects.filter(status="failed").order_by("-started_at").first()
    assert sample is not None
    pages = {
        "overview": "/admin/kumiflow/workflowrun/overview/",
        "run_list": "/admin/kumiflow/workflowrun/",
        "run_list_failed": "/admin/kumiflow/workflowrun/?status__exact=failed",
        "run_list_workflow": "/admin/kumiflow/workflowrun/?workflow=bench-w3",
        "run_list_due": "/admin/kumiflow/workflowrun/?attention=due",
        "search_id_prefix": f"/admin/kumiflow/workflowrun/?q={str(sample.pk)[:8]}",
        "search_key_prefix": "/admin/kumiflow/workflowrun/?q=order:12345",
        "run_page": f"/admin/kumiflow/workflowrun/{sample.pk}/change/",
    }
    result: dict[str, Any] = {"runs": n, "load_s": round(load_s, 1)}
    for name, url in pages.items():
        timing = _timed_get(client, url, 30)
        result[f"{name}_ms"] = timing["median_ms"]
        result[f"{name}_p95_ms"] = timing["p95_ms"]
    # Server time on a shared machine: say how busy it was.
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    result["cpus"] = os.cpu_count()
    return result


# -- W13: a bulk operation on 100,000 runs --------------------------------------------

#: How many runs W13 cancels in bulk (BENCH_W13_RUNS; the target is for 100,000).
W13_RUNS = int(os.environ.get("BENCH_W13_RUNS", "100000"))


def _w13_sql(vendor: str, n: int) -> str:
    """One INSERT … SELECT of ``n`` waiting runs of ``bench-w13`` (a timer a week
    away), generated in the database; every other column its model default."""
    from django.db.models import NOT_PROVIDED

    from kumiflow_django.models import WorkflowRun

    pg = vendor == "postgresql"
    if pg:
        series = f"SELECT x FROM generate_series(1, {n}) AS x"
        uuid, now, later = "gen_random_uuid()", "now()", "now() + interval '7 days'"
    else:
        series = (
            f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) "
            "SELECT x FROM c"
        )
        uuid = "lower(hex(randomblob(16)))"
        now = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
        later = "strftime('%Y-%m-%d %H:%M:%f', 'now', '+7 days')"
    given = {
        "id": uuid,
        "tenant_id": "'default'",
        "workflow": "'bench-w13'",
        "fingerprint": f"'{'0' * 64}'",
        "status": "'waiting'",
        "cursor": "'[0]'",
        "state": "'{}'",
        "trail": "'[]'",
        "wake_at": later,
        "version": "2",
        "started_at": now,
        "updated_at": now,
    }
    columns, values = [], []
    for f in WorkflowRun._meta.concrete_fields:
        columns.append(f.column)
        if f.column in given:
            value = given[f.column]
            if pg and f.get_internal_type() == "JSONField":
                value += "::jsonb"
        elif f.has_default() and callable(f.default) and f.get_internal_type() == "JSONField":
            value = f"'{json.dumps(f.default())}'" + ("::jsonb" if pg else "")
        elif f.default is NOT_PROVIDED or callable(f.default):
            value = "NULL" if f.null else "''"
        elif isinstance(f.default, bool):
            value = ("TRUE" if f.default else "FALSE") if pg else str(int(f.default))
        elif isinstance(f.default, int):
            value = str(f.default)
        else:
            value = f"'{f.default}'"
        values.append(value)
    return (
        f"INSERT INTO kumiflow_workflowrun ({', '.join(columns)}) "
        f"SELECT {', '.join(values)} FROM ({series}) AS s"
    )


def w13(db: str) -> dict[str, Any]:
    """``bulk_runs("cancel", filters={"workflow": ...})`` on 100,000 waiting runs:
    the time, this process's peak memory, and the longest transaction (each
    run is one, with the operation's cursor; timed here on every database,
    and sampled from pg_stat_activity on PostgreSQL). Every run gets its own run-cancelled
    event through ``cancel_run``, with the operator and the reason."""
    url = database_url(db, "kumiflow_bench_w13")
    setup_django(url)
    from django.db import connection

    from kumiflow_django import bulk_runs
    from kumiflow_django.engine import bulk
    from kumiflow_django.models import Event, WorkflowRun

    n = W13_RUNS
    with connection.cursor() as cursor:
        cursor.execute(_w13_sql(connection.vendor, n))
        if connection.vendor != "sqlite":
            # Not on SQLite: its sqlite_stat1 has no NULL fraction, so with
            # every parent_id NULL it rates the parent index useless and each
            # cancel's lookup of the run's children scans the table (0.7 s a
            # run at 100,000 rows); without statistics it uses the index.
            cursor.execute("ANALYZE")
    assert WorkflowRun.objects.filter(workflow="bench-w13").count() == n
    release_freed_memory()
    rss_before = proc_status(os.getpid())["VmRSS"]
    clear_peak_rss()
    transactions: list[float] = []
    real = bulk._run_one

    def timed(*args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            transactions.append((time.perf_counter() - begin) * 1000)

    bulk._run_one = timed  # type: ignore[assignment]
    sampler = _LongestTransaction(url) if db == "postgresql" else contextlib.nullcontext()
    began = time.perf_counter()
    with sampler:
        operation = bulk_runs(
            "cancel", filters={"workflow": "bench-w13"}, reason="bench W13", by="bench"
        )
    elapsed = time.perf_counter() - began
    bulk._run_one = real  # type: ignore[assignment]
    cancelled = Event.objects.filter(type="kumiflow.workflow.run-cancelled").count()
    result: dict[str, Any] = {
        "runs": n,
        "done": operation.done,
        "runs_skipped": operation.skipped,
        "errors": operation.errors,
        "events": cancelled,
        "batch_size": operation.batch_size,
        "bulk_seconds": round(elapsed, 1),
        "runs_per_s": round(n / elapsed),
        "rss_before_mb": round(rss_before, 1),
        "peak_rss_mb": _own_peak_mb(),
        "longest_run_transaction_ms": round(max(transactions), 1),
        "median_run_transaction_ms": round(median(transactions), 2),
    }
    if db == "postgresql":
        result["longest_transaction_ms"] = round(sampler.longest_ms, 1)  # type: ignore[union-attr]
    return result


WORKLOADS = {
    "W1": w1,
    "W1-observed": w1_observed,
    "W1-limited": w1_limited,
    "W4-backlog": w4_backlog,
    "W2": w2,
    "W3": w3,
    "W4": w4,
    "W5": w5,
    "W6": w6,
    "W7": w7,
    "W8": w8,
    "W12": w12,
    "W13": w13,
    **SCALE_WORKLOADS,
    **HTTP_WORKLOADS,
}
