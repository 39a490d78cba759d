"""The registry of workflow definitions, filled by autodiscovering ``workflows.py``.

Several versions of one workflow may be registered: the one registered last
starts new runs; the others stay available for runs that started on them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kumiflow_django.definition.triggers import CronTrigger, EventTrigger
from kumiflow_django.store.errors import UnknownWorkflow, WorkflowDefinitionError
from kumiflow_django.store.log import handled_types

if TYPE_CHECKING:  # define_workflow() registers into this module's registry
    from kumiflow_django.definition.workflow import Workflow


class WorkflowRegistry:
    def __init__(self) -> None:
        self._versions: dict[str, list[Workflow]] = {}
        self._by_event: dict[str, list[Workflow]] | None = None
        self._awaited: dict[str, list[tuple[str, ...]]] | None = None
        self._in_branches: frozenset[str] = frozenset()

    def register(self, workflow: Workflow) -> None:
        versions = self._versions.setdefault(workflow.name, [])
        for existing in versions:
            if existing.version == workflow.version:
                what = "" if workflow.version is None else f" version {workflow.version!r}"
                raise WorkflowDefinitionError(
                    f"workflow {workflow.name!r}{what} is defined twice "
                    "(give the new definition another version= to keep both)"
                )
        versions.append(workflow)
        self._by_event = self._awaited = None

    def unregister(self, name: str) -> None:
        self._versions.pop(name, None)
        self._by_event = self._awaited = None

    def get(self, name: str) -> Workflow:
        """The current (last registered) version of a workflow."""
        versions = self._versions.get(name)
        if not versions:
            raise UnknownWorkflow(f"no workflow named {name!r} is registered")
        return versions[-1]

    def find(self, name: str, version: str | None) -> Workflow | None:
        for workflow in self._versions.get(name, ()):
            if workflow.version == version:
                return workflow
        return None

    def with_fingerprint(self, name: str, fingerprint: str) -> Workflow | None:
        """The registered version of ``name`` whose definition has this fingerprint."""
        for workflow in self._versions.get(name, ()):
            if workflow.fingerprint == fingerprint:
                return workflow
        return None

    def is_registered(self, name: str) -> bool:
        return bool(self._versions.get(name))

    def current(self) -> list[Workflow]:
        return [versions[-1] for versions in self._versions.values() if versions]

    def all_versions(self) -> list[Workflow]:
        return [w for versions in self._versions.values() for w in versions]

    def for_event(self, event_type: str) -> list[Workflow]:
        """Current workflows started by events of this type."""
        if self._by_event is None:
            index: dict[str, list[Workflow]] = {}
            for workflow in self.current():
                if isinstance(workflow.trigger, EventTrigger):
                    index.setdefault(workflow.trigger.event_type, []).append(workflow)
            self._by_event = index
        return self._by_event.get(event_type, [])

    def awaited_paths(self, event_type: str) -> list[tuple[str, ...]]:
        """The match path sets that waits for this event type use, in any version."""
        if self._awaited is None:
            index: dict[str, set[tuple[str, ...]]] = {}
            in_branches: set[str] = set()
            for workflow in self.all_versions():
                for awaited_type, path_sets in workflow.awaited.items():
                    index.setdefault(awaited_type, set()).update(path_sets)
                in_branches |= workflow.awaited_in_branches
            self._in_branches = frozenset(in_branches)
            self._awaited = {t: sorted(p) for t, p in index.items()}
        return self._awaited.get(event_type, [])

    def awaited_in_branches(self, event_type: str) -> bool:
        """Whether branches of some workflow (in any version) await this event type."""
        if self._awaited is None:
            self.awaited_paths(event_type)
        return event_type in self._in_branches

    def handles_event_type(self, event_type: str) -> bool:
        """Whether a workflow starts on, or waits for, events of this type."""
        return bool(self.for_event(event_type) or self.awaited_paths(event_type))

    def cron_workflows(self) -> list[Workflow]:
        return [w for w in self.current() if isinstance(w.trigger, CronTrigger)]

    @contextlib.contextmanager
    def isolated(self) -> Iterator[WorkflowRegistry]:
        """Swap in an empty registry for the duration (tests define their own workflows)."""
        saved = self._versions
        self._versions = {}
        self._by_event = self._awaited = None
        try:
            yield self
        finally:
            self._versions = saved
            self._by_event = self._awaited = None


registry = WorkflowRegistry()
handled_types.add_source(registry.handles_event_type)
