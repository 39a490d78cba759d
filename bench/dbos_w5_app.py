"""W5 on DBOS: 200 workflows of 3 side-effecting steps, a 1 s sleep and a webhook.

``start`` starts them (and is killed by the benchmark mid-way); ``recover``
launches the same application again, which recovers the pending workflows,
waits for all 200, and prints how many completed.
"""

from __future__ import annotations

import os
import sys
import time

import requests
from dbos import DBOS

DBOS(
    config={
        "name": "kumiflow-bench-w5",
        "system_database_url": os.environ["DBOS_URL"],
        "log_level": "ERROR",
        "executor_id": "bench-w5",
        "application_version": "w5",
    }
)
EFFECTS = os.environ["BENCH_EFFECTS"]


def effect(key: str) -> None:
    with open(EFFECTS, "a") as f:  # an effect outside the checkpoint, like an API call
        f.write(key + "\n")


@DBOS.step()
def side_effect(run: str, name: str) -> None:
    time.sleep(0.01)
    effect(f"{run}:{name}")


@DBOS.step()
def webhook(run: str) -> None:
    requests.post(
        os.environ["BENCH_RECEIVER"],
        json={"run": run},
        headers={"Idempotency-Key": run},
        timeout=10,
    ).raise_for_status()


@DBOS.workflow()
def w5(i: int) -> None:
    run = DBOS.workflow_id
    side_effect(run, "a")
    side_effect(run, "b")
    DBOS.sleep(1)
    side_effect(run, "c")
    webhook(run)


if __name__ == "__main__":
    DBOS.launch()
    if sys.argv[1] == "start":
        for i in range(200):
            DBOS.start_workflow(w5, i)
        print("started", flush=True)
        time.sleep(600)
    else:
        deadline = time.monotonic() + 240
        done = 0
        while time.monotonic() < deadline:
            done = len(DBOS.list_workflows(status="SUCCESS", name="w5"))
            if done >= 200:
                break
            time.sleep(0.2)
        print(done, flush=True)
        DBOS.destroy()
