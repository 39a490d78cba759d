"""The suite's workflows: one per moment a worker is cut off in.

Every step with an effect counts it in ``shop.Tally`` under ``<run id>:<step>``
(in the segment's transaction), so a repeated effect shows as a count of 2.
The first time the *victim* worker (``FAULTS_ROLE=victim``) reaches a gate,
it stops there until the harness releases it (see :func:`gate`): the fault
is injected while the victim holds that moment's transaction or attempt.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from django.db.models import F

from kumiflow_django import Limit, define_workflow, on_cron, on_event
from kumiflow_django import steps as s
from testproject.shop.models import Tally

#: Longest a gate holds a victim (the harness releases it much sooner).
GATE_BOUND = 300.0


def _dir() -> Path | None:
    name = os.environ.get("FAULTS_DIR")
    return Path(name) if name else None


def gate(what: str) -> None:
    """Hold the victim's first arrival here until the harness releases it.

    The marker file is created exclusively, so one thread of one victim is
    held, whatever runs it. ``FAULTS_GATE=lock``: wait instead for the row
    lock the harness holds on ``Tally(key="gate")`` (a statement that waits
    for a lock while the network is gone), then for the release file."""
    where = _dir()
    if where is None or os.environ.get("FAULTS_ROLE") != "victim":
        return
    try:
        fd = os.open(where / "entered", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, f"{what} {os.getpid()}\n".encode())
    os.close(fd)
    try:
        if os.environ.get("FAULTS_GATE") == "lock":
            list(Tally.objects.select_for_update().filter(key="gate"))
        deadline = time.monotonic() + GATE_BOUND
        while not (where / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        (where / "returned").write_text(what)


def count(key: str) -> None:
    tally, _ = Tally.objects.get_or_create(key=key)
    Tally.objects.filter(pk=tally.pk).update(count=F("count") + 1)


@s.handler("faults.effect")
def effect(payload: dict[str, Any]) -> str:
    """A step's database effect, counted; the gate comes after it, so a late
    commit of the victim would show as a second count."""
    count(payload["key"])
    gate(payload["key"])
    return os.environ.get("FAULTS_ROLE", "?")


def attempt(key: str) -> str:
    """A task step's function (outside any transaction): each execution counted."""
    count(key)
    gate(key)
    return os.environ.get("FAULTS_ROLE", "?")


def _key(step: str) -> Any:
    return lambda ctx: {"key": f"{ctx.run.id}:{step}"}


def _gated(name: str, **options: Any) -> Any:
    return define_workflow(
        name,
        start_mode="deferred",
        steps=[s.call("effect", "faults.effect", _key("effect"))],
        **options,
    )


segment = _gated("faults-segment")
flow = _gated(
    "faults-flow",
    trigger=on_event("faults.flow"),
    concurrency=Limit(key=lambda event: event.payload["key"], max=1),
)
cron = _gated(
    "faults-cron", trigger=on_cron(os.environ.get("FAULTS_CRON", "0 0 1 1 *"), misfire="latest")
)
task = define_workflow(
    "faults-task",
    start_mode="deferred",
    steps=[
        s.task(
            "work",
            attempt,
            args=lambda ctx: [f"{ctx.run.id}:task"],
            timeout=float(os.environ.get("FAULTS_LEASE", "4")),
            retry={"attempts": 3, "backoff": "fixed", "base": 0.2},
        ),
        s.call("after", "faults.effect", _key("after")),
    ],
)
child = define_workflow(
    "faults-child",
    steps=[
        s.call(
            "effect", "faults.effect", lambda ctx: {"key": f"{ctx.event.payload['parent']}:child"}
        )
    ],
)
parent = define_workflow(
    "faults-parent",
    start_mode="deferred",
    steps=[
        s.child("kid", "faults-child", input=lambda ctx: {"parent": str(ctx.run.id)}),
        s.call("after", "faults.effect", _key("after")),
    ],
)

# The failover's workload (W5-like): three counted segments, two short waits.
w5 = define_workflow(
    "faults-w5",
    start_mode="deferred",
    steps=[
        s.call("a", "faults.effect", _key("a")),
        s.wait("PT0.2S"),
        s.call("b", "faults.effect", _key("b")),
        s.wait("PT0.2S"),
        s.call("c", "faults.effect", _key("c")),
    ],
)
