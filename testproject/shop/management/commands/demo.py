"""The project's main job: a short end-to-end story told on the configured database."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand

from kumiflow_django import VersionConflict, append_event, load_stream, read_log


class Command(BaseCommand):
    help = "Tell the kumiflow-django story on the configured database."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--superuser-only", action="store_true", help="Only create the admin user."
        )

    def handle(self, *args: Any, superuser_only: bool = False, **options: Any) -> None:
        if superuser_only:
            return
        out = self.stdout
        user_id = f"user-{uuid.uuid4().hex[:8]}"
        stream = f"customer-{user_id}"
        out.write(self.style.MIGRATE_HEADING("1. A domain event is appended to the log"))
        first = append_event(
            stream, "user.signed-up", {"user_id": user_id, "email": f"{user_id}@example.com"}
        )
        out.write(f"   appended {first}")

        out.write(self.style.MIGRATE_HEADING("2. The log, read from that position"))
        out.write(f"   {'position':>8}  {'stream':<24} {'v':>2}  type")
        for event in read_log(after=first.position - 1):
            out.write(
                f"   {event.position:>8}  {event.stream_id:<24} {event.version:>2}  {event.type}"
            )

        out.write(self.style.MIGRATE_HEADING("3. Two writers, one expected version"))
        append_event(stream, "user.email-confirmed", {"user_id": user_id}, expected_version=1)
        out.write("   writer A appended at expected version 1: ok")
        try:
            append_event(stream, "user.renamed", {"user_id": user_id}, expected_version=1)
        except VersionConflict as exc:
            out.write(f"   writer B refused: VersionConflict: {exc}")
        else:  # pragma: no cover - the story would be wrong
            raise SystemExit("writer B was not refused")
        versions = [e.version for e in load_stream(stream)]
        out.write(f"   the stream holds versions {versions}: no gap, no duplicate")
        out.write(self.style.SUCCESS("Done."))
