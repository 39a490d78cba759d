"""A dispatcher killed with SIGKILL mid-delivery: after a restart every request
is delivered; the receiver sees each idempotency key at least once, at most twice."""

from __future__ import annotations

import collections
import signal

import pytest
from django.db import transaction

from kumiflow_django import append_event
from kumiflow_django.models import Dispatch
from tests.processes import spawn, stop, wait_for
from tests.receiver import Receiver, Reply

pytestmark = [pytest.mark.server_db, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ENV = {"KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS": "127.0.0.1", "KUMIFLOW_LEASE_SECONDS": "2"}


def test_a_dispatcher_killed_mid_delivery_delivers_everything_after_a_restart(settings):
    # The step checks the URL where it runs: this process needs the allow-list too.
    settings.KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
    with Receiver(Reply(200, delay=0.3)) as receiver:
        with transaction.atomic():
            for i in range(20):
                append_event(
                    f"batch-{i}", "data.processed", {"webhook_url": receiver.url, "data": {"i": i}}
                )
        assert Dispatch.objects.filter(status="pending").count() == 20

        first = spawn("kumiflow_dispatch", "--max-interval", "0.2", "-v", "0", env=ENV)
        try:
            wait_for(lambda: len(receiver.seen) >= 5, 60, "the first deliveries")
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(30)
        assert Dispatch.objects.exclude(status="delivered").exists(), "killed mid-way"

        workers = [
            spawn("kumiflow_dispatch", "--max-interval", "0.2", "-v", "0", env=ENV)
            for _ in range(2)
        ]
        try:
            wait_for(
                lambda: Dispatch.objects.filter(status="delivered").count() == 20,
                120,
                "all 20 deliveries",
            )
        finally:
            stop(workers)

    seen = collections.Counter(r.headers["Idempotency-Key"] for r in receiver.seen)
    assert set(seen) == {str(d) for d in Dispatch.objects.values_list("id", flat=True)}
    assert max(seen.values()) <= 2
