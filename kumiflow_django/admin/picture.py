"""A picture of a workflow's steps for the admin: where a run is, where it went.

Rendered on the server as nested HTML (no script): each step is a box with
its label; the steps the run has completed are marked done, the one it is
suspended at (or failed at) is highlighted.
"""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from kumiflow_django.definition.step import Step, get_kind
from kumiflow_django.definition.workflow import Workflow

_LABELS = {"then": "if true", "else": "if false", "do": "each / attempt"}


def _path(parts: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in parts)


def render(
    workflow: Workflow,
    *,
    trail: list[str],
    cursor: list[Any] | None,
    status: str,
) -> SafeString:
    done = set(trail)
    here = _path(tuple(cursor)) if cursor else None
    return format_html(
        '<ol class="kf-steps">{}</ol>', _render_list(workflow.steps, (), done, here, status)
    )


def _render_list(
    steps: tuple[Step, ...], prefix: tuple[Any, ...], done: set[str], here: str | None, status: str
) -> SafeString:
    items = []
    for index, step in enumerate(steps):
        path = (*prefix, index)
        key = _path(path)
        classes = ["kf-step"]
        marker = ""
        if key == here:
            classes.append("kf-failed" if status == "failed" else "kf-here")
            marker = "✗ failed here" if status == "failed" else "● here"
        elif key in done:
            classes.append("kf-done")
            marker = "✓"
        try:
            label = get_kind(step.kind).describe(step)
        except LookupError:
            label = step.kind
        children = format_html_join(
            "",
            '<div class="kf-branch"><span class="kf-branch-label">{}</span><ol>{}</ol></div>',
            (
                (_LABELS.get(name, name), _render_list(kids, (*path, name), done, here, status))
                for name, kids in step.children.items()
            ),
        )
        name = format_html(' <span class="kf-name">→ {}</span>', step.name) if step.name else ""
        items.append(
            format_html(
                '<li class="{}" data-path="{}"><span class="kf-path">{}</span> '
                '<span class="kf-label">{}</span>{} <span class="kf-marker">{}</span>{}</li>',
                " ".join(classes),
                key,
                key,
                label,
                name,
                marker,
                children,
            )
        )
    return mark_safe("".join(items))  # noqa: S308 - every part above is escaped by format_html
