"""Runs: one row per run (``WorkflowRun``), a projection of the run's stream.

The row is what the loops query (due runs, runs waiting for an event); the
stream is the truth. :func:`apply` is the fold: how each run event changes
the row. One pure function serves both the engine (which applies a
segment's events to the row in memory before writing it once) and
``kumiflow_rebuild`` (which replays the log), so the live table and a
rebuilt one cannot disagree.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from kumiflow_django.definition.attributes import check_name, check_value, merged
from kumiflow_django.definition.context import new_state
from kumiflow_django.definition.durations import parse_instant
from kumiflow_django.projections import attributes as attribute_index
from kumiflow_django.projections.pauses import ScopeKind, paused_names
from kumiflow_django.projections.stream import Stream
from kumiflow_django.store import limits
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl
from kumiflow_django.store.indexes import SetIndex
from kumiflow_django.store.models import EngineManager, Event


class RunStatus(models.TextChoices):
    #: Not admitted yet: a concurrency limit, a rate or a debounce holds it.
    QUEUED = "queued", _("queued")
    PENDING = "pending", _("pending")
    RUNNING = "running", _("running")
    WAITING = "waiting", _("waiting")
    WAITING_EVENT = "waiting_event", _("waiting for event")
    RETRY_SCHEDULED = "retry_scheduled", _("retry scheduled")
    COMPLETED = "completed", _("completed")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")


class Compensation(models.TextChoices):
    RUNNING = "running", _("compensating")
    COMPENSATED = "compensated", _("compensated")
    FAILED = "compensation_failed", _("compensation failed")


#: A run in one of these states continues when its ``wake_at`` has come.
SUSPENDED = (
    RunStatus.QUEUED,
    RunStatus.PENDING,
    RunStatus.WAITING,
    RunStatus.WAITING_EVENT,
    RunStatus.RETRY_SCHEDULED,
)
FINISHED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
#: The cursor of a run that runs its compensations: ``[COMPENSATE, k, ...]``
#: is the k-th compensation (the last completed step's first).
COMPENSATE = "$compensate"


class WorkflowRunQuerySet(models.QuerySet["WorkflowRun", "WorkflowRun"]):
    def due(self, now: object) -> WorkflowRunQuerySet:
        """Runs whose wake time has come, read from the ``wake_at`` index alone.

        Only suspended runs have a wake time (the projection clears it on every
        other state), so no status filter is needed, and none is added: it
        would tempt the planner into the status index. The number of finished
        runs therefore does not matter. Callers re-check the status under lock.
        Paused runs, and the runs of a paused workflow or tenant, are left out
        (:meth:`claimable`).
        """
        return self.claimable().filter(wake_at__lte=now)

    def claimable(self) -> WorkflowRunQuerySet:
        """Runs a worker may claim: not paused, nor in a paused workflow or
        tenant (two small subqueries of ``PausedScope``; the resume under the
        run's lock checks again: ``engine.pausing.held``)."""
        return (
            self.filter(paused=False)
            .exclude(workflow__in=paused_names(ScopeKind.WORKFLOW))
            .exclude(tenant_id__in=paused_names(ScopeKind.TENANT))
        )

    def finished(self) -> WorkflowRunQuerySet:
        return self.filter(status__in=FINISHED)

    def with_attribute(self, **values: str | int | bool) -> WorkflowRunQuerySet:
        """Runs whose search attributes have these values
        (``with_attribute(customer="C-17")``), through the attribute index.

        Values compare as the index stores them (text: ``17`` and ``"17"``
        are the same, ``True`` is ``"true"``).
        """
        qs = self
        for name, value in values.items():
            check_name(name)
            if value is None or check_value(name, value) is None:
                raise ValueError(
                    f"search attribute {name!r}: a filter compares a string, an integer or "
                    "a boolean, not None"
                )
            qs = qs.filter(id__in=attribute_index.matching(name, value))
        return qs


class WorkflowRun(models.Model):
    id = models.UUIDField(_("run id"), primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(_("tenant"), max_length=limits.TENANT)
    workflow = models.CharField(_("workflow"), max_length=limits.WORKFLOW_NAME)
    workflow_version = models.CharField(
        _("workflow version"), max_length=limits.WORKFLOW_VERSION, blank=True
    )
    fingerprint = models.CharField(_("definition fingerprint"), max_length=64)
    #: The version the run started on: ``workflow_version`` follows the run
    #: when a deploy carries it on to another definition; this one never moves
    #: (resolvers read it as ``ctx.run.started_version``).
    started_version = models.CharField(
        _("started on version"), max_length=limits.WORKFLOW_VERSION, blank=True
    )
    status = models.CharField(_("status"), max_length=20, choices=RunStatus.choices)
    start_mode = models.CharField(_("start mode"), max_length=10, default="inline")
    cursor = models.JSONField(_("cursor"), null=True, blank=True)
    state = models.JSONField(_("state"), default=dict)
    trail = models.JSONField(_("steps run"), default=list)
    wake_at = models.DateTimeField(_("wake at"), null=True, blank=True)
    # What the run waits for is in its ``RunWait`` rows (projections.waits),
    # whether it waits in one place or in its branches.
    since_position = models.BigIntegerField(_("started at position"), default=0)
    # Positions at or below ``since_position`` that were not visible when the
    # run started (transactions still open then): their events, once
    # committed, count as "after the start" too. See matching.gaps_below().
    since_gaps = models.JSONField(_("positions in flight at the start"), null=True, blank=True)
    # Not the wait but where the run resumes: the event that satisfied its
    # wait, recorded for the resume loop (``event-matched``) or by a refused
    # segment, until the run resumes.
    matched_position = models.BigIntegerField(_("matched event"), null=True, blank=True)
    attempt = models.PositiveIntegerField(_("attempt"), default=1)
    last_error = models.TextField(_("last error"), blank=True)
    reason = models.CharField(_("reason"), max_length=limits.REASON, blank=True)
    result = models.JSONField(_("result"), null=True, blank=True)
    input = models.JSONField(_("input"), null=True, blank=True)
    trigger_type = models.CharField(_("trigger type"), max_length=limits.EVENT_TYPE, blank=True)
    trigger_position = models.BigIntegerField(_("trigger event"), null=True, blank=True)
    # NULL, not "": unique per (tenant, workflow) among keyed runs only.
    idempotency_key = models.CharField(  # noqa: DJ001
        _("idempotency key"), max_length=limits.IDEMPOTENCY_KEY, null=True, blank=True
    )
    version = models.PositiveIntegerField(_("stream version"))
    recoveries = models.PositiveIntegerField(_("stalled recoveries"), default=0)
    # A child run: the run that started it (its parent), the first run of its
    # tree (its root), the parent's step, whether the parent waits for its end,
    # and whether cancelling the parent cancels it.
    parent_id = models.UUIDField(_("parent run"), null=True, blank=True)
    root_id = models.UUIDField(_("root run"), null=True, blank=True)
    parent_step = models.CharField(_("parent step"), max_length=limits.STEP_PATH, blank=True)
    parent_waits = models.BooleanField(_("parent waits"), default=False)
    cancel_with_parent = models.BooleanField(_("cancelled with its parent"), default=True)
    #: How many parents the run has (0: a root run).
    depth = models.PositiveSmallIntegerField(_("depth in its tree"), default=0)
    #: Events the run's branches await (``RunWait`` rows), when it waits in branches.
    branch_waits = models.PositiveIntegerField(_("branch waits"), default=0)
    #: Child runs the run waits for, and the version it suspended at: the
    #: children that ended since are the ``child-settled`` events after it.
    child_waits = models.PositiveIntegerField(_("children awaited"), default=0)
    suspended_version = models.PositiveIntegerField(_("suspended at version"), default=0)
    #: Compensation after a failure or cancel: running, compensated or failed.
    compensation = models.CharField(
        _("compensation"), max_length=20, choices=Compensation.choices, blank=True
    )
    #: Flow control: higher first in the due claim (-100 to 100); the scope and
    #: key of its concurrency limit and the key of its rate; what holds it while
    #: it is queued (``concurrency``, ``rate``, ``debounce``); a debounced run's key.
    priority = models.SmallIntegerField(_("priority"), default=0)
    flow_scope = models.CharField(_("limit scope"), max_length=limits.FLOW_SCOPE, blank=True)
    flow_key = models.CharField(_("limit key"), max_length=limits.FLOW_KEY, blank=True)
    rate_key = models.CharField(_("rate key"), max_length=limits.FLOW_KEY, blank=True)
    held_by = models.CharField(_("held by"), max_length=20, blank=True)
    debounce_key = models.CharField(_("debounce key"), max_length=limits.FLOW_KEY, blank=True)
    #: Search attributes (name -> str, int or bool), from ``run-started`` and
    #: ``attributes-set``; indexed in ``RunAttribute`` rows (projections.attributes).
    attributes = models.JSONField(_("search attributes"), default=dict, blank=True)
    #: An operator paused the run (or its retries ran out under
    #: ``on_exhausted="pause"``): no worker claims it until it is resumed. Its
    #: status stays what it was, so a resume continues where it stood.
    paused = models.BooleanField(_("paused"), default=False)
    # Operational, not projected from the log: which worker is running the
    # run's next segment, until when. Cleared when the segment commits.
    lease_owner = models.CharField(_("leased by"), max_length=limits.LEASE_OWNER, blank=True)
    lease_until = models.DateTimeField(_("lease until"), null=True, blank=True)
    started_at = models.DateTimeField(_("started at"))
    updated_at = models.DateTimeField(_("updated at"))
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    objects: ClassVar[WorkflowRunQuerySet] = EngineManager.from_queryset(WorkflowRunQuerySet)()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("workflow run")
        verbose_name_plural = _("workflow runs")
        permissions = [
            ("cancel_workflowrun", "Can cancel workflow runs"),
            ("retry_workflowrun", "Can retry failed workflow runs"),
            ("wake_workflowrun", "Can wake waiting workflow runs"),
            ("send_event_workflowrun", "Can send the awaited event to a waiting workflow run"),
            ("decide_approval_workflowrun", "Can decide approvals workflow runs wait at"),
            ("pause_workflowrun", "Can pause and resume workflow runs"),
            ("fail_workflowrun", "Can fail workflow runs"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "workflow", "idempotency_key"],
                name="kumiflow_run_idempotency_uq",
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=[c.value for c in RunStatus]),
                name="kumiflow_run_status_valid",
            ),
        ]
        indexes = [
            # "Due now": finished runs have no wake time, so they are not in
            # the index range the resume loop reads.
            models.Index(fields=["wake_at"], name="kumiflow_run_due_idx"),
            models.Index(fields=["-started_at"], name="kumiflow_run_started_idx"),
            models.Index(fields=["workflow", "status"], name="kumiflow_run_workflow_idx"),
            models.Index(fields=["status", "-started_at"], name="kumiflow_run_status_idx"),
            # A run's children (the admin's list, cancel cascades): only the
            # rows of child runs (most runs have no parent), so that SQLite's
            # planner keeps to it after ANALYZE (store.indexes.SetIndex).
            SetIndex(fields=["parent_id"], name="kumiflow_run_child_idx"),
            # Flow control: a key's active runs (counted under the key's lock)
            # and its parked ones; a debounced run of a key.
            models.Index(fields=["flow_key", "flow_scope", "status"], name="kumiflow_run_flow_idx"),
            models.Index(
                fields=["debounce_key", "workflow", "status"], name="kumiflow_run_debounce_idx"
            ),
            # The run list filtered by workflow, newest first, a page at a time
            # (whatever the number of the workflow's runs).
            models.Index(fields=["workflow", "-started_at"], name="kumiflow_run_wf_started_idx"),
            # The API's run list: a tenant's runs newest first, a page at a
            # time (without it every run of the tenant was read and sorted).
            models.Index(
                fields=["tenant_id", "-started_at", "-id"], name="kumiflow_run_tenant_idx"
            ),
            # The console's overview: completions and failures per minute.
            models.Index(fields=["status", "finished_at"], name="kumiflow_run_finished_idx"),
            # The console's search by idempotency key prefix (LIKE 'k%' on
            # PostgreSQL needs the pattern operators; elsewhere a plain index).
            models.Index(
                fields=["idempotency_key"],
                name="kumiflow_run_key_idx",
                opclasses=["varchar_pattern_ops"],
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow} {self.id} ({self.status})"

    @property
    def cursor_text(self) -> str:
        return ".".join(str(p) for p in self.cursor) if self.cursor else ""


# -- who writes which column --------------------------------------------------
#
# The fold owns the row, with two exceptions, both the scheduler's business
# (the resume loop, flow control, the rebuild's recheck): the lease, and when a
# queued run is checked again and what holds it. tests/test_run_columns.py
# records every write to the table and holds each writer to its columns.

#: A worker's lease on the run's next segment: not in the log, never folded,
#: never rebuilt. Only the scheduler sets it; a committed segment ends it (the
#: fold's write clears both in the same UPDATE).
SCHEDULER_COLUMNS = frozenset({"lease_owner", "lease_until"})
#: Folded from the log (a start held by flow control, a suspension's wake
#: time, an admission), and re-set by the scheduler while the run is queued:
#: when it is checked again, and what holds it now (the log says only that it
#: is queued; flow control parks, wakes and re-checks it).
PARKED_COLUMNS = frozenset({"wake_at", "held_by"})
#: Every other column: the fold's alone, written only through
#: :mod:`kumiflow_django.projections.stream` (a ``Change`` of :data:`RUNS`)
#: and by the rebuild's replay of the log.
FOLD_COLUMNS = (
    frozenset(f.column for f in WorkflowRun._meta.concrete_fields)
    - SCHEDULER_COLUMNS
    - PARKED_COLUMNS
)


# -- the fold ---------------------------------------------------------------
#
# One handler per event type (:data:`FOLD`), each reading its typed payload
# (``store.payloads``); :func:`apply` sets what every event sets (the version,
# the time) and calls the type's handler. An event type without a handler
# changes nothing else.


def _merge_trail(run: WorkflowRun, trail: list[str] | None) -> None:
    seen = set(run.trail)
    added = []
    for path in trail or ():
        if path not in seen:
            seen.add(path)
            added.append(path)
    if added:
        run.trail = [*run.trail, *added]


def _clear_wait(run: WorkflowRun) -> None:
    run.wake_at = None
    run.branch_waits = 0
    run.child_waits = 0
    run.matched_position = None


def _flow(run: WorkflowRun, flow: pl.FlowRef | None) -> None:
    """A run that starts under flow control: its keys, and what holds it, if anything.

    A run parked behind a full key has no wake time; the one that frees a slot
    wakes it (``kumiflow_django.flow``). A rebuilt table leaves queued runs
    for the worker to check again.
    """
    if not flow:
        return
    run.flow_scope = flow.get("scope", "")
    run.flow_key = flow.get("key", "")
    run.rate_key = flow.get("rate_key", "")
    run.debounce_key = flow.get("debounce_key", "")
    held = flow.get("held")
    if held:
        run.status = RunStatus.QUEUED
        run.held_by = held["why"]
        run.wake_at = _instant(held.get("until"))


def _instant(value: str | None) -> Any:
    return parse_instant(value) if value else None


def _started(event: Event) -> WorkflowRun:
    """The new row of ``run-started``."""
    p: pl.RunStarted = event.payload
    deferred = p.get("mode") == "deferred"
    trigger: Mapping[str, Any] = p.get("trigger") or {}
    run = WorkflowRun(
        id=uuid.UUID(event.stream_id),
        tenant_id=event.tenant_id,
        workflow=p["workflow"],
        workflow_version=p.get("version") or "",
        started_version=p.get("version") or "",
        fingerprint=p["fingerprint"],
        status=RunStatus.PENDING if deferred else RunStatus.RUNNING,
        start_mode=p.get("mode", "inline"),
        cursor=None,
        state=new_state(),
        trail=[],
        wake_at=event.created_at if deferred else None,
        since_position=p.get("since", 0),
        since_gaps=p.get("since_gaps") or None,
        trigger_type=trigger.get("type", ""),
        trigger_position=trigger.get("position"),
        idempotency_key=p.get("idempotency_key"),
        input=p.get("input"),
        attempt=1,
        started_at=event.created_at,
        version=0,
    )
    run.priority = p.get("priority", 0)
    restart = p.get("restart")
    if restart:  # it begins at the step it was restarted from, with the results before it
        run.cursor = restart["cursor"]
        run.state = restart["state"]
    run.attributes = dict(p.get("attributes") or {})
    _flow(run, p.get("flow"))
    parent = p.get("parent")
    if parent:
        run.parent_id = uuid.UUID(parent["id"])
        run.root_id = uuid.UUID(parent["root"])
        run.parent_step = parent.get("step", "")
        run.parent_waits = bool(parent.get("wait"))
        run.cancel_with_parent = bool(parent.get("cancel_with_parent", True))
        run.depth = int(parent.get("depth", 1))
    return run


def _suspended(run: WorkflowRun, p: pl.Suspended) -> None:
    """What every suspension sets: the wait cleared, the position, the state."""
    _clear_wait(run)
    run.cursor = p["cursor"]
    run.state = p["state"]
    _merge_trail(run, p.get("trail"))


def _step_waiting(run: WorkflowRun, event: Event) -> None:
    p: pl.StepWaiting = event.payload
    _suspended(run, p)
    run.status = RunStatus.WAITING
    run.wake_at = _instant(p["wake_at"])


def _waiting_for_event(run: WorkflowRun, event: Event) -> None:
    p: pl.StepWaitingForEvent = event.payload
    _suspended(run, p)
    run.status = RunStatus.WAITING_EVENT
    run.wake_at = _instant(p.get("timeout_at"))  # the wait: its RunWait row


def _retry_scheduled(run: WorkflowRun, event: Event) -> None:
    p: pl.RetryScheduled = event.payload
    _suspended(run, p)
    run.status = RunStatus.RETRY_SCHEDULED
    run.wake_at = _instant(p["wake_at"])
    run.attempt = p["attempt"]
    run.last_error = p["error"]


def _awaits_children(run: WorkflowRun, event: Event, p: pl.Suspended) -> None:
    _suspended(run, p)
    run.status = RunStatus.WAITING
    run.suspended_version = event.version


def _waiting_for_child(run: WorkflowRun, event: Event) -> None:
    p: pl.StepWaitingForChild = event.payload
    _awaits_children(run, event, p)
    run.wake_at = _instant(p.get("wake_at"))
    run.child_waits = 1


def _waiting_branches(run: WorkflowRun, event: Event) -> None:
    p: pl.StepWaitingBranches = event.payload
    _awaits_children(run, event, p)
    run.wake_at = _instant(p.get("wake_at"))
    run.branch_waits = len(p.get("waits") or ())
    run.child_waits = len(p.get("children") or ())


def _child_settled(run: WorkflowRun, event: Event) -> None:
    # The outcome stays in the event (the next segment reads the ones after
    # ``suspended_version``): the row only becomes due, whatever its size.
    if run.status in SUSPENDED:
        run.wake_at = min(run.wake_at or event.created_at, event.created_at)


def _compensation_started(run: WorkflowRun, event: Event) -> None:
    p: pl.CompensationStarted = event.payload
    run.paused = False  # an operator's fail or cancel of a paused run: its compensations run
    _clear_wait(run)
    run.status = RunStatus.WAITING
    run.wake_at = event.created_at
    run.cursor = [COMPENSATE, 0]
    state = p.get("state") or run.state
    run.state = {
        **state,
        "compensating": {"reason": p.get("reason"), "error": p.get("error"), "then": p.get("then")},
    }
    run.compensation = Compensation.RUNNING
    run.last_error = p.get("error", "")
    run.reason = p.get("reason", "")
    _merge_trail(run, p.get("trail"))


def _admitted(run: WorkflowRun, event: Event) -> None:
    p: pl.RunAdmitted = event.payload
    _clear_wait(run)
    run.status = RunStatus.RUNNING
    run.held_by = ""
    if "fingerprint" in p:  # queued across a deploy: starts on the current definition
        run.fingerprint = p["fingerprint"]
        run.workflow_version = run.started_version = p.get("version") or ""


def _definition_switched(run: WorkflowRun, event: Event) -> None:
    """A deploy carried the run on to another definition (``started_version`` stays)."""
    p: pl.DefinitionSwitched = event.payload
    run.fingerprint = p["to_fingerprint"]
    run.workflow_version = p.get("to_version") or ""


def _debounced(run: WorkflowRun, event: Event) -> None:
    p: pl.RunDebounced = event.payload
    trigger = p["trigger"]
    run.trigger_type = trigger.get("type", "")
    run.trigger_position = trigger.get("position")
    run.since_position = p.get("since", run.since_position)
    run.since_gaps = p.get("since_gaps") or None
    run.wake_at = _instant(p["until"])


def _event_matched(run: WorkflowRun, event: Event) -> None:
    p: pl.EventMatched = event.payload
    run.matched_position = p["event"]["position"]
    run.wake_at = event.created_at


def _woken(run: WorkflowRun, event: Event) -> None:
    run.wake_at = event.created_at
    if run.state.get("parallel"):  # every branch's wait is over, not only the run's
        run.state = {**run.state, "woken": True}


def _resumed(run: WorkflowRun, event: Event) -> None:
    p: pl.StepResumed = event.payload
    _clear_wait(run)
    run.status = RunStatus.RUNNING
    if p.get("recovered"):
        run.recoveries += 1


def _completed(run: WorkflowRun, event: Event) -> None:
    run.paused = False
    p: pl.RunCompleted = event.payload
    _clear_wait(run)
    run.status = RunStatus.COMPLETED
    run.cursor = None
    run.result = p.get("result")
    run.finished_at = event.created_at
    _merge_trail(run, p.get("trail"))


def _failed(run: WorkflowRun, event: Event) -> None:
    run.paused = False
    p: pl.RunFailed = event.payload
    _clear_wait(run)
    run.status = RunStatus.FAILED
    run.cursor = p.get("cursor", run.cursor)
    run.last_error = p["error"]
    run.reason = p.get("reason", "")
    run.finished_at = event.created_at
    if p.get("compensation"):
        run.compensation = p["compensation"]
    _merge_trail(run, p.get("trail"))


def _cancelled(run: WorkflowRun, event: Event) -> None:
    run.paused = False
    p: pl.RunCancelled = event.payload
    _clear_wait(run)
    run.status = RunStatus.CANCELLED
    run.reason = "cancelled"
    run.last_error = p.get("reason", "")
    run.finished_at = event.created_at
    if p.get("compensation"):
        run.compensation = p["compensation"]


def _retried(run: WorkflowRun, event: Event) -> None:
    p: pl.RunRetried = event.payload
    _restore(run, p["restore"], event)
    if "fingerprint" in p:
        run.fingerprint = p["fingerprint"]
        run.workflow_version = p.get("version") or ""


def _restore(run: WorkflowRun, restore: pl.Restore, event: Event) -> None:
    """The run back at the start of its failed segment (a retry, or the resume
    of a run paused on exhausted retries)."""
    _clear_wait(run)
    run.status = restore["status"]
    run.cursor = restore["cursor"]
    run.state = restore["state"]
    run.attempt = restore.get("attempt", 1)
    # Its restored waits (``awaited``, ``waits``) are its RunWait rows.
    run.matched_position = restore.get("matched_position")
    run.reason = ""
    run.last_error = ""
    run.finished_at = None
    # "wait": the run waits again for its awaited event (a task run again).
    run.wake_at = None if restore.get("wait") else event.created_at
    run.branch_waits = len(restore.get("waits") or ())
    run.child_waits = restore.get("child_waits", 0)
    if "suspended_version" in restore:
        run.suspended_version = restore["suspended_version"]
    cursor = restore.get("cursor")
    run.compensation = Compensation.RUNNING if cursor and cursor[0] == COMPENSATE else ""


def _paused(run: WorkflowRun, event: Event) -> None:
    p: pl.RunPaused = event.payload
    if "restore" in p:  # its retries ran out: it stands where its failed segment began
        _restore(run, p["restore"], event)
    failure = p.get("failure")
    if failure:  # what it would have failed with, for the console
        run.last_error = failure["error"]
        run.reason = failure["reason"]
    run.paused = True


def _unpaused(run: WorkflowRun, event: Event) -> None:
    p: pl.RunResumed = event.payload
    run.paused = False
    if run.reason and run.compensation != Compensation.RUNNING:
        # paused on exhausted retries: the failure it would have had is over
        run.reason, run.last_error = "", ""
    if "restore" in p:  # paused on exhausted retries: its failed segment again
        _restore(run, p["restore"], event)


def _recovered(run: WorkflowRun, event: Event) -> None:
    run.recoveries += 1


def _segment_refused(run: WorkflowRun, event: Event) -> None:
    p: pl.SegmentRefused = event.payload
    if run.status == RunStatus.RUNNING:
        # Its first segment never committed. Under flow control it was never
        # admitted either (the admission was rolled back with the segment):
        # it waits for admission, not only for its start.
        limited = run.flow_key or run.rate_key
        run.status = RunStatus.QUEUED if limited else RunStatus.PENDING
    run.wake_at = _instant(p["retry_at"])
    run.last_error = p["error"]
    if p.get("event"):
        run.matched_position = p["event"]["position"]


def _attributes_set(run: WorkflowRun, event: Event) -> None:
    p: pl.RunAttributesSet = event.payload
    run.attributes = merged(run.attributes or {}, p["attributes"])


def _nothing(run: WorkflowRun, event: Event) -> None:
    """``run-started``: :func:`_started` made the row. ``run-restarted``: the
    run's end stays as it was (the restart is a new run, which names it).
    ``approval-decided``: the run's awaited event, which wakes it
    (``event-matched``, ``step.resumed``)."""


#: How each run event changes the row (after :func:`apply` set its version).
FOLD: dict[str, Callable[[WorkflowRun, Event], None]] = {
    ev.RUN_STARTED: _nothing,
    ev.STEP_WAITING: _step_waiting,
    ev.STEP_WAITING_FOR_EVENT: _waiting_for_event,
    ev.RETRY_SCHEDULED: _retry_scheduled,
    ev.STEP_WAITING_FOR_CHILD: _waiting_for_child,
    ev.STEP_WAITING_BRANCHES: _waiting_branches,
    ev.CHILD_SETTLED: _child_settled,
    ev.COMPENSATION_STARTED: _compensation_started,
    ev.RUN_ADMITTED: _admitted,
    ev.RUN_DEBOUNCED: _debounced,
    ev.DEFINITION_SWITCHED: _definition_switched,
    ev.EVENT_MATCHED: _event_matched,
    ev.RUN_WOKEN: _woken,
    ev.STEP_RESUMED: _resumed,
    ev.RUN_COMPLETED: _completed,
    ev.RUN_FAILED: _failed,
    ev.RUN_CANCELLED: _cancelled,
    ev.RUN_RETRIED: _retried,
    ev.RUN_RECOVERED: _recovered,
    ev.RUN_PAUSED: _paused,
    ev.RUN_RESUMED: _unpaused,
    ev.SEGMENT_REFUSED: _segment_refused,
    ev.RUN_RESTARTED: _nothing,
    ev.RUN_ATTRIBUTES_SET: _attributes_set,
    ev.APPROVAL_DECIDED: _nothing,
}


def apply(run: WorkflowRun | None, event: Event) -> WorkflowRun:
    """The row after ``event``; ``run`` is None before run-started."""
    if event.type == ev.RUN_STARTED:
        run = _started(event)
    if run is None:
        raise ValueError(f"event {event.type} at version {event.version} precedes run-started")
    run.version = event.version
    run.updated_at = event.created_at
    handler = FOLD.get(event.type)
    if handler is not None:
        handler(run, event)
    return run


#: The run stream: what the segment runner and the operations write through;
#: every write of it keeps the run's search attribute rows in step.
RUNS = Stream(ev.RUN_STREAM, WorkflowRun, apply, after_write=attribute_index.sync)


def find_runs(
    *, workflow: str | None = None, tenant: str | None = None, **attributes: str | int | bool
) -> WorkflowRunQuerySet:
    """Runs by their search attributes (``find_runs(customer="C-17")``),
    newest first; ``workflow`` and ``tenant`` narrow them further."""
    qs = WorkflowRun.objects.with_attribute(**attributes)
    if workflow is not None:
        qs = qs.filter(workflow=workflow)
    if tenant is not None:
        qs = qs.filter(tenant_id=tenant)
    return qs.order_by("-started_at")
