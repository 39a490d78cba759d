"""A real ASGI server (uvicorn) on the test database, and a small SSE client for it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import requests

from tests.processes import ROOT, database_url, wait_for


class Server:
    """``uvicorn testproject.asgi:application`` on a socket this process bound (no port race)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        log = tempfile.NamedTemporaryFile(prefix="kumiflow-uvicorn-", suffix=".log", delete=False)  # noqa: SIM115
        self.log_path = Path(log.name)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--fd",
                str(self.sock.fileno()),
                "--no-access-log",
                "--log-level",
                "warning",
                "--lifespan",
                "off",
                "--timeout-graceful-shutdown",
                "2",
                "testproject.asgi:application",
            ],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": database_url(), **env},
            pass_fds=[self.sock.fileno()],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_for(self._up, 30, "uvicorn to answer")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"uvicorn exited:\n{self.log()}")
        try:
            return requests.get(self.url("openapi.json"), timeout=5).status_code == 200
        except (requests.ConnectionError, requests.Timeout):
            return False  # not listening yet, or its first answer is slow (a busy machine)

    def url(self, path: str) -> str:
        return f"{self.base}/api/kumiflow/{path}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()


class Api:
    """Calls to the server's API with one token."""

    def __init__(self, server: Server, token: str) -> None:
        self.server = server
        self.headers = {"Authorization": f"Bearer {token}"}

    def post(self, path: str, body: dict[str, Any]) -> requests.Response:
        return requests.post(self.server.url(path), json=body, headers=self.headers, timeout=30)

    def stream(self, run_id: str, last_event_id: int | None = None) -> EventStream:
        headers = {**self.headers, "Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        return EventStream(self.server.url(f"runs/{run_id}/events/"), headers)


class EventStream:
    """Reads server-sent events as they arrive: ``next()`` is the next message
    (a dict of its fields, comments under "comment"), None once the stream ended.

    Every read waits at most 20 s, so a stream that stalls fails the test
    instead of hanging it.
    """

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.response = requests.get(url, headers=headers, stream=True, timeout=(5, 20))
        assert self.response.status_code == 200, self.response.text
        assert self.response.headers["Content-Type"] == "text/event-stream"
        self.chunks = self.response.iter_content(chunk_size=None)
        self.buffer = b""
        self.ended = False

    def next(self) -> dict[str, str] | None:
        while b"\n\n" not in self.buffer:
            chunk = next(self.chunks, None)
            if chunk is None:
                self.ended = True
                assert not self.buffer.strip(), f"a partial message at the end: {self.buffer!r}"
                return None
            self.buffer += chunk
        block, self.buffer = self.buffer.split(b"\n\n", 1)
        message: dict[str, str] = {}
        for line in block.decode().split("\n"):
            name, _, value = line.partition(": ")
            message[name or "comment"] = value
        return message

    def until(self, stop: Any) -> list[dict[str, str]]:
        """Messages (without comments) up to and including the first for which ``stop`` is true."""
        got: list[dict[str, str]] = []
        while True:
            message = self.next()
            assert message is not None, f"the stream ended before the expected message: {got}"
            if "comment" in message:
                continue
            got.append(message)
            if stop(message):
                return got

    def close(self) -> None:
        self.response.close()


def version(message: dict[str, str]) -> int:
    return int(message["id"])


def data(message: dict[str, str]) -> Any:
    return json.loads(message["data"])
