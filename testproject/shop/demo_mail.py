"""The demo's email backend: one line per mail, dated by the engine's clock.

The console backend prints the whole message with the wall clock's Date
header: in a story told on a fast-forwarded clock, day 8's mail was dated
today like day 0's. This backend dates each message by the clock the runs
keep (kumiflow's, the demo's virtual clock while it runs) and hands it to
the demo, which tells it in one line. Only ``manage.py demo`` uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from email.utils import format_datetime
from typing import ClassVar

from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.message import EmailMessage

from kumiflow_django.store import clock


class StoryBackend(BaseEmailBackend):
    #: Set by the demo: told each message and the time it was sent.
    tell: ClassVar[Callable[[EmailMessage, datetime], None] | None] = None

    def send_messages(self, email_messages: Sequence[EmailMessage]) -> int:
        now = clock.now()
        for message in email_messages:
            message.extra_headers["Date"] = format_datetime(now)
            message.message()  # built as a real backend would: a bad header fails here
            if StoryBackend.tell is not None:
                StoryBackend.tell(message, now)
        return len(email_messages)
