"""Cron schedules that fire each occurrence exactly once.

Every schedule is a stream (``cron:<workflow>``) whose events the
``CronSchedule`` row projects. Firing an occurrence starts a run whose
idempotency key is the scheduled instant, inside the transaction that
appends ``cron.fired`` at the schedule's next version: a second scheduler,
a restart or a retry can never start the same occurrence twice.

One schedule never stops the others: a schedule whose next occurrence cannot
be computed, or whose firing raises, is disabled with the reason (``BROKEN``)
and logged once; the loop goes on with the rest. A later deploy that changes
its expression or zone enables it again; an operator's reason is kept.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import IntegrityError, transaction

from kumiflow_django.conf import settings
from kumiflow_django.cron.occurrences import next_occurrence, occurrences
from kumiflow_django.definition.context import TriggerEvent
from kumiflow_django.definition.durations import isoformat
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.triggers import CronTrigger
from kumiflow_django.engine.starting import start_run
from kumiflow_django.projections.claims import unclaimed
from kumiflow_django.projections.runs import FINISHED, WorkflowRun
from kumiflow_django.projections.schedules import BROKEN, NOT_REGISTERED, CronSchedule, fit
from kumiflow_django.projections.schedules import append as _record
from kumiflow_django.projections.stream import StaleRow
from kumiflow_django.store import clock, db, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store.audit import audited, check_operator
from kumiflow_django.store.db import for_update
from kumiflow_django.store.errors import UnknownWorkflow, WorkflowDefinitionError, raise_refusal
from kumiflow_django.store.models import Event
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.cron.schedules")

#: Counting missed occurrences stops here (a per-second schedule after a long outage).
_COUNT_CAP = 10_000


def _broken(cause: BaseException | str) -> str:
    text = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
    return fit(BROKEN + text)


def _definition(trigger: CronTrigger) -> dict[str, Any]:
    return {
        "expression": trigger.expression,
        "timezone": trigger.timezone,
        "misfire": trigger.misfire,
        "max_catch_up": trigger.max_catch_up,
        "overlap": trigger.overlap,
    }


def _safely(fn: Any, *args: Any) -> CronSchedule | None:
    """Run one schedule change in its own savepoint; a concurrent scheduler that
    made the same change first is not an error."""
    try:
        with db.atomic():
            return fn(*args)  # type: ignore[no-any-return]
    except (IntegrityError, StaleRow):
        return None


def sync_schedules() -> None:
    """Bring the schedule rows in line with the registry: add new schedules,
    recompute changed ones, disable those whose workflow is gone. Each schedule
    is synced in its own transaction: one that fails is disabled as broken,
    the others are synced."""
    now = clock.now()
    rows = {row.workflow: row for row in CronSchedule.objects.all()}
    for workflow in registry.cron_workflows():
        trigger = workflow.trigger
        assert isinstance(trigger, CronTrigger)
        row = rows.pop(workflow.name, None)
        try:
            _safely(_sync_one, workflow.name, trigger, row, now)
        except Exception as exc:
            version = 0 if row is None else row.version
            _disable_broken(workflow.name, version, exc, definition=_definition(trigger))
    for row in rows.values():
        if row.registered:
            fields = telemetry.log_fields(workflow=row.workflow, tenant=row.tenant_id)
            logger.warning(
                "cron schedule %s disabled: its workflow is not registered",
                row.workflow,
                extra=fields,
            )
            try:
                _safely(_remove, row)
            except Exception:
                logger.exception(
                    "cron schedule %s: disabling it failed", row.workflow, extra=fields
                )


def _sync_one(name: str, trigger: CronTrigger, row: CronSchedule | None, now: datetime) -> None:
    definition = _definition(trigger)
    if row is None:
        nxt = next_occurrence(trigger.expression, trigger.timezone, now)
        payload = definition | {"next_fire_at": isoformat(nxt)}
        _record(None, name, settings.DEFAULT_TENANT, ev.CRON_REGISTERED, payload)
        return
    current = {k: getattr(row, k) for k in definition}
    if current == definition and row.registered:
        return
    payload = dict(definition)
    timing = ("expression", "timezone")
    if any(current[k] != definition[k] for k in timing) or not row.registered:
        nxt = next_occurrence(trigger.expression, trigger.timezone, now)
        payload["next_fire_at"] = isoformat(nxt)
    _record(row, row.workflow, row.tenant_id, ev.CRON_CHANGED, payload)


def _remove(row: CronSchedule) -> CronSchedule:
    payload = {"reason": NOT_REGISTERED, "next_fire_at": None}
    return _record(row, row.workflow, row.tenant_id, ev.CRON_REMOVED, payload)


def _disable_broken(
    workflow: str,
    version: int | None,
    cause: BaseException,
    *,
    definition: dict[str, Any] | None = None,
) -> None:
    """Disable a schedule the engine could not sync or fire, in a transaction of
    its own, and log the error once. ``version`` is the version the failure was
    seen at (0: no schedule yet): a schedule that moved on meanwhile was handled
    by another scheduler. ``definition`` (from sync) is recorded too, so that
    the next sync sees nothing new and stays quiet until the definition changes."""
    reason = _broken(cause)
    try:
        with db.atomic():
            row = _lock(workflow, None, skip_locked=False)
            if version is not None and (0 if row is None else row.version) != version:
                return
            if row is None:
                if definition is None:
                    return
                payload = definition | {"next_fire_at": None}
                tenant = settings.DEFAULT_TENANT
                row = _record(None, workflow, tenant, ev.CRON_REGISTERED, payload)
            elif definition is not None and (
                not row.registered or any(getattr(row, k) != v for k, v in definition.items())
            ):
                payload = definition | {"next_fire_at": None}
                row = _record(row, workflow, row.tenant_id, ev.CRON_CHANGED, payload)
            if row.enabled or row.disabled_reason.startswith(BROKEN):
                payload = {"reason": reason, "next_fire_at": None}
                _record(row, workflow, row.tenant_id, ev.CRON_DISABLED, payload)
    except (IntegrityError, StaleRow):
        return  # another scheduler changed the schedule first
    except Exception:
        logger.exception(
            "cron schedule %s failed (%s); disabling it failed too",
            workflow,
            reason,
            extra=telemetry.log_fields(workflow=workflow),
        )
        return
    logger.error(
        "cron schedule %s disabled: %s",
        workflow,
        reason,
        exc_info=cause,
        extra=telemetry.log_fields(workflow=workflow),
    )


def _lock(workflow: str, version: int | None, *, skip_locked: bool) -> CronSchedule | None:
    qs = CronSchedule.objects.filter(pk=workflow)
    if version is not None:
        qs = qs.filter(version=version)
    return (unclaimed(qs) if skip_locked else for_update(qs)).first()


def _active_run(workflow: str) -> bool:
    return (
        WorkflowRun.objects.filter(workflow=workflow, trigger_type="cron")
        .exclude(status__in=FINISHED)
        .exists()
    )


def _start(schedule: CronSchedule, occurrence: datetime, manual: bool = False) -> str:
    workflow = registry.get(schedule.workflow)
    when = isoformat(occurrence)
    data = {"scheduled_for": when}
    trigger = TriggerEvent(type="cron", payload=data, tenant_id=schedule.tenant_id)
    since = Event.objects.last_position()
    run = start_run(
        workflow,
        trigger=trigger,
        tenant=schedule.tenant_id,
        key=f"cron:{'manual:' if manual else ''}{when}",
        since=since,
        input_=data,
    )
    logger.info(
        "cron %s: occurrence %s started run %s",
        schedule.workflow,
        when,
        run.id,
        extra=telemetry.run_log_fields(run),
    )
    return str(run.id)


class Choice(NamedTuple):
    """The due occurrences to fire now, and how many due ones are skipped."""

    fire: list[datetime]
    skipped: int


def _choose(schedule: CronSchedule, now: datetime) -> Choice:
    """Which due occurrences fire, by the schedule's misfire policy."""
    assert schedule.next_fire_at is not None
    first = schedule.next_fire_at
    due = [
        first,
        *itertools.takewhile(
            lambda t: t <= now,
            itertools.islice(
                occurrences(schedule.expression, schedule.timezone, first), _COUNT_CAP
            ),
        ),
    ]
    grace = timedelta(seconds=settings.CRON_MISFIRE_GRACE)
    late = [t for t in due if now - t > grace]
    on_time = [t for t in due if now - t <= grace]
    if schedule.misfire == "latest":
        chosen = due[-1:]
    elif schedule.misfire == "all":
        chosen = late[-schedule.max_catch_up :] + on_time
    else:
        chosen = on_time
    return Choice(chosen, len(due) - len(chosen))


def fire_schedule(workflow: str, version: int | None = None) -> int:
    """Fire the due occurrences of one schedule; return the number of runs started.

    Whatever this schedule raises stays with it: it is disabled as broken and
    the error logged once, and the caller goes on with the next schedule."""
    now = clock.now()
    seen = version
    try:
        with db.atomic(), telemetry.run_fields(None, workflow, None):
            schedule = _lock(workflow, version, skip_locked=True)
            if schedule is None or not schedule.enabled or schedule.next_fire_at is None:
                return 0
            if schedule.next_fire_at > now:
                return 0
            seen = schedule.version
            # telemetry: the fire's span; the runs it starts are its children
            with telemetry.span(
                "cron",
                workflow=workflow,
                tenant=schedule.tenant_id,
                scheduled_for=schedule.next_fire_at.isoformat(),
            ) as span:
                fired = _fire(schedule, now)
                span.set(outcome="fired" if fired else "skipped", runs=fired)
            return fired
    except Exception as exc:
        _disable_broken(workflow, seen, exc)
        return 0


def _fire(schedule: CronSchedule, now: datetime) -> int:
    """Fire a locked, due schedule (inside the caller's transaction)."""
    assert schedule.next_fire_at is not None
    workflow = schedule.workflow
    current = registry.get(workflow) if registry.is_registered(workflow) else None
    if current is None or not isinstance(current.trigger, CronTrigger):
        logger.warning(
            "cron schedule %s disabled: its workflow is not registered",
            workflow,
            extra=telemetry.log_fields(workflow=workflow, tenant=schedule.tenant_id),
        )
        _safely(_remove, schedule)
        return 0
    chosen, skipped = _choose(schedule, now)
    run_ids: list[str] = []
    fired: list[str] = []
    for occurrence in chosen:
        if schedule.overlap == "skip" and _active_run(workflow):
            skipped += 1
            continue
        run_ids.append(_start(schedule, occurrence))
        fired.append(isoformat(occurrence))
    last = max(now, schedule.next_fire_at)
    nxt = next(occurrences(schedule.expression, schedule.timezone, last), None)
    if skipped:
        logger.info("cron %s: %d occurrence(s) skipped (%s)", workflow, skipped, schedule.misfire)
    try:
        with db.atomic():
            schedule = _record(
                schedule,
                workflow,
                schedule.tenant_id,
                ev.CRON_FIRED if run_ids else ev.CRON_SKIPPED,
                {
                    "scheduled_for": fired,
                    "run_ids": run_ids,
                    "skipped": skipped,
                    "next_fire_at": None if nxt is None else isoformat(nxt),
                },
            )
    except (IntegrityError, StaleRow):
        transaction.set_rollback(
            True, using=db.alias()
        )  # another scheduler fired it: undo our starts
        return 0
    telemetry.count(telemetry.CRON_OCCURRENCES, len(run_ids), workflow=workflow, outcome="fired")
    telemetry.count(telemetry.CRON_OCCURRENCES, skipped, workflow=workflow, outcome="skipped")
    if nxt is None:  # a year field that has run out: this was the last occurrence
        reason = _broken(f"no occurrence after {isoformat(last)}")
        payload = {"reason": reason, "next_fire_at": None}
        _record(schedule, workflow, schedule.tenant_id, ev.CRON_DISABLED, payload)
        logger.warning("cron schedule %s disabled: %s", workflow, reason)
    return len(run_ids)


def refuse_fire_now(workflow: str) -> str | None:
    """Why :func:`fire_now` does not apply to ``workflow`` (None: it does); the
    admin asks it what to offer."""
    if not registry.is_registered(workflow):
        return f"no workflow named {workflow!r} is registered in this process"
    return None


def refuse_set_enabled(schedule: CronSchedule, enabled: bool) -> str | None:
    """Why :func:`set_enabled` has nothing to do on ``schedule`` (None: it has):
    it leaves a schedule that is so already as it is."""
    if schedule.enabled == enabled:
        return f"the schedule is {'enabled' if enabled else 'disabled'} already"
    return None


def fire_now(workflow: str, *, by: str = "", reason: str = "") -> str:
    """Start a run of a cron workflow now, outside its schedule; return the run id.
    ``by`` and ``reason`` are stored in the ``cron.fired`` event."""
    by, reason = check_operator(by, reason)
    raise_refusal(refuse_fire_now(workflow), UnknownWorkflow)
    now = clock.now().replace(microsecond=0)
    with (
        db.atomic(),
        telemetry.span("cron", workflow=workflow, manual=True, scheduled_for=now.isoformat()),
    ):
        schedule = _lock(workflow, None, skip_locked=False)
        if schedule is None:
            raise UnknownWorkflow(f"{workflow!r} has no cron schedule (run kumiflow_cron once)")
        run_id = _start(schedule, now, manual=True)
        _record(
            schedule,
            workflow,
            schedule.tenant_id,
            ev.CRON_FIRED,
            audited(
                {"scheduled_for": [isoformat(now)], "run_ids": [run_id], "manual": True},
                by,
                reason,
            ),
            created_by=by,
        )
    logger.info("cron %s fired by hand by %s: run %s", workflow, by or "code", run_id)
    return run_id


def set_enabled(workflow: str, enabled: bool, *, reason: str = "", by: str = "") -> CronSchedule:
    """Switch a schedule on or off. Switched on, it fires from the next occurrence
    after now: occurrences missed while it was off are not caught up. Switched
    off, it stays off until it is switched on (a deploy does not switch it on).
    ``by`` and ``reason`` are stored in the event it appends."""
    by, reason = check_operator(by, reason)
    if reason.startswith(BROKEN):
        raise ValueError(f"an operator's reason must not start with {BROKEN!r}")
    with db.atomic():
        schedule = _lock(workflow, None, skip_locked=False)
        if schedule is None:
            raise UnknownWorkflow(f"{workflow!r} has no cron schedule")
        if refuse_set_enabled(schedule, enabled) is not None:
            return schedule
        if enabled:
            try:
                nxt = next_occurrence(schedule.expression, schedule.timezone, clock.now())
            except Exception as exc:
                raise WorkflowDefinitionError(
                    f"schedule {workflow!r} cannot be enabled: {exc}"
                ) from exc
            payload = audited({"next_fire_at": isoformat(nxt)}, by, reason)
            return _record(
                schedule, workflow, schedule.tenant_id, ev.CRON_ENABLED, payload, created_by=by
            )
        payload = audited({}, by, reason or "disabled by an operator")
        return _record(
            schedule, workflow, schedule.tenant_id, ev.CRON_DISABLED, payload, created_by=by
        )
