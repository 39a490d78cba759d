"""W9 on DBOS: workflows of three steps with two 1 ms sleeps, on a queue.

``enqueue N`` puts N workflows on the queue (DBOS's client, no executor);
``work`` launches an executor that dequeues and runs them, prints
``ready`` and runs until it is killed. Each step appends one line to the
effects file (O_APPEND: lines of several processes do not mix), so the
benchmark counts how often each step ran.
"""

from __future__ import annotations

import os
import sys
import time

from dbos import DBOS, DBOSClient

URL = os.environ["DBOS_URL"]
EFFECTS = os.environ.get("BENCH_EFFECTS", "/dev/null")


def effect(key: str) -> None:
    with open(EFFECTS, "a") as f:
        f.write(key + "\n")


DBOS(
    config={
        "name": "kumiflow-bench-w9",
        "system_database_url": URL,
        "log_level": "ERROR",
        "executor_id": f"bench-w9-{os.getpid()}",
        "application_version": "w9",
    }
)
if __name__ == "__main__" and sys.argv[1] == "enqueue":
    DBOS.launch()  # creates DBOS's tables; no queue is registered here, so none is read
    DBOS.destroy()
    client = DBOSClient(system_database_url=URL)
    for i in range(int(sys.argv[2])):
        client.enqueue({"queue_name": "w9", "workflow_name": "w9", "app_version": "w9"}, i)
    client.destroy()
    print("enqueued", flush=True)
    raise SystemExit(0)


@DBOS.step()
def step(run: str, name: str) -> None:
    effect(f"{run}:{name}")


@DBOS.workflow(name="w9")
def w9(i: int) -> None:
    run = DBOS.workflow_id
    step(run, "1")
    DBOS.sleep(0.001)
    step(run, "2")
    DBOS.sleep(0.001)
    step(run, "3")


if __name__ == "__main__":
    DBOS.launch()
    DBOS.register_queue("w9")  # defaults: no concurrency limit, polled every second
    print("ready", flush=True)
    time.sleep(3600)
