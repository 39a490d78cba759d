"""A streaming standby of the local PostgreSQL, made by the test itself.

``pg_basebackup -R`` copies the server at 127.0.0.1:5432 (the test database
included) into a temporary directory; the copy starts on a port of its own as
the ``postgres`` OS user and replays the primary's WAL. Skipped where that
cannot work (not PostgreSQL, not root, no binaries, no replication entry in
the primary's pg_hba.conf) unless ``KUMIFLOW_REQUIRE_REPLICA=1`` (CI), which
fails instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

#: Settings a hot standby must have at least as high as its primary.
COPIED = (
    "max_connections",
    "max_worker_processes",
    "max_wal_senders",
    "max_prepared_transactions",
    "max_locks_per_transaction",
)


def unavailable(reason: str) -> None:
    if os.environ.get("KUMIFLOW_REQUIRE_REPLICA"):
        pytest.fail(f"KUMIFLOW_REQUIRE_REPLICA is set: {reason}")
    pytest.skip(reason)


def binaries() -> Path | None:
    root = Path("/usr/lib/postgresql")
    found = sorted(root.glob("*/bin/pg_ctl")) if root.is_dir() else []
    return found[-1].parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(test: Callable[[], Any], bound: float, what: str) -> Any:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if value := test():
            return value
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {bound:.0f} s")


def _as_postgres(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", "postgres", "--", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        **kwargs,
    )


def _one(row: Any) -> Any:
    assert row is not None
    return row[0]


@contextlib.contextmanager
def standby(primary: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A standby of the server of ``primary`` (Django's settings of the test
    database); yields its psycopg connection parameters."""
    import psycopg

    if (
        primary.get("HOST") not in ("127.0.0.1", "localhost")
        or str(primary.get("PORT") or 5432) != "5432"
    ):
        unavailable("the standby is made from the local PostgreSQL at 127.0.0.1:5432")
    bindir = binaries()
    if bindir is None or os.geteuid() != 0 or shutil.which("runuser") is None:
        unavailable("a standby needs root, runuser and PostgreSQL's binaries")
    assert bindir is not None
    source: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 5432,
        "user": primary.get("USER") or "postgres",
    }
    with psycopg.connect(**source, dbname=primary["NAME"], autocommit=True) as conn:
        limits = {name: _one(conn.execute(f"SHOW {name}").fetchone()) for name in COPIED}
        conn.execute("CHECKPOINT")
    directory = Path(tempfile.mkdtemp(prefix="kumiflow-standby-"))
    shutil.chown(directory, "postgres", "postgres")
    data = directory / "data"
    port = free_port()
    started = False
    try:
        copy = _as_postgres(
            [str(bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p", "5432"]
            + ["-U", str(source["user"]), "-D", str(data), "-R", "-X", "stream"]
            + ["--checkpoint=fast", "--no-sync"]
        )
        if copy.returncode:
            unavailable(
                "pg_basebackup failed (the primary needs max_wal_senders > 0 and "
                '"host replication all 127.0.0.1/32 trust" in pg_hba.conf; .ci/run '
                f"adds it): {copy.stderr.strip()}"
            )
        settings = [
            f"port = {port}",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{directory}'",
            "hot_standby = on",
            "shared_buffers = 16MB",
            "fsync = off",
            *(f"{name} = {value}" for name, value in limits.items()),
        ]
        (data / "postgresql.conf").write_text("\n".join(settings) + "\n")
        (data / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
        for name in ("postgresql.conf", "pg_hba.conf"):
            shutil.chown(data / name, "postgres", "postgres")
        log = directory / "standby.log"
        start = _as_postgres(
            [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "start"]
        )
        started = True
        if start.returncode:
            raise RuntimeError(f"the standby did not start: {start.stderr}{log.read_text()}")
        params = {**source, "port": port, "dbname": primary["NAME"]}

        def streaming() -> bool:
            with psycopg.connect(**params, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT pg_is_in_recovery(), status FROM pg_stat_wal_receiver"
                ).fetchone()
            return row is not None and row[0] and row[1] == "streaming"

        wait_for(streaming, 60, "the standby to stream from the primary")
        yield params
    finally:
        if started:
            _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"])
        shutil.rmtree(directory, ignore_errors=True)
