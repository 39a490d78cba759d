"""The admin, the operator console: the overview, runs, the event log, the
outbox, the cron schedules and flow control (:mod:`.flow`).

Nothing is edited in place; changes happen only through the operations
(:mod:`kumiflow_django.engine.operations`, ``redeliver``/``cancel_dispatch``,
``kumiflow_django.cron.schedules``, ``append_event``), each behind its own
permission and a confirmation page (:mod:`.confirm`), each recorded with the
operator and a reason. A run's page is gathered in :mod:`.run_page` (its
picture in :mod:`.picture`, its branches, task attempts and child runs in
:mod:`.structure`, its timeline in :mod:`.timeline`); the overview
in :mod:`.overview`; search in :mod:`.search`.
"""

from kumiflow_django.admin.dispatches import DispatchAdmin
from kumiflow_django.admin.events import EventAdmin
from kumiflow_django.admin.flow import FlowKeyAdmin, FlowLimitAdmin, RateBucketAdmin
from kumiflow_django.admin.pauses import PausedScopeAdmin
from kumiflow_django.admin.runs import WorkflowRunAdmin
from kumiflow_django.admin.schedules import CronScheduleAdmin
from kumiflow_django.admin.workers import WorkerProcessAdmin

__all__ = [
    "CronScheduleAdmin",
    "DispatchAdmin",
    "EventAdmin",
    "FlowKeyAdmin",
    "FlowLimitAdmin",
    "PausedScopeAdmin",
    "RateBucketAdmin",
    "WorkerProcessAdmin",
    "WorkflowRunAdmin",
]
