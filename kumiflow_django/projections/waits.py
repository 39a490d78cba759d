"""Branch waits: the events the branches of a run's parallel step await.

A run that waits in one place keeps its awaited event on its own row (one
indexed correlation key). A run whose branches wait for several events at
once has one ``RunWait`` row per awaited event, with the same correlation
key, so that an appended event finds the run through an index. The rows are
a projection of the run's last ``step.waiting-branches`` event: written with
the segment that suspends the run, removed with the one that resumes it
(:func:`sync`), rebuilt from the log by ``kumiflow_rebuild``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any, ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from kumiflow_django.store import limits
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import EngineManager, Event


class RunWait(models.Model):
    run_id = models.UUIDField(_("run"))
    tenant_id = models.CharField(_("tenant"), max_length=limits.TENANT)
    branch = models.CharField(_("branch"), max_length=limits.STEP_PATH)
    event_type = models.CharField(_("awaited event type"), max_length=limits.EVENT_TYPE)
    correlation_key = models.CharField(_("correlation key"), max_length=64)
    match = models.JSONField(_("awaited match"), default=dict)
    after = models.BigIntegerField(_("awaits events after"))
    # Positions at or below ``after`` that count as after it (see
    # WorkflowRun.awaited_gaps); null: the run's start gaps apply.
    gaps = models.JSONField(_("awaited gaps"), null=True, blank=True)

    objects: ClassVar[EngineManager[RunWait]] = EngineManager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("branch wait")
        verbose_name_plural = _("branch waits")
        indexes = [
            models.Index(fields=["event_type", "correlation_key"], name="kumiflow_wait_key_idx"),
            models.Index(fields=["run_id"], name="kumiflow_wait_run_idx"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} branch {self.branch} awaits {self.event_type}"


Key = tuple[str, str, str, str]


def _key(data: Any) -> Key:
    return (
        data["branch"],
        data["event_type"],
        data["correlation_key"],
        f"{data['after']}:{data.get('gaps')}",
    )


def waits_of(event: Event) -> list[dict[str, Any]]:
    """The branch waits a run event leaves (only a branches suspension has any)."""
    if event.type == ev.RUN_RETRIED:
        return list(event.payload["restore"].get("waits") or [])
    if event.type != ev.STEP_WAITING_BRANCHES:
        return []
    return list(event.payload.get("waits") or [])


def sync(run_id: uuid.UUID, tenant: str, waits: Iterable[dict[str, Any]], *, had: bool) -> None:
    """Make the run's rows the given waits (``had``: the run may have rows now)."""
    wanted = {_key(w): w for w in waits}
    existing: dict[Key, int] = {}
    if had:
        for row in RunWait.objects.filter(run_id=run_id).values(
            "id", "branch", "event_type", "correlation_key", "after", "gaps"
        ):
            existing[_key(row)] = row["id"]
    stale = [pk for key, pk in existing.items() if key not in wanted]
    if stale:
        RunWait.objects.filter(pk__in=stale).delete()
    new = [
        RunWait(
            run_id=run_id,
            tenant_id=tenant,
            branch=w["branch"],
            event_type=w["event_type"],
            correlation_key=w["correlation_key"],
            match=w["match"],
            after=w["after"],
            gaps=w.get("gaps"),
        )
        for key, w in wanted.items()
        if key not in existing
    ]
    if new:
        RunWait.objects.bulk_create(new)
