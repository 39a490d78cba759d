"""The admin: runs, the event log, the outbox and the cron schedules.

Everything is read-only; changes happen only through the operations
(:mod:`kumiflow_django.engine.operations`, ``redeliver``/``cancel_dispatch``,
``kumiflow_django.cron.schedules``), each behind its own permission.
"""

from kumiflow_django.admin.dispatches import DispatchAdmin
from kumiflow_django.admin.events import EventAdmin
from kumiflow_django.admin.runs import WorkflowRunAdmin
from kumiflow_django.admin.schedules import CronScheduleAdmin

__all__ = ["CronScheduleAdmin", "DispatchAdmin", "EventAdmin", "WorkflowRunAdmin"]
