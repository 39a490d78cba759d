"""The benchmark's workflows (W1-W11), registered like any app's."""

from __future__ import annotations

import os
import time

from kumiflow_django import Limit, define_workflow, on_event
from kumiflow_django import steps as s


def _inc(ctx):
    return ctx.event.payload.get("n", 0) + 1


w1 = define_workflow(
    "bench-w1",
    trigger=on_event("bench.w1"),
    steps=[s.compute(f"step{i}", _inc) for i in range(5)],
)

# W1-limited: W1 with a concurrency limit on a per-run key (no run ever waits).
w1_limited = define_workflow(
    "bench-w1-limited",
    trigger=on_event("bench.w1l"),
    concurrency=Limit(key=lambda event: event.stream_id, max=1),
    steps=[s.compute(f"step{i}", _inc) for i in range(5)],
)

w2 = define_workflow(
    "bench-w2",
    steps=[s.compute("before", _inc), s.wait("PT2S"), s.compute("after", _inc)],
)

w3 = define_workflow(
    "bench-w3",
    trigger=on_event("bench.w3.start"),
    steps=[
        s.wait_for_event(
            "bench.w3.signal",
            match={"payload.key": lambda ctx: ctx.event.payload["key"]},
            timeout="PT10M",
            name="signal",
        ),
        s.compute("done", _inc),
    ],
)

w5 = define_workflow(
    "bench-w5",
    trigger=on_event("bench.w5"),
    start_mode="deferred",
    steps=[
        s.call(None, "shop.count", lambda ctx: {"key": f"{ctx.run.id}:a"}),
        s.call(None, "shop.count", lambda ctx: {"key": f"{ctx.run.id}:b", "sleep": 0.01}),
        s.wait("PT1S"),
        s.call(None, "shop.count", lambda ctx: {"key": f"{ctx.run.id}:c", "sleep": 0.01}),
        s.webhook_send(
            lambda ctx: os.environ.get("BENCH_RECEIVER", "http://127.0.0.1:9/"),
            body=lambda ctx: {"run": str(ctx.run.id)},
        ),
    ],
)

w6 = define_workflow("bench-w6", steps=[s.wait("PT1H"), s.return_(None)])


def nap() -> int:
    """W7's task: 200 ms of waiting on something outside the database."""
    time.sleep(0.2)
    return 1


w7 = define_workflow(
    "bench-w7",
    steps=[s.task("napped", nap, timeout=30), s.return_(lambda ctx: ctx.steps["napped"])],
)


w8_child = define_workflow("bench-w8-child", steps=[s.compute("one", _inc)])

w8 = define_workflow(
    "bench-w8",
    steps=[
        s.for_each(
            lambda ctx: list(range(1000)),
            "i",
            do=[s.child("done", "bench-w8-child", input=lambda ctx: {"n": ctx.scope["i"]})],
            parallel=True,
            name="children",
        ),
        s.return_(lambda ctx: len(ctx.steps["children"])),
    ],
)
# W9: three segments, each with a side effect counted in the database; the
# waits of 1 ms are due at once (a wait of zero does not suspend at all).
w9 = define_workflow(
    "bench-w9",
    start_mode="deferred",
    steps=[
        s.call(None, "shop.count", lambda ctx: {"key": f"{ctx.run.id}:1"}),
        s.wait("PT0.001S"),
        s.call(None, "shop.count", lambda ctx: {"key": f"{ctx.run.id}:2"}),
        s.wait("PT0.001S"),
        s.call(None, "shop.count", lambda ctx: {"key": f"{ctx.run.id}:3"}),
    ],
)

# W10/W11: the template of the history loaded in bulk: a trigger event and
# four run events (started, waiting, resumed, completed) per run. Its search
# attributes are placeholders: bench/history.py gives each clone its own
# customer (1,000 runs each in a million) and tier (a quarter of the runs each).
w10 = define_workflow(
    "bench-w10",
    trigger=on_event("bench.w10"),
    attributes={"customer": "C-TEMPLATE", "tier": "T-TEMPLATE"},
    steps=[s.compute("before", _inc), s.wait("PT1M"), s.compute("after", _inc)],
)
