"""Running the project's commands in child processes against the test database."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def database_url() -> str:
    """The URL of the database the tests run on (the test database, not the main one)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    scheme = {"postgresql": "postgres", "mysql": "mysql"}[connection.vendor]
    auth = quote(s["USER"] or "")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"])
    return f"{scheme}://{auth}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``manage.py <args>``; its output goes to a file (a pipe could fill up)."""
    environment = {**os.environ, "DATABASE_URL": database_url(), **(env or {})}
    log = tempfile.NamedTemporaryFile(prefix="kumiflow-proc-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    proc.log_path = log.name  # type: ignore[attr-defined]
    says_started = args and not _quiet(args)  # -v 0 prints warnings only
    proc.ready = READY.get(args[0]) if says_started else None  # type: ignore[attr-defined]
    return proc


def _quiet(args: tuple[str, ...]) -> bool:
    words = list(args)
    for i, word in enumerate(words):
        if word in ("-v", "--verbosity") and i + 1 < len(words) and words[i + 1] == "0":
            return True
        if word in ("-v0", "--verbosity=0"):
            return True
    return False


#: What a command prints once its signal handlers are in place: a SIGTERM
#: before that line kills the process (-15) instead of stopping it.
READY = dict.fromkeys(
    ("kumiflow_worker", "kumiflow_tasks", "kumiflow_resume", "kumiflow_cron", "kumiflow_dispatch"),
    "loop started",
)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def stop(procs: list[subprocess.Popen[bytes]], timeout: float = 30) -> list[int]:
    """SIGTERM each process (once it is ready for it) and return the exit codes."""
    for proc in procs:
        ready: str | None = getattr(proc, "ready", None)
        if ready:
            with contextlib.suppress(AssertionError):  # not ready after a minute: stop it anyway
                wait_for(_printed(proc, ready), 60, f"{ready!r}")
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()  # reaped: an unreaped child warns when it is collected, in a later test
            codes.append(-9)
    return codes


def _printed(proc: subprocess.Popen[bytes], line: str) -> Callable[[], bool]:
    """Whether ``proc`` printed ``line`` (or ended)."""
    return lambda: proc.poll() is not None or line in output(proc)


def output(proc: subprocess.Popen[bytes]) -> str:
    return Path(proc.log_path).read_text(errors="replace")  # type: ignore[attr-defined]
