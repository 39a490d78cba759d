"""A small HTTP receiver on loopback for the webhook tests.

Each request is recorded; the answer comes from a script of responses
(status, headers, delay, raw bytes), the last one repeating.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    raw: bytes | None = None  # sent instead of an HTTP response
    body: bytes = b"ok"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies) or [Reply()]
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _handle(self) -> None:
                try:
                    self._answer()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with receiver._lock:
                    receiver.seen.append(
                        Seen(self.command, self.path, dict(self.headers.items()), body)
                    )
                    index = min(len(receiver.seen), len(receiver.replies)) - 1
                    reply = receiver.replies[index]
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.raw is not None:
                    self.wfile.write(reply.raw)
                    self.close_connection = True
                    return
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_POST = do_PUT = do_GET = do_PATCH = do_DELETE = _handle  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # shutdown() waits for the loop to look at its flag: every 0.05 s, not
        # the default 0.5 s that each test (or the demo) would wait at its end.
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
