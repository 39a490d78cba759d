"""A PgBouncer of the test's own, from Debian's package, in front of the local PostgreSQL.

Started on a free loopback port with a generated configuration (``auth_type
= trust``, the pool mode asked for) and stopped when the block ends. Where
the binary is missing the test is skipped, unless
``KUMIFLOW_REQUIRE_PGBOUNCER=1`` (CI), which fails it instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

BINARY = os.environ.get("KUMIFLOW_PGBOUNCER") or shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


@contextlib.contextmanager
def pgbouncer(pool_mode: str, *, server_port: int = 5432, user: str = "postgres") -> Iterator[int]:
    """Run PgBouncer in ``pool_mode`` in front of 127.0.0.1:``server_port``; yield its port."""
    if not Path(BINARY).is_file():
        message = "PgBouncer is not installed (apt-get install pgbouncer)"
        if os.environ.get("KUMIFLOW_REQUIRE_PGBOUNCER"):
            pytest.fail(message)
        pytest.skip(message)
    directory = Path(tempfile.mkdtemp(prefix="kumiflow-pgbouncer-"))
    directory.chmod(0o755)  # PgBouncer refuses to run as root: it runs as `user`
    port = _free_port()
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    (directory / "pgbouncer.ini").write_text(
        f"""[databases]
* = host=127.0.0.1 port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "users.txt"}
pool_mode = {pool_mode}
max_client_conn = 200
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,options
"""
    )
    for path in directory.iterdir():
        path.chmod(0o644)
    command = [BINARY, str(directory / "pgbouncer.ini")]
    if os.geteuid() == 0:
        command[1:1] = ["-u", user]
    log = (directory / "pgbouncer.log").open("wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while not _accepts(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "PgBouncer did not start: " + (directory / "pgbouncer.log").read_text()
                )
            time.sleep(0.05)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)  # immediate shutdown (PgBouncer before 1.23)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
