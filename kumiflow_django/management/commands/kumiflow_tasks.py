"""``manage.py kumiflow_tasks``: only the task loop, so task capacity scales apart."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from kumiflow_django.management.loop_command import LoopCommand, non_negative_int
from kumiflow_django.workers.loop import Loop
from kumiflow_django.workers.tasks import TaskLoop


class Command(LoopCommand):
    help = (
        "Run task steps' functions on kumiflow's task pool (and give up attempts whose "
        "lease ran out), apart from the resume loop: start as many as the tasks need."
    )
    loop_class = TaskLoop

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--threads",
            type=non_negative_int,
            default=None,
            help="Threads of the pool (default: KUMIFLOW_TASK_THREADS).",
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            default=None,
            help="Run only the tasks of this queue (repeat for several; default: every queue).",
        )
        parser.add_argument(
            "--worker-id", default=None, help="Name in leases and logs (default: host:pid:random)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.threads = options.pop("threads", None)
        self.queues = options.pop("queues", None)
        self.worker_id = options.pop("worker_id", None)
        if self.worker_id is not None and not 0 < len(self.worker_id) <= 64:
            raise CommandError("--worker-id must have 1 to 64 characters")
        super().handle(*args, **options)

    def make_loop(self, batch_size: int, max_interval: float) -> Loop:
        return TaskLoop(
            threads=self.threads,
            queues=self.queues,
            worker_id=self.worker_id,
            batch_size=batch_size,
            max_interval=max_interval,
        )
