"""The worker processes in the console: which are live, and which definitions each serves.

Read-only: a row is written by its process's heartbeat and deleted when the
process stops (or pruned when it went stale).
"""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

from kumiflow_django.admin.base import ReadOnlyAdmin
from kumiflow_django.definition.serving import WorkerProcess, live


@admin.register(WorkerProcess)
class WorkerProcessAdmin(ReadOnlyAdmin):
    """Live worker processes (a rolling deploy shows old and new side by side)."""

    list_display = ["worker_id", "host", "pid", "started_at", "last_seen", "is_live", "serves"]
    search_fields = ["worker_id", "host"]
    ordering = ["-started_at"]

    @admin.display(boolean=True, description="live")
    def is_live(self, obj: WorkerProcess) -> bool:
        return live().filter(pk=obj.pk).exists()

    @admin.display(description="definitions served")
    def serves(self, obj: WorkerProcess) -> SafeString:
        return format_html_join(
            ", ",
            "<code>{}</code> {}{}",
            (
                (
                    d["fingerprint"][:12],
                    d["workflow"],
                    f" v{d['version']}" if d.get("version") else "",
                )
                for d in obj.definitions
            ),
        )
