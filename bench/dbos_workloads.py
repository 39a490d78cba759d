"""The same workloads on DBOS Transact (the ``dbos`` package), for comparison.

Each function runs in a fresh child process with its own system database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from bench.common import (
    RESULTS,
    ROOT,
    Receiver,
    fresh_sqlite,
    idle_scale,
    median,
    percentile,
    proc_status,
    recreate_pg_database,
)


def system_url(db: str, name: str) -> str:
    if db == "sqlite":
        return f"sqlite:///{fresh_sqlite(name + '.sqlite')}"
    recreate_pg_database(name)
    return f"postgresql://postgres@127.0.0.1:5432/{name}"


SQLITE_SKIP = {
    "skipped": "DBOS 3.4 does not launch on this machine's SQLite 3.40 (its migration fails: "
    "NOT NULL constraint failed: application_versions.version_timestamp); the targets are "
    "measured on PostgreSQL"
}


def launch(url: str, **extra: Any) -> Any:
    from dbos import DBOS

    DBOS(
        config={"name": "kumiflow-bench", "system_database_url": url, "log_level": "ERROR", **extra}
    )
    return DBOS


def w1(db: str) -> dict[str, Any]:
    if db == "sqlite":
        return SQLITE_SKIP
    DBOS = launch(system_url(db, "dbos_bench_w1"))

    @DBOS.step()
    def inc(x: int) -> int:
        return x + 1

    @DBOS.workflow()
    def five(x: int) -> int:
        for _ in range(5):
            x = inc(x)
        return x

    DBOS.launch()
    for i in range(50):
        five(i)
    n = 1000
    start = time.perf_counter()
    for i in range(n):
        five(i)
    rate = n / (time.perf_counter() - start)
    DBOS.destroy()
    return {"workflows_per_s": round(rate, 1)}


def w2(db: str) -> dict[str, Any]:
    if db == "sqlite":
        return SQLITE_SKIP
    DBOS = launch(system_url(db, "dbos_bench_w2"))

    @DBOS.step()
    def inc(x: int) -> int:
        return x + 1

    @DBOS.workflow()
    def sleepy(x: int) -> float:
        inc(x)
        before = time.time()
        DBOS.sleep(2)
        late = time.time() - before - 2
        inc(x)
        return late * 1000

    DBOS.launch()
    n = 500
    start = time.perf_counter()
    handles = [DBOS.start_workflow(sleepy, i) for i in range(n)]
    lateness = [h.get_result() for h in handles]
    wall = time.perf_counter() - start
    DBOS.destroy()
    return {
        "completed": len(lateness) == n,
        "wall_minus_sleep_s": round(wall - 2.0, 3),
        "lateness_p50_ms": round(percentile(lateness, 50) or 0, 1),
        "lateness_p99_ms": round(percentile(lateness, 99) or 0, 1),
    }


def w3(db: str) -> dict[str, Any]:
    if db == "sqlite":
        return SQLITE_SKIP
    DBOS = launch(system_url(db, "dbos_bench_w3"))

    @DBOS.workflow()
    def waiter() -> float:
        DBOS.recv("signal", timeout_seconds=600)
        return time.perf_counter()

    DBOS.launch()
    n = 500
    handles = [DBOS.start_workflow(waiter) for _ in range(n)]
    time.sleep(3)  # every workflow is waiting in recv
    sent: dict[str, float] = {}
    first = time.perf_counter()
    for handle in handles:
        sent[handle.workflow_id] = time.perf_counter()
        DBOS.send(handle.workflow_id, 1, "signal")
    received = {h.workflow_id: h.get_result() for h in handles}
    total = time.perf_counter() - first
    latencies = [(received[k] - sent[k]) * 1000 for k in sent]
    DBOS.destroy()
    return {
        "completed": True,
        "all_complete_s": round(total, 3),
        "latency_p50_ms": round(percentile(latencies, 50) or 0, 2),
        "latency_p99_ms": round(percentile(latencies, 99) or 0, 2),
    }


def w4(db: str) -> dict[str, Any]:
    """DBOS's queue claim (``start_queued_workflows``), empty store vs 100,000
    finished workflows, nothing enqueued."""
    if db != "postgresql":
        return {"skipped": "measured on PostgreSQL only"}
    url = system_url("postgresql", "dbos_bench_w4")
    DBOS = launch(url)

    @DBOS.workflow()
    def noop() -> None:
        pass

    DBOS.launch()
    queue = DBOS.register_queue("bench")
    noop()
    from dbos._dbos import _get_dbos_instance
    from dbos._utils import GlobalParams

    sys_db = _get_dbos_instance()._sys_db

    def claim_ms() -> float:
        samples = []
        for _ in range(200):
            begin = time.perf_counter()
            sys_db.start_queued_workflows(
                queue, GlobalParams.executor_id, GlobalParams.app_version, None
            )
            samples.append((time.perf_counter() - begin) * 1000)
        return median(samples)

    empty = claim_ms()
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        columns = [
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = 'dbos' AND table_name = 'workflow_status' "
                "ORDER BY ordinal_position"
            )
        ]
        select = ", ".join(
            "s.workflow_uuid || '-' || g::text" if c == "workflow_uuid" else f"s.{c}"
            for c in columns
        )
        conn.execute(
            f"INSERT INTO dbos.workflow_status ({', '.join(columns)}) "
            f"SELECT {select} FROM dbos.workflow_status s, generate_series(1, 100000) g"
        )
        conn.execute("ANALYZE dbos.workflow_status")
    full = claim_ms()
    DBOS.destroy()
    return {
        "empty_claim_ms": round(empty, 3),
        "finished_100k_claim_ms": round(full, 3),
        "ratio": round(full / empty, 3),
    }


def w5(db: str) -> dict[str, Any]:
    if db == "sqlite":
        return SQLITE_SKIP
    url = system_url(db, "dbos_bench_w5")
    receiver = Receiver()
    effects = RESULTS / "dbos_w5_effects.log"
    effects.unlink(missing_ok=True)
    env = {
        **os.environ,
        "DBOS_URL": url,
        "BENCH_RECEIVER": receiver.url,
        "BENCH_EFFECTS": str(effects),
    }
    script = [sys.executable, str(ROOT / "bench" / "dbos_w5_app.py")]
    first = subprocess.Popen(
        [*script, "start"], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert first.stdout is not None
    while first.stdout.readline().strip() not in ("started", ""):
        pass  # until "started": all 200 are recorded before the kill
    import psycopg

    def succeeded() -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
            ).fetchone()
            return int(row[0]) if row else 0

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and succeeded() < 100:
        time.sleep(0.002)  # mid-way: the kill lands when half the workflows are done
    first.send_signal(signal.SIGKILL)
    first.wait()
    at_kill = succeeded()
    second = subprocess.run(
        [*script, "recover"], env=env, cwd=ROOT, timeout=300, capture_output=True, text=True
    )
    lines = effects.read_text().splitlines()
    from collections import Counter

    counts = Counter(lines)
    completed = int(second.stdout.strip().splitlines()[-1]) if second.returncode == 0 else 0
    return {
        "completed_when_killed": at_kill,
        "done_when_killed": round(at_kill / 200, 2),
        "runs_completed": completed,
        "runs_lost": 200 - completed,
        "side_effects_repeated": sum(1 for c in counts.values() if c > 1),
        "side_effects_missing": 600 - len(counts),
        "deliveries_distinct_keys": len(receiver.keys),
        "deliveries_repeated": sum(1 for c in receiver.keys.values() if c > 1),
        "deliveries_max_per_key": max(receiver.keys.values(), default=0),
    }


def _sleepers(db: str, n: int) -> dict[str, float]:
    url = system_url(db, f"dbos_bench_w6_{n}")
    env = {**os.environ, "DBOS_URL": url, "BENCH_SLEEPERS": str(n)}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "dbos_w6_app.py")],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        while proc.stdout.readline().strip() not in ("started", ""):
            pass
        time.sleep(8)
        return proc_status(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def w6(db: str) -> dict[str, Any]:
    if db == "sqlite":
        return SQLITE_SKIP
    small = _sleepers(db, 200)
    large = _sleepers(db, 20_000)
    return idle_scale(small, large)


def w7(db: str) -> dict[str, Any]:
    """500 workflows of one step that sleeps 200 ms, drained through a queue
    with 32 workers in this process (polled every 0.1 s, not DBOS's default 1 s)."""
    if db != "postgresql":
        return {"skipped": "measured on PostgreSQL"}
    DBOS = launch(system_url(db, "dbos_bench_w7"))

    @DBOS.step()
    def nap() -> int:
        time.sleep(0.2)
        return 1

    @DBOS.workflow()
    def napper() -> int:
        return nap()

    DBOS.launch()
    queue = DBOS.register_queue("bench_w7", worker_concurrency=32, polling_interval_sec=0.1)
    n = 500
    start = time.perf_counter()
    handles = [queue.enqueue(napper) for _ in range(n)]
    results = [h.get_result() for h in handles]
    wall = time.perf_counter() - start
    DBOS.destroy()
    return {"completed": results == [1] * n, "all_complete_s": round(wall, 3)}


def w8(db: str) -> dict[str, Any]:
    """One parent workflow starts 1,000 child workflows of one step each and
    waits for all of them."""
    if db != "postgresql":
        return {"skipped": "measured on PostgreSQL"}
    DBOS = launch(system_url(db, "dbos_bench_w8"))

    @DBOS.step()
    def inc(x: int) -> int:
        return x + 1

    @DBOS.workflow()
    def child(n: int) -> int:
        return inc(n)

    @DBOS.workflow()
    def parent() -> int:
        handles = [DBOS.start_workflow(child, n) for n in range(1000)]
        return len([h.get_result() for h in handles])

    DBOS.launch()
    start = time.perf_counter()
    count = parent()
    wall = time.perf_counter() - start
    DBOS.destroy()
    return {"completed": count == 1000, "all_complete_s": round(wall, 3)}


def _w9_drain(processes: int, n: int) -> dict[str, Any]:
    from bench.common import cpu_seconds, database_pids, machine_cpu

    name = f"dbos_bench_w9_{processes}"
    url = system_url("postgresql", name)
    effects = RESULTS / f"dbos_w9_effects_{processes}.log"
    effects.unlink(missing_ok=True)
    env = {**os.environ, "DBOS_URL": url, "BENCH_EFFECTS": str(effects)}
    script = [sys.executable, str(ROOT / "bench" / "dbos_w9_app.py")]
    subprocess.run([*script, "enqueue", str(n)], env=env, cwd=ROOT, check=True, capture_output=True)
    import psycopg

    def succeeded() -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
            ).fetchone()
            return int(row[0]) if row else 0

    machine = machine_cpu()
    workers = [
        subprocess.Popen([*script, "work"], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    try:
        assert workers[0].stdout is not None
        while workers[0].stdout.readline().strip() not in ("ready", ""):
            pass  # the first executor is up: it dequeues from now on
        began = time.perf_counter()
        server_before = {pid: cpu_seconds(pid) for pid in database_pids("postgresql", name)}
        workers_before = sum(cpu_seconds(w.pid) for w in workers)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and succeeded() < n:
            time.sleep(0.1)
        seconds = time.perf_counter() - began
        worker_cpu = sum(cpu_seconds(w.pid) for w in workers) - workers_before
        db_cpu = 0.0
        for pid in database_pids("postgresql", name):
            try:
                db_cpu += cpu_seconds(pid) - server_before.get(pid, 0.0)
            except OSError:
                pass
        busy, total = machine_cpu()
        rss = max(proc_status(w.pid)["VmHWM"] for w in workers)
        done = succeeded()
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
    from collections import Counter

    counts = Counter(effects.read_text().splitlines()) if effects.exists() else Counter()
    return {
        "runs_per_s": round(n / seconds, 1),
        "drain_s": round(seconds, 2),
        "completed": done == n,
        "exactly_once": len(counts) == 3 * n and set(counts.values()) == {1},
        "worker_cpu_s": round(worker_cpu, 1),
        "database_cpu_s": round(db_cpu, 1),
        "machine_busy": round((busy - machine[0]) / max(total - machine[1], 1e-9), 2),
        "worker_peak_rss_mb": round(rss, 1),
    }


def w9(db: str) -> dict[str, Any]:
    """The same 2,000 workflows on a DBOS queue, drained by 1, 2 and 4 executor
    processes (DBOS's way of sharing work between processes)."""
    if db != "postgresql":
        return {"skipped": "DBOS runs on PostgreSQL and SQLite, not MariaDB"}
    n = int(os.environ.get("BENCH_W9_RUNS") or 2000)
    counts = [int(x) for x in (os.environ.get("BENCH_W9_PROCESSES") or "1,2,4").split(",")]
    result: dict[str, Any] = {"runs": n, "cpus": os.cpu_count()}
    for processes in counts:
        for key, value in _w9_drain(processes, n).items():
            result[f"{key}_{processes}p"] = value
    one = result.get("runs_per_s_1p")
    if one:
        for processes in counts[1:]:
            result[f"speedup_{processes}p"] = round(result[f"runs_per_s_{processes}p"] / one, 2)
    result["exactly_once"] = all(result[f"exactly_once_{p}p"] for p in counts)
    result["worker_peak_rss_mb"] = max(result[f"worker_peak_rss_mb_{p}p"] for p in counts)
    return result


WORKLOADS = {
    "W1": w1,
    "W2": w2,
    "W3": w3,
    "W4": w4,
    "W5": w5,
    "W6": w6,
    "W7": w7,
    "W8": w8,
    "W9": w9,
}
