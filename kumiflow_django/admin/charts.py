"""Bar charts as inline SVG, drawn on the server: no script, no library, no CDN.

Colours come from CSS classes (``console.css``), so the charts follow the
admin's light and dark themes. Every bar is a link to the runs behind it
and carries its number in a tooltip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

WIDTH = 600
HEIGHT = 64
AXIS = 14


@dataclass(frozen=True)
class Bar:
    value: int
    label: str  # the bucket, for the tooltip ("10:41 UTC")
    url: str


def bars(
    series: Sequence[Bar], *, css: str, title: str, ticks: Sequence[tuple[int, str]]
) -> SafeString:
    """A bar chart of ``series`` (left to right); ``ticks`` label some bars below."""
    count = max(len(series), 1)
    slot = WIDTH / count
    gap = min(2.0, slot * 0.2)
    peak = max((bar.value for bar in series), default=0) or 1
    plot = HEIGHT - AXIS
    rects = format_html_join(
        "",
        '<a href="{}"><rect class="kf-bar {}" x="{}" y="{}" width="{}" '
        'height="{}"><title>{}: {}</title></rect></a>',
        (
            (
                bar.url,
                css,
                f"{i * slot + gap / 2:.1f}",
                f"{plot - _height(bar.value, peak, plot):.1f}",
                f"{max(slot - gap, 0.5):.1f}",
                f"{_height(bar.value, peak, plot):.1f}",
                bar.label,
                bar.value,
            )
            for i, bar in enumerate(series)
        ),
    )
    labels = format_html_join(
        "",
        '<text class="kf-axis" x="{}" y="{}">{}</text>',
        ((f"{i * slot:.1f}", HEIGHT - 2, text) for i, text in ticks),
    )
    return format_html(
        '<svg class="kf-chart" viewBox="0 0 {} {}" role="img" '
        'aria-label="{}"><line class="kf-baseline" x1="0" y1="{}" x2="{}" y2="{}"></line>'
        "{}{}</svg>",
        WIDTH,
        HEIGHT,
        title,
        plot,
        WIDTH,
        plot,
        rects,
        labels,
    )


def _height(value: int, peak: int, plot: float) -> float:
    if value <= 0:
        return 0.0
    return max(plot * value / peak, 1.5)  # a single run still shows
