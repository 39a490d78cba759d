"""One start of a run, whoever starts it.

A run starts from a saved event (its trigger), by a call
(``start_workflow``, the HTTP API, an operator's restart), by cron, or as a
child of a run's ``child`` step. Each of them is a :class:`RunStart`, and
:meth:`RunStart.prepare` is the one place that decides what the start does
and writes down how it began (the ``run-started`` payload):

- a keyed start whose run exists already returns that run and runs nothing;
- a start nested too deeply in one transaction fails
  (``KUMIFLOW_MAX_START_DEPTH``);
- flow control resolves the run's keys and may hold it (it is recorded
  ``queued``, and nothing of it runs now);
- the run keeps the log's positions still in flight below its start (its
  gaps), where writers can interleave;
- the trace context of the code that started it becomes the run's origin;
- an inline workflow runs its first segment now, a deferred one is only
  recorded; so is an inline start of a paused workflow or tenant (recorded
  ``deferred``, with ``paused`` saying why): it runs once the scope is
  resumed.

The runner (:func:`kumiflow_django.engine.runner.start`) executes it in a
savepoint of the caller's transaction.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from typing import Any

from kumiflow_django.conf import settings
from kumiflow_django.definition import matching
from kumiflow_django.definition.attributes import merged, resolve_all
from kumiflow_django.definition.context import (
    Context,
    RunInfo,
    Trigger,
    Wake,
    WakeReason,
    new_state,
)
from kumiflow_django.definition.flow import resolve_key
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.engine.failure import Failure, user_code
from kumiflow_django.engine.opening import Opening, Prepared, Steps, current_depth, keyed_run
from kumiflow_django.flow import admission
from kumiflow_django.flow.admission import Item, Unwritten
from kumiflow_django.projections.pauses import start_paused
from kumiflow_django.store import db, limits, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import Event


@dataclass(frozen=True)
class ParentLink:
    """The run (and the step of it) that started a child run."""

    id: uuid.UUID
    root: uuid.UUID
    step: str
    wait: bool
    cancel_with_parent: bool
    depth: int

    def payload(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "root": str(self.root),
            "step": self.step,
            "wait": self.wait,
            "cancel_with_parent": self.cancel_with_parent,
            "depth": self.depth,
        }


@dataclass(frozen=True)
class RestartFrom:
    """A run restarted from a step of an earlier run (``engine.restart``): it
    begins at ``cursor`` (that step, run fresh, not resumed) with ``state``,
    the results the earlier run had before it; nothing before it runs again."""

    run: uuid.UUID
    step: str
    cursor: list[Any]
    state: dict[str, Any]
    definition: str
    by: str = ""
    reason: str = ""
    #: The ``set_attributes`` changes of the steps before ``cursor``, in order
    #: ((step path, changes)): the new run carries them, as it carries results.
    attributes: tuple[tuple[str, dict[str, Any]], ...] = ()

    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "run": str(self.run),
            "step": self.step,
            "cursor": self.cursor,
            "state": self.state,
            "definition": self.definition,
        }
        if self.attributes:
            payload["attributes"] = [
                {"step": step, "attributes": changes} for step, changes in self.attributes
            ]
        if self.by:
            payload["by"] = self.by
        if self.reason:
            payload["reason"] = self.reason
        return payload


@dataclass(frozen=True)
class RunStart:
    """What one start of a run knows before anything of it runs.

    ``since`` is the log position the run's awaited events are looked for
    after; ``input`` the payload of a start that no stored event triggered;
    ``failure`` a reason known already (a trigger that raised: the run is
    recorded as failed); ``debounce`` the flow entry of a debounced start.
    """

    workflow: Workflow
    trigger: Trigger
    tenant: str
    since: int
    key: str | None = None
    input: dict[str, Any] | None = None
    priority: int | None = None
    failure: Failure | None = None
    debounce: dict[str, Any] | None = None
    parent: ParentLink | None = None
    #: The log positions in flight below ``since`` when several starts share
    #: it (the children of one segment): looked up once for all; None: here.
    gaps: list[int] | None = None
    #: An operator's restart of an earlier run from one of its steps.
    restart: RestartFrom | None = None
    # Random, also for keyed runs: an id derived from the key would be a
    # stream id anyone could take first. The run table's unique key (tenant,
    # workflow, idempotency key) makes a second start a no-op.
    run_id: uuid.UUID = field(default_factory=uuid.uuid4)

    def prepare(self) -> Prepared:
        """The start's opening (inside the runner's transaction), or the run
        of its key that exists already."""
        workflow = self.workflow
        if self.key is not None:
            existing = keyed_run(self.tenant, workflow.name, self.key)
            if existing is not None:
                return existing
        started = self._started()
        reason = self.failure
        if reason is None and current_depth() >= settings.MAX_START_DEPTH:
            reason = Failure(
                ev.START_DEPTH_EXCEEDED,
                f"workflows started workflows {current_depth()} levels deep in one transaction "
                f"(KUMIFLOW_MAX_START_DEPTH={settings.MAX_START_DEPTH})",
            )
        if reason is None and (workflow.attributes or self.restart and self.restart.attributes):
            try:
                attributes = self._attributes()
            except Failure as unresolved:
                reason = unresolved
            else:
                if attributes:
                    started["attributes"] = attributes
        held = False
        flow: dict[str, Any] | None = None
        unwritten: Unwritten | None = None
        if reason is None:
            try:
                flow = flow_keys(workflow, self.trigger)
            except Failure as unresolved:
                reason, flow = unresolved, None
            if self.debounce is not None:
                flow = {**(flow or {}), **self.debounce}
            elif flow is not None:
                item = Item.run_start(self.run_id, workflow, flow)
                admitted = admission.admit(item)
                if admitted.hold is not None:
                    flow["held"] = admitted.hold.payload()
                # counted as active until its row is written; ending in this
                # segment with nothing parked behind its key meanwhile wakes nobody
                unwritten = admission.unwritten(item, admitted)
            if flow is not None:
                started["flow"] = flow
                held = "held" in flow
        steps = None
        inline = workflow.start_mode == "inline" and not held
        if inline:
            paused = start_paused(workflow.name, self.tenant)
            if paused is not None:  # recorded, run once its workflow or tenant is resumed
                started["mode"] = "deferred"
                started["paused"] = paused
                inline = False
        if inline:
            restart = self.restart
            steps = Steps(
                workflow,
                self.trigger,
                cursor=None if restart is None else list(restart.cursor),
                state=new_state() if restart is None else copy.deepcopy(restart.state),
                wake=Wake(WakeReason.START),
            )
        return Opening(
            run_id=self.run_id,
            tenant=self.tenant,
            row=None,
            first=[(ev.RUN_STARTED, started)],
            steps=steps,
            failure=reason,
            key=self.key,
            workflow_name=workflow.name,
            unwritten=unwritten,
            # telemetry: the run's origin, stored on run-started
            trace=(telemetry.carried(self.trigger.metadata) or telemetry.carrier())
            if telemetry.tracing()
            else None,
        )

    def _attributes(self) -> dict[str, Any]:
        """The run's search attributes, resolved against the trigger (None-valued
        ones left out); Failure when a resolver raises or returns a value the
        index cannot store: the run is recorded as failed, as with a flow key
        (its trigger event is in the log already; refusing the start would
        drop it silently)."""
        workflow = self.workflow
        info = RunInfo(
            id=self.run_id,
            workflow=workflow.name,
            version=workflow.version,
            tenant=self.tenant,
            fingerprint=workflow.fingerprint,
        )
        view = Context(event=self.trigger, run=info, state=new_state()).view
        with user_code(ev.ATTRIBUTE_FAILED, "resolving a search attribute"):
            values = resolve_all(workflow.attributes, view) if workflow.attributes else {}
        out: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
        for _, changes in self.restart.attributes if self.restart else ():
            out = merged(out, changes)
        if len(out) > limits.ATTRIBUTES_PER_RUN:
            raise Failure(
                ev.ATTRIBUTE_FAILED,
                f"a run carries at most {limits.ATTRIBUTES_PER_RUN} search attributes ({len(out)})",
            )
        return out

    def _started(self) -> dict[str, Any]:
        """The ``run-started`` payload, before flow control adds its keys."""
        workflow = self.workflow
        started: dict[str, Any] = {
            "workflow": workflow.name,
            "version": workflow.version,
            "fingerprint": workflow.fingerprint,
            "mode": workflow.start_mode,
            "trigger": trigger_ref(self.trigger),
            "since": self.since,
        }
        if self.key is not None:
            started["idempotency_key"] = self.key
        if self.input is not None:
            started["input"] = self.input
        if self.parent is not None:
            started["parent"] = self.parent.payload()
        if self.restart is not None:
            started["restart"] = self.restart.payload()
        priority = workflow.priority if self.priority is None else self.priority
        if priority:
            started["priority"] = priority
        if workflow.awaited and not db.one_writer_at_a_time():
            gaps = matching.gaps_below(self.since) if self.gaps is None else self.gaps
            if gaps:
                started["since_gaps"] = gaps
        return started


def trigger_ref(trigger: Trigger) -> dict[str, Any]:
    """What ``run-started`` keeps of the trigger: its type, and for a stored
    event where it is in the log."""
    ref: dict[str, Any] = {"type": trigger.type}
    if isinstance(trigger, Event):
        ref.update(
            position=trigger.position,
            event_id=str(trigger.event_id),
            stream_id=trigger.stream_id,
            version=trigger.version,
        )
    return ref


def flow_keys(workflow: Workflow, trigger: Trigger) -> dict[str, Any] | None:
    """The run's flow keys (for ``run-started``); raises Failure when a key
    resolver raises or returns something that is not a short string."""
    if workflow.concurrency is None and workflow.rate is None:
        return None
    flow: dict[str, Any] = {}
    with user_code(ev.FLOW_KEY_FAILED, "resolving a flow key"):
        if workflow.concurrency is not None:
            flow["scope"] = admission.scope_of(workflow)
            flow["key"] = resolve_key(workflow.concurrency.key, trigger, "the concurrency key")
        if workflow.rate is not None:
            flow["rate_key"] = resolve_key(workflow.rate.key, trigger, "the rate key")
    return flow
