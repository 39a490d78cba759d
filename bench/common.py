"""Helpers shared by the benchmark's workloads."""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def pg_url(database: str) -> str:
    return f"postgres://postgres@127.0.0.1:5432/{database}"


def recreate_pg_database(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def fresh_sqlite(filename: str) -> Path:
    """The path of a SQLite database file that does not exist (yet)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / filename
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


def recreate_mariadb_database(name: str) -> None:
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()


def database_url(db: str, name: str) -> str:
    """A fresh database for one workload (``BENCH_DB_PREFIX`` keeps benchmarks
    that share a PostgreSQL server apart)."""
    name = os.environ.get("BENCH_DB_PREFIX", "") + name
    if db == "sqlite":
        return f"sqlite:///{fresh_sqlite(name + '.sqlite3')}"
    if db == "mysql":
        recreate_mariadb_database(name)
        return f"mysql://root@127.0.0.1:3306/{name}"
    recreate_pg_database(name)
    return pg_url(name)


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    sys.path.insert(0, str(ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    install_counter()  # counts only inside ``counting`` blocks


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def proc_status(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM (MB) and Threads of a process, from /proc."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
        elif key == "Threads":
            values[key] = int(rest)
    return values


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all CPUs."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(values) - idle) / tick, sum(values) / tick


def database_pids(vendor: str, name: str) -> list[int]:
    """The server processes doing this database's work: PostgreSQL's backends
    connected to it; MariaDB's one server process (shared by every database)."""
    if vendor == "postgresql":
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [name])
            return [int(pid) for (pid,) in rows]
    if vendor == "mysql":
        out = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
        return [
            int(p.name)
            for p in out
            if (p / "comm").exists() and (p / "comm").read_text().strip() == "mariadbd"
        ]
    return []


def release_freed_memory() -> None:
    """Give memory this process freed back to the system (glibc keeps it
    otherwise), so a peak measured next is not the leftovers of a bulk load."""
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def clear_peak_rss() -> None:
    """Start this process's peak RSS (VmHWM) afresh from its current RSS (Linux 4.0+)."""
    Path("/proc/self/clear_refs").write_text("5")


def emit(result: dict[str, Any]) -> None:
    result.setdefault("peak_rss_mb", round(peak_rss_mb(), 1))
    print(json.dumps(result), flush=True)


class Receiver:
    """A webhook receiver on loopback that counts idempotency keys."""

    def __init__(self) -> None:
        self.keys: Counter[str] = Counter()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.keys[self.headers.get("Idempotency-Key", "?")] += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"


def idle_scale(small: dict[str, float], large: dict[str, float]) -> dict[str, Any]:
    """W6's result from /proc readings with 200 and with 20,000 sleeping runs."""
    return {
        "worker_rss_mb_200": round(small["VmHWM"], 1),
        "worker_rss_mb_20000": round(large["VmHWM"], 1),
        "worker_threads_200": int(small["Threads"]),
        "worker_threads_20000": int(large["Threads"]),
        "memory_growth": round(large["VmHWM"] / small["VmHWM"] - 1, 3),
    }


# -- statements per segment ------------------------------------------------------
#
# Counted by Django's own SQL layer: an ``execute_wrapper`` on every connection
# of the process (every statement a cursor sends, SAVEPOINT and RELEASE
# included), and ``commit()`` wrapped for the transactions (the driver's BEGIN
# and COMMIT, which no cursor sends: two more round trips each on PostgreSQL
# and MariaDB). The wrapper adds an attribute test and an integer increment to
# each statement (well under a microsecond, against 50-300 µs per statement),
# and counts only inside :func:`counting` blocks (a worker process: always).

#: Per connection: [statements, transactions] (each connection is one thread's).
_tallies: list[list[int]] = []
_counting = {"on": False}
#: The events that open a segment: every segment writes exactly one of them.
SEGMENT_OPENERS = (
    "kumiflow.workflow.run-started",
    "kumiflow.workflow.step.resumed",
    "kumiflow.workflow.run-admitted",
)
COUNT_DIR = "BENCH_COUNT_DIR"


def _instrument(connection: Any) -> None:
    if getattr(connection, "_bench_tally", None) is not None:
        return
    tally = [0, 0]
    _tallies.append(tally)
    connection._bench_tally = tally

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if _counting["on"]:
            tally[0] += 1
        return execute(sql, params, many, context)

    commit = connection.commit

    def counted_commit() -> None:
        if _counting["on"]:
            tally[1] += 1
        commit()

    connection.execute_wrappers.append(count)
    connection.commit = counted_commit


def install_counter(always: bool = False) -> None:
    """Count this process's statements (on every connection, now and later)."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    for connection in connections.all(initialized_only=True):
        _instrument(connection)
    connection_created.connect(lambda sender, connection, **kw: _instrument(connection), weak=False)
    if always:
        _counting["on"] = True


def tally() -> tuple[int, int]:
    return sum(t[0] for t in _tallies), sum(t[1] for t in _tallies)


class counting:  # noqa: N801 - used as a context manager
    """Count the statements and transactions of a block, and the segments
    written meanwhile (by any process: the log's segment-opening events)."""

    def __enter__(self) -> counting:
        from kumiflow_django.store.models import Event

        self._position = (
            Event.objects.order_by("-position").values_list("position", flat=True).first() or 0
        )
        self._began = tally()
        _counting["on"] = True
        return self

    def __exit__(self, *exc: object) -> None:
        _counting["on"] = False
        statements, transactions = tally()
        self.statements = statements - self._began[0]
        self.transactions = transactions - self._began[1]

    def segments(self) -> int:
        from kumiflow_django.store.models import Event

        return Event.objects.filter(position__gt=self._position, type__in=SEGMENT_OPENERS).count()


def workers_counted(directory: str) -> tuple[int, int]:
    """The statements and transactions the worker processes counted (each
    writes its own file at exit, see bench/apps.py)."""
    statements = transactions = 0
    for path in Path(directory).glob("worker-*.json"):
        counted = json.loads(path.read_text())
        statements += counted["statements"]
        transactions += counted["transactions"]
    return statements, transactions


def per_segment(statements: int, transactions: int, segments: int, **extra: Any) -> dict[str, Any]:
    """The JSON fields of a workload's counts."""
    return {
        "segments": segments,
        "statements": statements,
        "statements_per_segment": round(statements / segments, 2) if segments else None,
        "transactions_per_segment": round(transactions / segments, 2) if segments else None,
        **extra,
    }
