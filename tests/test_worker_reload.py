"""``kumiflow_worker --reload``: a changed file restarts the worker, as
``runserver`` restarts the web process; the old worker stops cleanly first."""

from __future__ import annotations

import os
import signal
import time

import pytest

from kumiflow_django.models import WorkerProcess
from tests.processes import ROOT, output, spawn, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server_db]

WATCHED = ROOT / "testproject" / "shop" / "workflows.py"


def _worker_pids() -> list[int]:
    return list(WorkerProcess.objects.values_list("pid", flat=True))


def test_a_changed_file_restarts_the_worker():
    proc = spawn(
        "kumiflow_worker", "--reload", "--no-cron", "--no-dispatch", "--max-interval", "0.2"
    )
    try:
        wait_for(
            lambda: proc.poll() is not None or bool(_worker_pids()), 60, "the worker's heartbeat"
        )
        assert proc.poll() is None, output(proc)
        [first] = _worker_pids()
        assert first != proc.pid, "the worker runs in the child the reloader restarts"

        touched = [time.time()]

        def restarted() -> bool:
            # The reloader notes each file's time at its first look: touch it
            # (later each poll) until the restarted worker's row is there.
            touched[0] += 1
            os.utime(WATCHED, (touched[0], touched[0]))
            pids = _worker_pids()
            return bool(pids) and first not in pids

        wait_for(restarted, 60, "the worker to restart")
        [second] = _worker_pids()
        assert second != first
        # The row is written before the loops start: wait for the second start.
        wait_for(lambda: output(proc).count("resume loop started") == 2, 60, "the loops again")
    finally:
        for pid in _worker_pids():
            os.kill(pid, signal.SIGTERM)  # the child: it stops cleanly, then the reloader exits
        code = proc.wait(60)
        os.utime(WATCHED)  # its time back to now
    assert code == 0, output(proc)
    assert not WorkerProcess.objects.exists(), "the stopped worker deleted its row"
