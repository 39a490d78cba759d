"""kumiflow-django's models: the event log and its projections."""

from kumiflow_django.models.event import Event

__all__ = ["Event"]
