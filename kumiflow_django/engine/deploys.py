"""What a deploy does to the runs in flight: decided once, for the resume and the plan.

:func:`decide` says, for one run, which definition it continues on when it
resumes in this process (the registered one with its fingerprint, or the
current one when the change is compatible for it and its workflow's
``on_change`` allows) or why it cannot. ``engine.resuming._definition``
acts on the answer; :class:`DeployPlan` (``manage.py kumiflow_plan``, the
system check ``kumiflow.W080``) asks the same question of every run in
flight, without resuming any, so the plan and the deploy cannot disagree.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count

from kumiflow_django.definition import serving
from kumiflow_django.definition.compatibility import (
    Classification,
    Outcome,
    Position,
    classify,
)
from kumiflow_django.definition.fingerprint import fingerprint as digest
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.snapshots import DefinitionSnapshot, snapshot
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.projections.runs import SUSPENDED, RunStatus, WorkflowRun
from kumiflow_django.store import payloads as pl

#: A run that has not ended (``running``: a segment of it is in progress).
IN_FLIGHT = (*SUSPENDED, RunStatus.RUNNING)


class Fate(enum.StrEnum):
    """What happens to a run in flight when it next resumes in this process."""

    UNCHANGED = "unchanged"  # its definition is the current one
    CARRIED_ON = "carried on"  # onto the current definition (a compatible change)
    PINNED = "pinned"  # its own definition is still registered (an older version)
    FAILS = "will fail"
    WAITS = "waits for a worker"  # no definition of its workflow here


@dataclass(frozen=True)
class Decision:
    fate: Fate
    #: The definition the run continues on (None when it cannot).
    workflow: Workflow | None = None
    classification: Classification | None = None
    #: Why it cannot continue here (the failure's text), or how it continues.
    why: str = ""

    def switched(self, run: RunFacts) -> pl.DefinitionSwitched | None:
        """The ``definition-switched`` payload when the run moves to another definition."""
        if self.fate != Fate.CARRIED_ON or self.workflow is None:
            return None
        return {
            "from_fingerprint": run.fingerprint,
            "to_fingerprint": self.workflow.fingerprint,
            "from_version": run.version,
            "to_version": self.workflow.version,
            "classification": str(self.classification.outcome)
            if self.classification is not None
            else str(Outcome.COMPATIBLE),
        }


@dataclass(frozen=True)
class RunFacts:
    """What :func:`decide` reads of a run (its row's columns)."""

    id: uuid.UUID | str
    workflow: str
    fingerprint: str
    version: str | None
    status: str
    cursor: Sequence[Any] | None
    trail: Sequence[str] = ()

    @classmethod
    def of(cls, run: WorkflowRun) -> RunFacts:
        return cls(
            id=run.id,
            workflow=run.workflow,
            fingerprint=run.fingerprint,
            version=run.workflow_version or None,
            status=run.status,
            cursor=run.cursor,
            trail=tuple(run.trail or ()),
        )


Snapshots = Callable[[str], DefinitionSnapshot | None]


#: Canonical forms by fingerprint, checked (a fingerprint names one form for
#: good): a deploy that carries many runs on reads and hashes each once.
_canonical: dict[str, Mapping[str, Any]] = {}
_CANONICAL_CACHE = 64


def _remembered(fingerprint: str, canonical: Mapping[str, Any]) -> Mapping[str, Any]:
    if len(_canonical) >= _CANONICAL_CACHE:
        _canonical.clear()
    _canonical[fingerprint] = canonical
    return canonical


def stored_canonical(found: DefinitionSnapshot | None, fingerprint: str) -> Mapping[str, Any]:
    """A snapshot's canonical form if it is the definition of ``fingerprint``
    (empty otherwise: not kept, or not what the run ran)."""
    if found is None or not found.canonical:
        return {}
    canonical: Mapping[str, Any] = found.canonical
    return _remembered(fingerprint, canonical) if digest(canonical) == fingerprint else {}


def _old(fingerprint: str, snapshots: Snapshots) -> Mapping[str, Any]:
    known = _canonical.get(fingerprint)
    return known if known is not None else stored_canonical(snapshots(fingerprint), fingerprint)


def _new(workflow: Workflow) -> Mapping[str, Any]:
    known = _canonical.get(workflow.fingerprint)
    return known if known is not None else _remembered(workflow.fingerprint, workflow.canonical())


def _short(fingerprint: str) -> str:
    return f"{fingerprint[:12]}…"


def _older_hint(run: RunFacts, current: Workflow, snapshots: Snapshots) -> str:
    """A sentence when the run's definition looks newer than this process's."""
    theirs = snapshots(run.fingerprint)
    ours = snapshots(current.fingerprint)
    if theirs is None or ours is None or ours.created_at >= theirs.created_at:
        return ""
    return (
        " The run's definition was first used after the one registered here: this "
        "process may be older than the run; restart it with the current code, and the "
        "run continues there."
    )


def decide(run: RunFacts, *, snapshots: Snapshots = snapshot) -> Decision:
    """Which definition ``run`` continues on in this process, or why it cannot."""
    if not registry.is_registered(run.workflow):
        return Decision(
            Fate.WAITS,
            why=f'Workflow "{run.workflow}" is not registered in this process.',
        )
    current = registry.get(run.workflow)
    own = registry.with_fingerprint(run.workflow, run.fingerprint)
    if own is not None:
        return Decision(Fate.UNCHANGED if own is current else Fate.PINNED, own)
    if run.status == RunStatus.QUEUED:  # nothing of it ran: it starts on the current one
        return Decision(Fate.CARRIED_ON, current, Classification(Outcome.COMPATIBLE))
    head = (
        f'Workflow "{run.workflow}": the run\'s definition {_short(run.fingerprint)}'
        + (f" (version {run.version})" if run.version else "")
        + f" differs from the one registered here ({_short(current.fingerprint)}"
        + (f", version {current.version}" if current.version else "")
        + "), and is not registered in this process."
    )
    hint = _older_hint(run, current, snapshots)
    if current.on_change == "fail":
        return Decision(Fate.FAILS, why=f'{head} on_change="fail": such a run fails.{hint}'.strip())
    if current.on_change == "pin":
        return Decision(
            Fate.FAILS,
            why=(
                f'{head} on_change="pin": it continues only on its own definition; keep that '
                f"registered with its version= until its runs drain.{hint}"
            ),
        )
    found = classify(
        _old(run.fingerprint, snapshots), _new(current), Position(run.cursor, run.trail)
    )
    if found.compatible:
        return Decision(Fate.CARRIED_ON, current, found, found.describe())
    return Decision(
        Fate.FAILS,
        classification=found,
        why=(
            f"{head} The change is incompatible for this run: {found.describe()}. Keep the "
            "old definition registered with its version= until its runs drain "
            f"(docs/deploying.md).{hint}"
        ),
    )


# --- the plan -----------------------------------------------------------------


#: Whether a live worker process serves a fingerprint now. The default asks the
#: heartbeat rows (``definition.serving.Served``), read once per plan.
Served = Callable[[str], bool]


def live_workers() -> Served:
    """What the live worker processes serve, read now (their heartbeat rows)."""
    served = serving.Served.read()
    return lambda fingerprint: fingerprint in served.fingerprints


def _takes_over(workflows: Iterable[str]) -> frozenset[str]:
    """The fingerprints this code takes runs over from once no live worker
    serves them: the claim rule's (``definition.serving.claimable``), asked as
    if no other worker lived. A definition first seen after this code's is
    newer: its runs wait for a worker of their release, never for this code."""
    if not workflows:
        return frozenset()
    fingerprints, _ = serving.claimable(serving.Served(frozenset(), {}))
    return fingerprints


@dataclass
class Group:
    """Runs of one workflow and definition, at one position, with one fate."""

    workflow: str
    fingerprint: str
    version: str | None
    position: str  # a step path, "the start", or "any" (the fate does not depend on it)
    fate: Fate
    count: int
    sample: str  # one run id
    why: str = ""
    #: A live worker process serves the definition now: it keeps the runs
    #: while it lives, and ``fate`` is what this code does once none does.
    served: bool = False

    def as_data(self) -> dict[str, Any]:
        return {
            "workflow": self.workflow,
            "fingerprint": self.fingerprint,
            "version": self.version,
            "position": self.position,
            "fate": str(self.fate),
            "count": self.count,
            "sample": self.sample,
            "why": self.why,
            "served_by_live_worker": self.served,
        }


@dataclass
class DeployPlan:
    """What the registered definitions will do to the runs in flight.

    ``limit`` caps the runs read one by one (those whose definition is not
    registered here, which need their position); the counts of the others
    come from one grouped query. ``served`` says which fingerprints live
    worker processes serve (default: their heartbeat rows, read once).

    The fate is what this code does to a run when the run is its to resume:
    a run that a live worker (of the old release) serves stays there while
    that worker lives (``Group.served``), and its fate applies once none
    does. A run that would fail is counted as failing even while an old
    worker keeps it: stopping that worker is the deploy.
    """

    served: Served | None = None
    limit: int | None = None
    #: Whether ``limit`` left runs unread.
    truncated: bool = field(default=False, init=False)
    _live: Served = field(default=lambda fingerprint: False, init=False, repr=False)

    def groups(self, *, samples: bool = True) -> list[Group]:
        """The plan. ``samples=False`` leaves the groups of runs that need no
        reading one by one without a sample (the startup check: one query)."""
        self.truncated = False
        self._live = self.served or live_workers()
        cache: dict[str, DefinitionSnapshot | None] = {}

        def snapshots(fingerprint: str) -> DefinitionSnapshot | None:
            if fingerprint not in cache:
                cache[fingerprint] = snapshot(fingerprint)
            return cache[fingerprint]

        found: list[Group] = []
        to_read: list[tuple[str, str]] = []
        rows = (
            WorkflowRun.objects.filter(status__in=IN_FLIGHT)
            .values_list("workflow", "fingerprint")
            .annotate(runs=Count("id"))
            .order_by("workflow", "fingerprint")
        )
        for workflow, fingerprint, count in rows:
            own = registry.with_fingerprint(workflow, fingerprint)
            if own is not None or not registry.is_registered(workflow):
                found.append(self._whole(workflow, fingerprint, own, count, samples))
            else:
                to_read.append((workflow, fingerprint))
        takes = _takes_over({workflow for workflow, _ in to_read})
        budget = self.limit
        for workflow, fingerprint in to_read:
            if fingerprint not in takes:
                found.extend(self._newer(workflow, fingerprint, samples))
                continue
            if budget is not None and budget <= 0:
                self.truncated = True
                break
            read = self._positions(workflow, fingerprint, budget, snapshots)
            found.extend(read[0])
            if budget is not None:
                budget -= read[1]
        return found

    def _whole(
        self, workflow: str, fingerprint: str, own: Workflow | None, count: int, samples: bool
    ) -> Group:
        """The runs of a definition this process has, or of a workflow it lacks."""
        sample, version = "", None
        if samples:
            first = (
                WorkflowRun.objects.filter(
                    status__in=IN_FLIGHT, workflow=workflow, fingerprint=fingerprint
                )
                .order_by("started_at")
                .values_list("id", "workflow_version")
                .first()
            )
            if first is not None:
                sample, version = str(first[0]), first[1] or None
        elif own is not None:
            version = own.version
        served = self._served(fingerprint)
        if own is None:
            why = _waits(served, f'workflow "{workflow}" is not registered in this code')
            fate = Fate.WAITS
        else:
            fate = Fate.UNCHANGED if own is registry.get(workflow) else Fate.PINNED
            why = ""
        return Group(workflow, fingerprint, version, "any", fate, count, sample, why, served)

    def _served(self, fingerprint: str) -> bool:
        return self._live(fingerprint)

    def _newer(self, workflow: str, fingerprint: str, samples: bool) -> list[Group]:
        """Runs of a definition newer than this code's: they wait for their release."""
        runs = WorkflowRun.objects.filter(
            status__in=IN_FLIGHT, workflow=workflow, fingerprint=fingerprint
        ).order_by("started_at")
        first = runs.values_list("id", "workflow_version").first() if samples else None
        why = _waits(
            self._served(fingerprint),
            "the definition was first seen after the one registered here (a newer release)",
        )
        return [
            Group(
                workflow,
                fingerprint,
                (first[1] or None) if first else None,
                "any",
                Fate.WAITS,
                runs.count(),
                str(first[0]) if first else "",
                why,
                self._served(fingerprint),
            )
        ]

    def _positions(
        self,
        workflow: str,
        fingerprint: str,
        budget: int | None,
        snapshots: Snapshots,
    ) -> tuple[list[Group], int]:
        """The runs of a definition this process lacks, one decision per position."""
        runs = (
            WorkflowRun.objects.filter(
                status__in=IN_FLIGHT, workflow=workflow, fingerprint=fingerprint
            )
            .order_by("started_at", "id")
            .values_list("id", "workflow_version", "status", "cursor", "trail")
        )
        if budget is not None:
            runs = runs[: budget + 1]
        groups: dict[tuple[str, Fate, str], Group] = {}
        decided: dict[tuple[Any, ...], Decision] = {}
        read = 0
        for run_id, version, status, cursor, trail in runs.iterator(chunk_size=500):
            if budget is not None and read >= budget:
                self.truncated = True
                break
            read += 1
            facts = RunFacts(
                run_id, workflow, fingerprint, version or None, status, cursor, tuple(trail or ())
            )
            queued = status == RunStatus.QUEUED
            key = (queued, _text(cursor), facts.trail, version)
            decision = decided.get(key)
            if decision is None:
                decision = decided[key] = decide(facts, snapshots=snapshots)
            served = self._served(fingerprint) and not queued
            where = "the start" if queued or not cursor else _text(cursor)
            group_key = (where, decision.fate, decision.why)
            group = groups.get(group_key)
            if group is None:
                groups[group_key] = Group(
                    workflow,
                    fingerprint,
                    version or None,
                    where,
                    decision.fate,
                    1,
                    str(run_id),
                    decision.why,
                    served,
                )
            else:
                group.count += 1
        return list(groups.values()), read

    def failing(self, groups: Iterable[Group] | None = None) -> int:
        """How many runs in flight would fail (of ``groups``, or of a plan read now)."""
        found = self.groups(samples=False) if groups is None else groups
        return sum(g.count for g in found if g.fate == Fate.FAILS)


def _waits(served: bool, why: str) -> str:
    if served:
        return f"{why}; a live worker serves it and runs it"
    return (
        f"{why}; no live worker serves it: it fails after "
        "KUMIFLOW_UNKNOWN_DEFINITION_GRACE unless one comes"
    )


def _text(cursor: Any) -> str:
    return ".".join(str(p) for p in cursor) if cursor else ""
