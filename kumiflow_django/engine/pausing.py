"""Whether a run is held by a pause, and the pause of a run whose retries ran out.

A run is held when it is paused itself (its row's ``paused``, folded from
``run-paused``) or when its workflow or its tenant is paused (a
``PausedScope`` row). The claim of due runs leaves held runs out in SQL
(``WorkflowRunQuerySet.claimable``); the resume of a run checks again under
the run's lock (:func:`held`), so a pause that commits between the due query
and the lock is still obeyed. The appender's wake-up of a waiting run reads
its scope's pause in the look-up that finds the run, in the appending
transaction (a scope's pause locks no run: a read under the run's lock
would be ordered after nothing more). A segment already running when a pause
commits finishes: the pause takes effect at the run's next suspension.
"""

from __future__ import annotations

from kumiflow_django.definition.context import new_state
from kumiflow_django.engine.failure import Failure
from kumiflow_django.engine.opening import Opening
from kumiflow_django.engine.restore import retry_point
from kumiflow_django.projections.pauses import scope_paused
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl


def held(run: WorkflowRun) -> bool:
    """Whether no segment of ``run`` may run now (it, its workflow or its tenant is paused).

    Asked under the run's lock, in a statement of its own: a scope's pause
    locks no run, so only a read after the lock sees a pause that committed
    while the caller waited for it (or since it found the run)."""
    return run.paused or scope_paused(run.workflow, run.tenant_id) is not None


def exhausted_pause(
    opening: Opening, row: WorkflowRun | None, failure: Failure
) -> tuple[str, pl.RunPaused] | None:
    """The ``run-paused`` event that replaces ``run-failed`` when a step's
    retries ran out in a workflow defined with ``on_exhausted="pause"`` (None:
    the run fails, or compensates, as usual).

    Only a step's own failure pauses (``compensable``: a step raised after its
    retries, or its task failed for good); a run that cannot go on at all (a
    changed definition, a lost trigger) or whose compensation failed ends failed.

    The run stands where its failed segment began (``restore``, as a retry
    would restore it), with a fresh retry counter: once resumed, the failed
    step runs again with its whole retry policy. ``row`` is the locked run
    (None: a new run, whose first segment failed).
    """
    steps = opening.steps
    if steps is None or steps.workflow.on_exhausted != "pause":
        return None
    if not failure.compensable or failure.compensation is not None:
        return None
    restore: pl.Restore
    if row is None:
        restore = {"status": RunStatus.PENDING, "cursor": None, "state": new_state()}
    else:
        restore = retry_point(row)  # type: ignore[assignment]
    restore["attempt"] = 1
    return ev.RUN_PAUSED, {"failure": failure.payload(), "restore": restore}
