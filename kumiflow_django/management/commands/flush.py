"""``manage.py flush``, with the event log's erasure permit.

The event table refuses deletes in the database itself (see
:mod:`kumiflow_django.store.immutability`); emptying every table is an explicit
operator command, so it may empty the log too. Django's test cases flush
the database between transactional tests through this command.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands.flush import Command as FlushCommand

from kumiflow_django.definition.snapshots import forget
from kumiflow_django.store.immutability import erasure_permit


class Command(FlushCommand):
    def handle(self, **options: Any) -> None:
        with erasure_permit(options["database"]):
            super().handle(**options)
        forget()  # the definition snapshots are gone with the rest
