"""Hosts of their own on this machine: a network namespace per worker, a veth
pair to the host, and a TCP forwarder on the host end of the pair.

PostgreSQL listens on 127.0.0.1 only and is shared: the forwarder (in this
process) accepts on the veth's host address and relays to 127.0.0.1:5432, so
the server is never reconfigured. Taking the veth down then cuts the
worker's connections without a FIN or an RST, like a lost host. Every name
starts with ``PREFIX``; :func:`cleanup` removes what a failed run left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "kfault"
#: Private /30 pairs of the suite's own veth links: 10.213.<n>.1 host, .2 worker.
NETWORK = "10.213"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=20)


#: The pids of the workers the suite started, for the cleanup after a crash.
PIDS = Path(f"/tmp/{PREFIX}-workers.pids")


def started(pid: int) -> None:
    with PIDS.open("a") as pids:
        pids.write(f"{pid}\n")


def _ours(pid: int) -> bool:
    """A worker of this suite still (a pid may have been reused since)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"kumiflow_worker" in cmdline and b"FAULTS_ROLE=" in environ


def cleanup() -> None:
    """Remove the namespaces and links of this suite (an earlier run's included),
    and stop the workers a crashed run left behind."""
    if PIDS.exists():
        for line in PIDS.read_text().split():
            if _ours(int(line)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(line), signal.SIGKILL)
        PIDS.unlink()
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX):
            ip("netns", "del", name, check=False)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(PREFIX):
            ip("link", "del", name, check=False)


@dataclass
class Host:
    """A namespace ``<PREFIX><n>`` joined to the host by ``<PREFIX><n>h`` (host
    end, 10.213.n.1) and ``<PREFIX><n>w`` (its end, 10.213.n.2)."""

    n: int
    forwarder: Forwarder | None = None

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.n}"

    @property
    def host_end(self) -> str:
        return f"{self.name}h"

    @property
    def host_address(self) -> str:
        return f"{NETWORK}.{self.n}.1"

    def create(self, target: tuple[str, int]) -> None:
        worker_end = f"{self.name}w"
        ip("netns", "add", self.name)
        ip("link", "add", self.host_end, "type", "veth", "peer", "name", worker_end)
        ip("link", "set", worker_end, "netns", self.name)
        ip("addr", "add", f"{self.host_address}/30", "dev", self.host_end)
        ip("link", "set", self.host_end, "up")
        inside = ("netns", "exec", self.name, "ip")
        ip(*inside, "addr", "add", f"{NETWORK}.{self.n}.2/30", "dev", worker_end)
        ip(*inside, "link", "set", worker_end, "up")
        ip(*inside, "link", "set", "lo", "up")
        self.forwarder = Forwarder((self.host_address, target[1]), target)
        self.forwarder.start()

    def cut(self) -> None:
        ip("link", "set", self.host_end, "down")

    def heal(self) -> None:
        ip("link", "set", self.host_end, "up")

    def destroy(self) -> None:
        if self.forwarder is not None:
            self.forwarder.stop()
        ip("netns", "del", self.name, check=False)  # takes its veth end, and the pair
        ip("link", "del", self.host_end, check=False)

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]


@dataclass
class Forwarder:
    """Relays each accepted connection to ``target``, byte for byte; when one
    side closes, the other is shut down for writing (a FIN, queued behind the
    bytes in flight, delivered when the link is up again)."""

    listen: tuple[str, int]
    target: tuple[str, int]
    _server: socket.socket | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(self.listen)
        server.listen(64)
        server.settimeout(0.5)
        self._server = server
        threading.Thread(target=self._accept, daemon=True, name="forwarder").start()

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()

    def _accept(self) -> None:
        assert self._server is not None
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
