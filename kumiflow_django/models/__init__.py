"""kumiflow-django's models, where Django looks for them.

Each model lives in the room of its concept: the event log in
:mod:`kumiflow_django.store.models`, the projections beside their folds in
:mod:`kumiflow_django.projections`, the definitions runs started on in
:mod:`kumiflow_django.definition.snapshots` (and the worker processes
that serve them, :mod:`kumiflow_django.definition.serving`), the lock rows in
:mod:`kumiflow_django.store.locks`, flow control's rows in
:mod:`kumiflow_django.flow.models`.
"""

from kumiflow_django.definition.serving import WorkerProcess
from kumiflow_django.definition.snapshots import DefinitionSnapshot
from kumiflow_django.engine.bulk import BulkOperation
from kumiflow_django.flow.models import FlowKey, FlowLimit, RateBucket
from kumiflow_django.http.models import ApiToken
from kumiflow_django.projections.attributes import RunAttribute
from kumiflow_django.projections.dispatches import Dispatch, DispatchStatus
from kumiflow_django.projections.pauses import PausedScope
from kumiflow_django.projections.runs import Compensation, RunStatus, WorkflowRun
from kumiflow_django.projections.schedules import CronSchedule
from kumiflow_django.projections.tasks import StepTask, TaskStatus
from kumiflow_django.projections.waits import RunWait
from kumiflow_django.store.locks import ProcessLock
from kumiflow_django.store.models import Event

__all__ = [
    "ApiToken",
    "BulkOperation",
    "Compensation",
    "CronSchedule",
    "DefinitionSnapshot",
    "Dispatch",
    "DispatchStatus",
    "Event",
    "FlowKey",
    "FlowLimit",
    "PausedScope",
    "ProcessLock",
    "RunStatus",
    "RateBucket",
    "RunAttribute",
    "RunWait",
    "StepTask",
    "TaskStatus",
    "WorkerProcess",
    "WorkflowRun",
]
