"""The search attribute index: one ``RunAttribute`` row per attribute of a run.

A run's attributes are folded into its row (``WorkflowRun.attributes``, from
``run-started`` and ``attributes-set``); this table indexes them so that
"the runs of customer C-17, newest first" is one range of one B-tree index
``(name, value, top, started_at, run_id)`` on every database alike, whatever the number
of runs (a JSON expression index would differ per vendor, and MariaDB has
none). The rows are derived from the run row, never from anything else:
written in the same transaction as every write of the run stream
(:func:`sync`, the run stream's ``after_write``), rebuilt from the rows by
``kumiflow_rebuild`` and an archive's restore (:func:`reindex`), deleted
with the run by retention.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from kumiflow_django.definition.attributes import as_text
from kumiflow_django.store import limits, sql
from kumiflow_django.store.models import EngineManager

if TYPE_CHECKING:
    from kumiflow_django.projections.stream import Change


class RunAttribute(models.Model):
    run_id = models.UUIDField(_("run"))
    tenant_id = models.CharField(_("tenant"), max_length=limits.TENANT)
    workflow = models.CharField(_("workflow"), max_length=limits.WORKFLOW_NAME)
    name = models.CharField(_("name"), max_length=limits.ATTRIBUTE_NAME)
    #: The value as text (``as_text``): what a filter compares.
    value = models.CharField(_("value"), max_length=limits.ATTRIBUTE_VALUE)
    #: The run's start (it never changes): a filtered list, newest first, is
    #: read in index order, a page at a time.
    started_at = models.DateTimeField(_("run started at"))
    #: Whether the run has no parent (it never changes): the run list hides
    #: child runs, and counts a filtered list's runs from this index alone,
    #: without reading a run row (see :func:`matching`).
    top = models.BooleanField(_("top-level run"), default=True)

    objects: ClassVar[EngineManager[RunAttribute]] = EngineManager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("search attribute")
        verbose_name_plural = _("search attributes")
        constraints = [
            models.UniqueConstraint(fields=["run_id", "name"], name="kumiflow_attr_run_name_uq"),
        ]
        indexes = [
            # run_id last: the top-level runs of a value are counted, and their
            # ids read, from the index alone.
            models.Index(
                fields=["name", "value", "top", "-started_at", "run_id"],
                name="kumiflow_attr_top_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}={self.value} (run {self.run_id})"


def _rows(run: Any) -> list[RunAttribute]:
    return [
        RunAttribute(
            run_id=run.id,
            tenant_id=run.tenant_id,
            workflow=run.workflow,
            name=name,
            value=as_text(value),
            started_at=run.started_at,
            top=run.parent_id is None,
        )
        for name, value in sorted((run.attributes or {}).items())
    ]


def sync(changes: list[Change[Any]]) -> None:
    """Bring the index in line with the changed run rows (a new run's
    attributes inserted; a run whose attributes changed re-indexed)."""
    new: list[RunAttribute] = []
    changed: list[uuid.UUID] = []
    for change in changes:
        row = change.saved
        if change.new:
            new += _rows(row)
            continue
        before = change.before or {}
        loaded = row.__dict__
        if "attributes" not in loaded:
            continue  # a partial row without its attributes: no event changed them
        if (before.get("attributes") or {}) != (loaded["attributes"] or {}):
            changed.append(row.id)
            new += _rows(row)
    if changed:
        RunAttribute.objects.filter(run_id__in=changed).delete()
    if new:
        RunAttribute.objects.bulk_create(new)


def reindex(runs: Sequence[Any], *, fresh: bool = False) -> int:
    """Index these run rows again (``fresh``: the table holds none of theirs)."""
    if not fresh:
        ids = [run.id for run in runs]
        for i in range(0, len(ids), 500):
            RunAttribute.objects.filter(run_id__in=ids[i : i + 500]).delete()
    rows = [row for run in runs for row in _rows(run)]
    RunAttribute.objects.bulk_create(rows, batch_size=1000)
    return len(rows)


def forget(run_ids: Iterable[uuid.UUID]) -> int:
    """Delete the index rows of runs that are deleted."""
    return RunAttribute.objects.filter(run_id__in=list(run_ids)).delete()[0]


def matching(
    name: str, value: str | int | bool, *, top_only: bool = False
) -> models.QuerySet[RunAttribute, Any]:
    """The ids of the runs whose attribute ``name`` has ``value`` (a subquery;
    ``top_only``: of the runs without a parent only). A run has one row per
    attribute name, so counting these rows counts the runs."""
    text = value if isinstance(value, str) else as_text(value)
    # The index range finds the candidates its collation deems equal; on
    # MariaDB a byte comparison keeps the exact ones ("abc" is not "ABC").
    qs = RunAttribute.objects.filter(sql.exact_in("value", [text]), name=name)
    if top_only:
        qs = qs.filter(top=True)
    return qs.values("run_id")
