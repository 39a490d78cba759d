"""W6 on DBOS: N workflows sleeping for an hour, in one process."""

from __future__ import annotations

import os
import time

from dbos import DBOS

DBOS(
    config={
        "name": "kumiflow-bench-w6",
        "system_database_url": os.environ["DBOS_URL"],
        "log_level": "ERROR",
    }
)


@DBOS.workflow()
def sleeper() -> None:
    DBOS.sleep(3600)


if __name__ == "__main__":
    DBOS.launch()
    for _ in range(int(os.environ["BENCH_SLEEPERS"])):
        DBOS.start_workflow(sleeper)
    print("started", flush=True)
    time.sleep(3600)
