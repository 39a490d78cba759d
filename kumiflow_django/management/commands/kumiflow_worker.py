"""``manage.py kumiflow_worker``: the resume, dispatch, cron and task loops in one process."""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import autoreload

from kumiflow_django.conf import settings
from kumiflow_django.management.loop_command import (
    configure_logging,
    non_negative_int,
    positive_float,
    positive_int,
    run_until_signalled,
)
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.workers.worker import Service, Worker

logger = get_logger("kumiflow_django.worker")

try:  # kumiflow-django[metrics]: the worker runs without it
    from kumiflow_django.observability import metrics
except ImportError:
    metrics = None  # type: ignore[assignment]


def port(text: str) -> int:
    value = positive_int(text) if text != "0" else 0
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a port: {value}")
    return value


class Command(BaseCommand):
    help = (
        "Run the resume, dispatch, cron and task loops in one process. SIGINT/SIGTERM "
        "finish the work at hand and exit 0; a second signal exits at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--once", action="store_true", help="One batch of each loop, then exit."
        )
        parser.add_argument("--no-resume", action="store_true", help="Do not resume runs.")
        parser.add_argument("--no-dispatch", action="store_true", help="Do not deliver the outbox.")
        parser.add_argument("--no-cron", action="store_true", help="Do not fire cron schedules.")
        parser.add_argument(
            "--no-tasks",
            action="store_true",
            help="No task loop (run kumiflow_tasks elsewhere: something must give up "
            "task attempts whose lease ran out).",
        )
        parser.add_argument(
            "--task-threads",
            type=non_negative_int,
            default=None,
            help="Threads of the task pool (default: KUMIFLOW_TASK_THREADS; 0: run no "
            "task functions here, only keep time for them).",
        )
        parser.add_argument("--batch-size", type=positive_int, default=None)
        parser.add_argument("--max-interval", type=positive_float, default=None)
        parser.add_argument(
            "--worker-id", default=None, help="Name in leases and logs (default: host:pid:random)."
        )
        parser.add_argument(
            "--reload",
            action="store_true",
            help="Restart the worker when a Python file changes (Django's autoreloader, "
            "as runserver does): for development.",
        )
        parser.add_argument(
            "--metrics-port",
            type=port,
            default=None,
            help="Serve Prometheus metrics on this port (0: any free one; the log says which).",
        )
        parser.add_argument(
            "--metrics-host",
            default="127.0.0.1",
            help="Address of the metrics endpoint (default: 127.0.0.1; 0.0.0.0 for all).",
        )

    def handle(
        self,
        *args: Any,
        once: bool = False,
        no_resume: bool = False,
        no_dispatch: bool = False,
        no_cron: bool = False,
        no_tasks: bool = False,
        task_threads: int | None = None,
        batch_size: int | None = None,
        max_interval: float | None = None,
        worker_id: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        reload: bool = False,
        verbosity: int = 1,
        **options: Any,
    ) -> None:
        configure_logging(verbosity, self.stdout)
        if worker_id is not None and not 0 < len(worker_id) <= 64:
            raise CommandError("--worker-id must have 1 to 64 characters")
        if reload and once:
            raise CommandError("--reload restarts a running worker, not --once")
        if reload and metrics_port is not None:
            raise CommandError("--metrics-port serves a deployed worker, not --reload")
        services: list[Service] = []
        if metrics_port is not None:
            if once:
                raise CommandError("--metrics-port serves a running worker, not --once")
            services.append(metrics_server(metrics_host, metrics_port))
        try:
            worker = Worker(
                resume=not no_resume,
                dispatch=not no_dispatch,
                cron=not no_cron,
                tasks=not no_tasks,
                task_threads=task_threads,
                batch_size=batch_size or settings.RESUME_BATCH_SIZE,
                max_interval=max_interval or settings.MAX_INTERVAL,
                worker_id=worker_id,
                services=services,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if once:
            for name, handled in worker.run_once().items():
                self.stdout.write(f"{name}: {handled}")
            return
        if reload:
            # Ctrl-C reaches both processes: the one that restarts waits for the
            # worker to stop cleanly (it would kill it otherwise).
            restarter = os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) != "true"
            signal.signal(
                signal.SIGINT, signal.SIG_IGN if restarter else signal.default_int_handler
            )
            autoreload.run_with_reloader(reloading, worker)
            return
        run_until_signalled(worker.run, worker.stop)
        if worker.crashed:
            raise CommandError("a loop crashed (see the log); the worker stopped")


def reloading(worker: Worker) -> None:
    """The worker under Django's autoreloader (in a thread of the child process
    it restarts). A changed file, and the end of the process (Ctrl-C), first
    stop the worker cleanly: the work at hand is finished and its heartbeat
    row deleted, so the restarted worker is the only one serving."""
    stopped = threading.Event()

    def stop(**kwargs: Any) -> None:
        worker.stop()
        stopped.wait(settings.LEASE_SECONDS)

    autoreload.file_changed.connect(stop, weak=False)  # before the reload
    atexit.register(stop)
    logger.info("worker %s: restarts when the code changes", worker.worker_id)
    try:
        run_until_signalled(worker.run, worker.stop, signals=False)
    finally:
        stopped.set()


def metrics_server(host: str, port: int) -> Service:
    if metrics is None:
        raise CommandError(
            "--metrics-port needs prometheus-client: pip install 'kumiflow-django[metrics]'"
        )
    try:
        return metrics.MetricsServer(host, port)
    except RuntimeError as exc:  # switched off
        raise CommandError(str(exc)) from exc
    except OSError as exc:
        raise CommandError(f"--metrics-port: cannot listen on {host}:{port}: {exc}") from exc
