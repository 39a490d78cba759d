"""How a segment begins: what it opens with, what it runs.

A start (:mod:`kumiflow_django.engine.run_start`) and a resume
(:mod:`kumiflow_django.engine.resuming`) each prepare an :class:`Opening`;
the runner (:mod:`kumiflow_django.engine.runner`) executes it.
"""

from __future__ import annotations

import contextvars
import uuid
from dataclasses import dataclass, field
from typing import Any

from kumiflow_django.definition.context import Trigger, Wake
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.engine.failure import Failure
from kumiflow_django.flow.admission import Unwritten
from kumiflow_django.projections.runs import WorkflowRun
from kumiflow_django.store import payloads as pl

#: How deeply segments are nested in this thread (a step that appends an
#: event, or a child step, may start or wake another run inside the same
#: transaction).
segment_depth: contextvars.ContextVar[int] = contextvars.ContextVar("kumiflow_depth", default=0)


def current_depth() -> int:
    return segment_depth.get()


@dataclass
class Steps:
    """What a segment runs: the steps of ``workflow`` from ``cursor``."""

    workflow: Workflow
    trigger: Trigger
    cursor: list[Any] | None
    state: dict[str, Any]
    wake: Wake


@dataclass
class Opening:
    """How a segment begins.

    ``row`` is the locked run row (None for a new run); ``first`` the events
    that open the segment (``run-started`` or ``step.resumed``); ``steps``
    what it runs (None: nothing, for a deferred start); ``failure`` a reason
    known before anything runs.
    """

    run_id: uuid.UUID
    tenant: str
    row: WorkflowRun | None
    first: list[tuple[str, pl.Payload]]
    steps: Steps | None = None
    failure: Failure | None = None
    key: str | None = None
    workflow_name: str = ""
    #: The trace context the run continues (a new run's origin; telemetry).
    trace: dict[str, str] | None = None
    #: A limited run admitted in this segment (counted as active until written).
    unwritten: Unwritten | None = None
    version: int = field(init=False)

    def __post_init__(self) -> None:
        self.version = 0 if self.row is None else self.row.version

    @property
    def new(self) -> bool:
        return self.row is None


#: What ``prepare`` gives back: an opening to run, a run to return as it is
#: (a keyed start that exists already), or None (nothing to do).
Prepared = Opening | WorkflowRun | None


def keyed_run(tenant: str, workflow: str, key: str) -> WorkflowRun | None:
    return WorkflowRun.objects.filter(
        tenant_id=tenant, workflow=workflow, idempotency_key=key
    ).first()
