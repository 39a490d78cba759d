"""How the console writes times, values and statuses: escaped, short, with the time zone.

A time is shown as the local date and time with the zone's abbreviation
and how far it is from now ("in 23 h", "5 min ago"); the exact ISO instant
is in the ``datetime`` attribute and the tooltip. Values (step results,
payloads) are shown as compact JSON, cut, with the whole value one click
away.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from kumiflow_django.store import clock


def relative(moment: datetime, now: datetime | None = None) -> str:
    """``moment`` as a distance from now: "in 23 h", "5 min ago", "now"."""
    delta = moment - (now or clock.now())
    future = delta > timedelta(0)
    seconds = abs(delta.total_seconds())
    if seconds < 1:
        return "now"
    if seconds < 59.5:
        amount = f"{seconds:.0f} s"
    elif seconds < 3570:
        amount = f"{seconds / 60:.0f} min"
    elif seconds < 47.5 * 3600:
        amount = f"{seconds / 3600:.0f} h"
    else:
        amount = f"{seconds / 86400:.0f} d"
    return f"in {amount}" if future else f"{amount} ago"


def duration(seconds: float) -> str:
    """A duration, short: "0.4 ms", "12 ms", "3.1 s", "4 min", "2 h 5 min", "3 d"."""
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    if seconds < 86400:
        hours, rest = divmod(seconds, 3600)
        return f"{hours:.0f} h {rest // 60:.0f} min"
    return f"{seconds / 86400:.1f} d"


def when(moment: datetime | None, *, now: datetime | None = None) -> SafeString | str:
    """A time as the console shows it: local time, zone, and "in 23 h"."""
    if moment is None:
        return ""
    local = timezone.localtime(moment)
    return format_html(
        '<time class="kf-time" datetime="{}" title="{}">{} <span class="kf-tz">{}</span></time>'
        ' <span class="kf-rel">{}</span>',
        moment.isoformat(),
        local.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + f" {local.tzname()}",
        local.strftime("%Y-%m-%d %H:%M:%S"),
        local.tzname() or "",
        relative(moment, now),
    )


def when_short(moment: datetime | None, *, now: datetime | None = None) -> SafeString | str:
    """A time for a narrow list column: "5 min ago" over "2024-05-01 10:00 UTC"."""
    if moment is None:
        return ""
    local = timezone.localtime(moment)
    return format_html(
        '<time class="kf-time kf-short" datetime="{}" title="{}">{}'
        '<span class="kf-abs">{} {}</span></time>',
        moment.isoformat(),
        local.strftime("%Y-%m-%d %H:%M:%S") + f" {local.tzname()}",
        relative(moment, now),
        local.strftime("%Y-%m-%d %H:%M"),
        local.tzname() or "",
    )


def plain_when(moment: datetime | None) -> str:
    """A time as plain text: "2024-05-01 10:00:00 UTC (in 23 h)"."""
    if moment is None:
        return "—"
    local = timezone.localtime(moment)
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()} ({relative(moment)})"


def compact(value: Any, limit: int = 120) -> str:
    """A value as one line of JSON, cut to ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def json_text(value: Any, cap: int) -> str:
    """A value as indented JSON, cut to ``cap`` characters (with a note of the rest)."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if len(text) > cap:
        text = text[:cap] + f"\n… ({len(text) - cap} more characters)"
    return text


def value_details(value: Any, cap: int, *, limit: int = 120) -> SafeString:
    """A value as one line; when it is longer, the whole (capped) value one click away."""
    line = compact(value, limit)
    full = json_text(value, cap)
    if line == full or len(full) <= limit:
        return format_html('<code class="kf-value">{}</code>', line)
    return format_html(
        '<details class="kf-value"><summary><code>{}</code></summary><pre class="kf-json">{}</pre>'
        "</details>",
        line,
        full,
    )
