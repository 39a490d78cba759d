"""kumiflow-django's models, where Django looks for them.

Each model lives in the room of its concept: the event log in
:mod:`kumiflow_django.store.models`, the projections beside their folds in
:mod:`kumiflow_django.projections`, the lock rows in :mod:`kumiflow_django.store.locks`.
"""

from kumiflow_django.projections.dispatches import Dispatch, DispatchStatus
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.projections.schedules import CronSchedule
from kumiflow_django.store.locks import ProcessLock
from kumiflow_django.store.models import Event

__all__ = [
    "CronSchedule",
    "Dispatch",
    "DispatchStatus",
    "Event",
    "ProcessLock",
    "RunStatus",
    "WorkflowRun",
]
