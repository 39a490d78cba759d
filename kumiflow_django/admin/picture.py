"""A picture of a run's steps: where it is, where it went, what each step gave.

Rendered on the server as nested HTML (no script) from an *outline* of the
definition (:func:`kumiflow_django.definition.snapshots.outline`), which
the console reads from the snapshot of the definition the run started on.
Each step is a box with its label; the steps the run has completed are
marked done, the one it is suspended at (or failed at) is highlighted, and
a :class:`StepNote` per step adds what the run knows of it: its result, how
long it took, the delivery of a mail or webhook.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from kumiflow_django.definition.snapshots import outline
from kumiflow_django.definition.workflow import Workflow

_LABELS = {"then": "if true", "else": "if false", "do": "each / attempt"}


@dataclass
class StepNote:
    """What the run knows of one step: each part is escaped HTML or empty."""

    result: SafeString | str = ""
    duration: str = ""
    extra: list[SafeString | str] = field(default_factory=list)


def render(
    workflow: Workflow | Mapping[str, Any],
    *,
    trail: list[str],
    cursor: list[Any] | None,
    status: str,
    notes: Mapping[str, StepNote] | None = None,
) -> SafeString:
    """The picture of a definition (a ``Workflow`` or its outline) for one run."""
    steps = (outline(workflow) if isinstance(workflow, Workflow) else workflow)["steps"]
    here = ".".join(str(p) for p in cursor) if cursor else None
    return format_html(
        '<ol class="kf-steps">{}</ol>',
        _render_list(steps, set(trail), here, status, notes or {}),
    )


def _render_list(
    steps: list[dict[str, Any]],
    done: set[str],
    here: str | None,
    status: str,
    notes: Mapping[str, StepNote],
) -> SafeString:
    items = []
    for step in steps:
        key = step["path"]
        classes = ["kf-step"]
        marker = ""
        if key == here:
            classes.append("kf-failed" if status == "failed" else "kf-here")
            marker = "✗ failed here" if status == "failed" else "● here"
        elif key in done:
            classes.append("kf-done")
            marker = "✓"
        note = notes.get(key) or StepNote()
        children = format_html_join(
            "",
            '<div class="kf-branch"><span class="kf-branch-label">{}</span><ol>{}</ol></div>',
            (
                (_LABELS.get(name, name), _render_list(kids, done, here, status, notes))
                for name, kids in step["children"].items()
            ),
        )
        name = (
            format_html(' <span class="kf-name">→ {}</span>', step["name"]) if step["name"] else ""
        )
        took = (
            format_html(' <span class="kf-took">{}</span>', note.duration) if note.duration else ""
        )
        result = format_html('<div class="kf-result">{}</div>', note.result) if note.result else ""
        extra = format_html_join("", '<div class="kf-extra">{}</div>', ((x,) for x in note.extra))
        items.append(
            format_html(
                '<li class="{}" data-path="{}"><span class="kf-path">{}</span> '
                '<span class="kf-label">{}</span>{} <span class="kf-marker">{}</span>{}{}{}{}</li>',
                " ".join(classes),
                key,
                key,
                step["label"],
                name,
                marker,
                took,
                result,
                extra,
                children,
            )
        )
    return mark_safe("".join(items))  # noqa: S308 - every part above is escaped by format_html


def find(steps: list[dict[str, Any]], path: str) -> dict[str, Any] | None:
    """The outline node of a step path, or None."""
    for step in steps:
        if step["path"] == path:
            return step
        for kids in step["children"].values():
            found = find(kids, path)
            if found is not None:
                return found
    return None
