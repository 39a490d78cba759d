"""``manage.py kumiflow_resume``: a thin shell over :class:`kumiflow_django.resume_loop.ResumeLoop`."""

from __future__ import annotations

from kumiflow_django.resume_loop import ResumeLoop
from kumiflow_django.management.loop_command import LoopCommand


class Command(LoopCommand):
    help = "Resume due workflow runs (timers over, awaited events arrived, retries due)."
    loop_class = ResumeLoop
