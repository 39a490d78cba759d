"""What a benchmark's worker process measures of itself, switched on by the
environment the bench sets (nothing is installed otherwise):

- ``BENCH_TX_TRACE=path``: every outermost transaction's duration, by the
  engine function that opened it (the first frame in ``kumiflow_django``
  outside ``store/db.py``), written to ``path`` as JSON when the process exits:
  which code a long transaction belongs to, with its p50, p99 and max.
- ``BENCH_PROCESS_PROFILE=path``: a cProfile of the whole process (every thread),
  written to ``path`` (pstats) when it exits: where a worker spends its CPU.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

_ENGINE = os.sep + "kumiflow_django" + os.sep
_SKIP = (os.sep + "store" + os.sep + "db.py", "contextlib.py")


def install() -> None:
    trace = os.environ.get("BENCH_TX_TRACE")
    if trace:
        _trace_transactions(Path(trace))
    profile = os.environ.get("BENCH_PROCESS_PROFILE")
    if profile:
        _profile(Path(profile))


def _site() -> str:
    frame = sys._getframe(3)
    while frame is not None:
        name = frame.f_code.co_filename
        if _ENGINE in name and not name.endswith(_SKIP):
            module = name[name.index(_ENGINE) + 1 : -3].replace(os.sep, ".")
            return f"{module}.{frame.f_code.co_qualname}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def _trace_transactions(path: Path) -> None:
    from django.db import transaction

    local = threading.local()
    durations: dict[str, list[tuple[float, float]]] = {}
    lock = threading.Lock()
    enter, exit_ = transaction.Atomic.__enter__, transaction.Atomic.__exit__

    def traced_enter(self: Any) -> None:
        conn = transaction.get_connection(self.using)
        stack = local.__dict__.setdefault("stack", [])
        outer = not conn.in_atomic_block
        stack.append((_site(), time.perf_counter(), time.thread_time()) if outer else None)
        enter(self)

    def traced_exit(self: Any, *exc: Any) -> None:
        try:
            exit_(self, *exc)
        finally:
            opened = local.stack.pop()
            if opened is not None:
                site, began, cpu = opened
                wall, cpu = time.perf_counter() - began, time.thread_time() - cpu
                with lock:
                    durations.setdefault(site, []).append((wall * 1000, cpu * 1000))

    transaction.Atomic.__enter__ = traced_enter  # type: ignore[method-assign]
    transaction.Atomic.__exit__ = traced_exit  # type: ignore[method-assign,assignment]

    def dump() -> None:
        with lock:
            path.write_text(json.dumps(durations))

    atexit.register(dump)


def _profile(path: Path) -> None:
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()

    def dump() -> None:
        profiler.disable()
        profiler.dump_stats(str(path))

    atexit.register(dump)


def summary(durations: dict[str, list[list[float]]], top: int = 8) -> dict[str, dict[str, float]]:
    """Per site of the longest transactions: how many, and the p50, p99 and max
    of their wall time and of the CPU time of their thread (ms). Wall well
    above CPU is waiting: for the database, or for the GIL."""

    def at(ordered: list[float], q: float) -> float:
        return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 1)

    out = {}
    for site, values in sorted(durations.items(), key=lambda kv: -max(w for w, _ in kv[1]))[:top]:
        wall = sorted(w for w, _ in values)
        cpu = sorted(c for _, c in values)
        out[site] = {"count": len(values)} | {
            f"{name}_{label}": at(ordered, q)
            for name, ordered in (("wall", wall), ("cpu", cpu))
            for label, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))
        }
    return out
