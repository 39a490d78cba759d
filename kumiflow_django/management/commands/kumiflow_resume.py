"""``manage.py kumiflow_resume``: a thin shell over the resume loop class."""

from __future__ import annotations

from kumiflow_django.management.loop_command import LoopCommand
from kumiflow_django.workers.resume import ResumeLoop


class Command(LoopCommand):
    help = "Resume due workflow runs (timers over, awaited events arrived, retries due)."
    loop_class = ResumeLoop
