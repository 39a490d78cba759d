import atexit
import json
import os
from pathlib import Path

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    label = "bench"
    verbose_name = "Benchmark workflows"

    def ready(self) -> None:
        from bench import instrument

        instrument.install()  # only what the bench's environment asks for
        # A worker process the benchmark started counts its statements for
        # the whole of its life, and writes them down when it exits.
        directory = os.environ.get("BENCH_COUNT_DIR")
        if not directory or os.environ.get("BENCH_WORKER") != "1":
            return
        from bench.common import install_counter, tally

        install_counter(always=True)

        def write() -> None:
            statements, transactions = tally()
            path = Path(directory) / f"worker-{os.getpid()}.json"
            path.write_text(json.dumps({"statements": statements, "transactions": transactions}))

        atexit.register(write)
