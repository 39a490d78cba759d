"""kumiflow-django's models: the event log and its projections."""

from kumiflow_django.models.cron import CronSchedule
from kumiflow_django.models.dispatch import Dispatch, DispatchStatus
from kumiflow_django.models.event import Event
from kumiflow_django.models.run import RunStatus, WorkflowRun

__all__ = ["CronSchedule", "Dispatch", "DispatchStatus", "Event", "RunStatus", "WorkflowRun"]
