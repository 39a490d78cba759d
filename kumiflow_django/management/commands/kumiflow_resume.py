"""``manage.py kumiflow_resume``: a thin shell over the resume loop class."""

from __future__ import annotations

from kumiflow_django.management.loop_command import LoopCommand
from kumiflow_django.workers.loop import Loop
from kumiflow_django.workers.resume import ResumeLoop


class Command(LoopCommand):
    help = "Resume due workflow runs (timers over, awaited events arrived, retries due)."
    loop_class = ResumeLoop

    def make_loop(self, batch_size: int, max_interval: float) -> Loop:
        # A worker process: it takes runs over only once every live one announced itself.
        return ResumeLoop(batch_size=batch_size, max_interval=max_interval, settle_takeovers=True)
