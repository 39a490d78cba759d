"""Signals sent by kumiflow-django.

``event_appended`` is sent once for every appended event, also for every
event of a batch append, inside the appending transaction and after the
insert: ``sender`` is the ``Event`` model, ``event`` the saved instance.
Workflow triggers, awaited-event wake-ups and user projections are receivers.
"""

from __future__ import annotations

from django.dispatch import Signal

event_appended = Signal()
