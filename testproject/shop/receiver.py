"""A webhook receiver on loopback for the demo: checks the signature, keeps the calls."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class DemoReceiver:
    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.calls: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                timestamp = self.headers.get("X-Kumiflow-Timestamp", "")
                expected = hmac.new(
                    receiver.secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256
                ).hexdigest()
                signed = hmac.compare_digest(
                    self.headers.get("X-Kumiflow-Signature", ""), "v1=" + expected
                )
                receiver.calls.append(
                    {
                        "path": self.path,
                        "body": json.loads(body or b"null"),
                        "idempotency_key": self.headers.get("Idempotency-Key"),
                        "signature_ok": signed,
                    }
                )
                self.send_response(200 if signed else 401)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # shutdown() waits for the loop to look at its flag: every 0.05 s, not
        # the default 0.5 s that each test (or the demo) would wait at its end.
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/crm"

    def __enter__(self) -> DemoReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
