"""``manage.py kumiflow_cron``: a thin shell over the cron loop class."""

from __future__ import annotations

from kumiflow_django.management.loop_command import LoopCommand
from kumiflow_django.workers.cron import CronLoop


class Command(LoopCommand):
    help = "Fire due cron schedules, each occurrence exactly once."
    loop_class = CronLoop
