"""The definitions runs started on, kept once per fingerprint.

A run stores only its definition's fingerprint. The code that defined it
changes with every deploy, so the console could only draw a run's steps
from whatever definition is registered *now*: a run that called
``crm.example.com`` would show the new URL. So the first run of each
definition version stores that version's canonical form (the data its
fingerprint is the SHA-256 of) and an outline of its steps with their
labels, keyed by the fingerprint; every later run of the version shares the
row.

Definitions are not event-sourced: a snapshot is not a fact about a run but
a copy of code, written once and never changed, so it is a plain table,
not a stream. It lives with the definitions it copies. Rebuilding the
projections does not touch it; losing a row only makes the console fall
back to the registered definition (and say so).

Writing it costs one ``INSERT … ON CONFLICT DO NOTHING`` (``INSERT
IGNORE``, ``INSERT OR IGNORE``) per definition version and process: a
concurrent writer of the same version is not an error, and a process
remembers, after commit, the fingerprints it has stored.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from kumiflow_django.definition.step import Step, get_kind, path_text
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.store import clock, db, limits
from kumiflow_django.store.errors import InvalidEvent
from kumiflow_django.store.models import EngineManager
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.values import to_json

logger = get_logger("kumiflow_django.definition.snapshots")

#: A snapshot larger than this (bytes of JSON) keeps its outline only.
MAX_CANONICAL_BYTES = 4 * 1024 * 1024


class DefinitionSnapshot(models.Model):
    """One workflow definition version, as runs started on it (by fingerprint)."""

    fingerprint = models.CharField(_("definition fingerprint"), max_length=64, primary_key=True)
    workflow = models.CharField(_("workflow"), max_length=limits.WORKFLOW_NAME)
    version = models.CharField(
        _("workflow version"), max_length=limits.WORKFLOW_VERSION, blank=True
    )
    #: The canonical form: the data whose SHA-256 is the fingerprint.
    canonical = models.JSONField(_("canonical form"), default=dict)
    #: The steps as the console draws them (see :func:`outline`).
    outline = models.JSONField(_("outline"), default=dict)
    created_at = models.DateTimeField(_("first run at"))

    objects: ClassVar[models.QuerySet[DefinitionSnapshot, DefinitionSnapshot]] = (
        EngineManager.from_queryset(models.QuerySet)()  # type: ignore[assignment]
    )

    class Meta:
        verbose_name = _("definition snapshot")
        verbose_name_plural = _("definition snapshots")

    def __str__(self) -> str:
        return f"{self.workflow} {self.fingerprint[:12]}"


def _label(step: Step) -> str:
    try:
        return get_kind(step.kind).describe(step)
    except LookupError:
        return step.kind


def _outline_steps(steps: tuple[Step, ...], prefix: tuple[Any, ...]) -> list[dict[str, Any]]:
    nodes = []
    for index, step in enumerate(steps):
        path = (*prefix, index)
        try:
            suspends = get_kind(step.kind).suspends
        except LookupError:
            suspends = False
        nodes.append(
            {
                "path": path_text(path),
                "kind": step.kind,
                "name": step.name,
                "label": _label(step),
                "suspends": suspends,
                "children": {
                    label: _outline_steps(children, (*path, label))
                    for label, children in step.children.items()
                },
            }
        )
    return nodes


def outline(workflow: Workflow) -> dict[str, Any]:
    """The steps of a definition as data the console draws: each step's path,
    kind, name and label (its kind's ``describe()``), and its children."""
    return {
        "workflow": workflow.name,
        "version": workflow.version,
        "fingerprint": workflow.fingerprint,
        "business_key": workflow.business_key,
        "steps": _outline_steps(workflow.steps, ()),
    }


#: (database alias, fingerprint) stored and committed, in this process.
_stored: set[tuple[str, str]] = set()


def forget() -> None:
    """Forget which snapshots this process stored (after ``flush`` emptied the table)."""
    _stored.clear()


def remember(workflow: Workflow) -> None:
    """Store ``workflow``'s snapshot unless this process knows it is stored.

    Runs in the caller's transaction (in a savepoint): the snapshot commits
    with the run that needs it. It never fails the caller: a snapshot that
    cannot be stored is logged, and the console draws the registered
    definition instead.
    """
    key = (db.alias(), workflow.fingerprint)
    if key in _stored:
        return
    try:
        try:
            canonical = to_json(
                workflow.canonical(), "the canonical definition", max_bytes=MAX_CANONICAL_BYTES
            )
        except InvalidEvent:  # too large, or not storable: the outline is what is drawn
            logger.warning("workflow %s: its canonical form is not kept", workflow.name)
            canonical = {}
        row = DefinitionSnapshot(
            fingerprint=workflow.fingerprint,
            workflow=workflow.name,
            version=workflow.version or "",
            canonical=canonical,
            outline=to_json(outline(workflow), "the definition's outline"),
            created_at=clock.now(),
        )
        with db.atomic():
            DefinitionSnapshot.objects.bulk_create([row], ignore_conflicts=True)
    except Exception as exc:
        if db.is_transient(exc):
            raise
        logger.warning("workflow %s: its snapshot is not stored", workflow.name, exc_info=True)
        return
    db.on_commit(lambda: _stored.add(key))


def snapshot(fingerprint: str) -> DefinitionSnapshot | None:
    """The stored snapshot of a definition version, or None."""
    return DefinitionSnapshot.objects.filter(pk=fingerprint).first()
