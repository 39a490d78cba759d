"""The engine's receiver of ``event_appended``: projections, wake-ups, triggers."""

from __future__ import annotations

from typing import Any

from kumiflow_django.definition.registry import registry
from kumiflow_django.engine import resuming, starting
from kumiflow_django.projections import user as projections
from kumiflow_django.store.models import Event


def on_event_appended(sender: Any, event: Event, **kwargs: Any) -> None:
    projections.apply_live(event)
    if resuming.is_awaited(event.type):
        resuming.wake_waiters(event)
    if registry.for_event(event.type):
        starting.start_triggered(event)
