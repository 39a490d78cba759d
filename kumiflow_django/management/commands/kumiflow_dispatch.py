"""``manage.py kumiflow_dispatch``: a thin shell over the dispatch loop class."""

from __future__ import annotations

from kumiflow_django.management.loop_command import LoopCommand
from kumiflow_django.workers.dispatch import DispatchLoop


class Command(LoopCommand):
    help = "Deliver the outbox: mails, webhooks and registered dispatch kinds."
    loop_class = DispatchLoop
