"""``python -m bench.faults.failover``: kill the primary of a synchronously
replicated PostgreSQL mid-workload; count what was lost and what ran twice.

The suite starts its own cluster (never the machine's 5432): an etcd, and
two Patroni nodes (Debian's ``patroni``, ``etcd-server``) on ports 5441 and
5442, synchronous mode on. Two workers and the harness reach it with libpq's
multi-host form (``host=a,b port=p,q target_session_attrs=read-write``). The
harness starts W5-like runs (three counted segments) at a steady rate, each
with an idempotency key it retries until the start is acknowledged; after a
while it kills the primary's Patroni and postmaster (SIGKILL, as a lost
host), and measures the promotion, the workers' return (without a restart)
and, at the end, acknowledged runs lost and effects repeated.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
BASE = Path(os.environ.get("FAULTS_FAILOVER_DIR", "/tmp/kfault-failover"))
PORTS = {"pg1": (5441, 8441), "pg2": (5442, 8442)}
ETCD = (23790, 23800)
BIN = Path("/usr/lib/postgresql/15/bin")
NAME = "kumiflow_faults_failover"
LEASE = os.environ.get("FAULTS_LEASE", "4")
RATE = 4.0  # starts per second
BEFORE, AFTER = 8.0, 20.0  # seconds of workload before and after the kill
BOUND = 120.0

ENV = {
    "DJANGO_SETTINGS_MODULE": "bench.faults.settings",
    "TESTPROJECT_ONE_DATABASE": "1",
    "FAULTS_PG_HOSTS": "127.0.0.1,127.0.0.1",
    "FAULTS_PG_PORTS": f"{PORTS['pg1'][0]},{PORTS['pg2'][0]}",
    "FAULTS_PG_NAME": NAME,
    "FAULTS_LEASE": LEASE,
    "DATABASE_URL": "postgres://postgres@127.0.0.1/unused",
}
os.environ.update(ENV)


def ensure_packages() -> None:
    """Debian's patroni and etcd-server, installed as CI installs its services."""
    if shutil.which("patroni") and shutil.which("etcd"):
        return
    apt = ["apt-get", "install", "-y", "-q", "patroni", "etcd-server"]
    quiet = {
        "stdout": subprocess.DEVNULL,
        "env": {**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    }
    if subprocess.run(apt, check=False, timeout=600, **quiet).returncode:  # type: ignore[call-overload]
        subprocess.run(["apt-get", "update", "-q"], check=True, timeout=600, **quiet)  # type: ignore[call-overload]
        subprocess.run(apt, check=True, timeout=600, **quiet)  # type: ignore[call-overload]


def patroni_config(name: str) -> str:
    port, rest = PORTS[name]
    return f"""scope: kfault
namespace: /kfault/
name: {name}
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{ETCD[0]}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 0
    synchronous_mode: true
    postgresql:
      use_pg_rewind: false
      parameters:
        max_connections: 40
        synchronous_commit: "on"
        wal_level: replica
        hot_standby: "on"
  initdb: [{{encoding: UTF8}}]
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{port}
  connect_address: 127.0.0.1:{port}
  data_dir: {BASE / name}
  bin_dir: {BIN}
  pgpass: {BASE / (name + ".pgpass")}
  authentication:
    superuser: {{username: postgres}}
    replication: {{username: postgres}}
  parameters:
    unix_socket_directories: '{BASE}'
    shared_buffers: 32MB
"""


class Cluster:
    def __init__(self) -> None:
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        cleanup()
        BASE.mkdir(parents=True)
        shutil.chown(BASE, "postgres", "postgres")
        etcd = [
            "etcd", "--name", "kfault", "--data-dir", str(BASE / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{ETCD[0]}",
            "--advertise-client-urls", f"http://127.0.0.1:{ETCD[0]}",
            "--listen-peer-urls", f"http://127.0.0.1:{ETCD[1]}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD[1]}",
            "--initial-cluster", f"kfault=http://127.0.0.1:{ETCD[1]}",
        ]  # fmt: skip
        self._spawn("etcd", etcd)
        for name in PORTS:
            config = BASE / f"{name}.yml"
            config.write_text(patroni_config(name))
            shutil.chown(config, "postgres", "postgres")
        self._spawn("pg1", ["runuser", "-u", "postgres", "--", "patroni", str(BASE / "pg1.yml")])
        wait_for("pg1 primary", lambda: rest("pg1", "primary"))
        self._spawn("pg2", ["runuser", "-u", "postgres", "--", "patroni", str(BASE / "pg2.yml")])
        wait_for("pg2 synchronous standby", lambda: rest("pg2", "sync"))

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (BASE / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        with (BASE / "pids").open("a") as pids:
            pids.write(f"{self.processes[name].pid}\n")

    def primary(self) -> str:
        return next(name for name in PORTS if rest(name, "primary"))

    def kill(self, name: str) -> None:
        """The host is gone: its Patroni and its postmaster die at once."""
        pid = int((BASE / name / "postmaster.pid").read_text().split()[0])
        os.killpg(self.processes[name].pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.processes[name].wait(10)


def rest(name: str, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORTS[name][1]}/{path}", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def ours(pid: int) -> bool:
    """Whether ``pid`` is still a process of this suite (a pid may be reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return str(BASE) in cmdline or "kfault" in cmdline


def cleanup() -> None:
    """Stop what an earlier run of this suite started (its pids only), remove its files."""
    pids = BASE / "pids"
    found = [int(line) for line in pids.read_text().split()] if pids.exists() else []
    for name in PORTS:
        pidfile = BASE / name / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            found.append(int(pidfile.read_text().split()[0]))
    for pid in found:
        if ours(pid):
            # the recorded pids lead a session each (runuser, then Patroni, its
            # child): the whole group goes, or an orphaned Patroni lives on
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(BASE, ignore_errors=True)


def wait_for(what: str, test: Any, bound: float = BOUND) -> Any:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if value := test():
            return value
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {bound:.0f} s")


def create_database() -> None:
    import psycopg

    hosts = {"host": ENV["FAULTS_PG_HOSTS"], "port": ENV["FAULTS_PG_PORTS"]}
    conninfo = psycopg.conninfo.make_conninfo(
        dbname="postgres", user="postgres", target_session_attrs="read-write", **hosts
    )
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{NAME}"')


def worker(role: str) -> subprocess.Popen[bytes]:
    log = (BASE / f"{role}.log").open("wb")
    argv = [sys.executable, str(ROOT / "manage.py"), "kumiflow_worker", "--no-dispatch"]
    argv += ["--worker-id", role, "--max-interval", "0.5"]
    env = {**os.environ, **ENV, "FAULTS_ROLE": role}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def run() -> dict[str, Any]:
    import django

    cluster = Cluster()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        cluster.start()
        create_database()
        django.setup()
        from django.core.management import call_command
        from django.db import close_old_connections, connection

        from kumiflow_django import start_workflow
        from kumiflow_django.models import RunStatus, WorkflowRun
        from testproject.shop.models import Tally

        call_command("migrate", verbosity=0)
        workers = [worker("w1"), worker("w2")]
        acknowledged: dict[str, float] = {}
        failed_starts = 0
        stop = threading.Event()

        def produce() -> None:
            nonlocal failed_starts
            i = 0
            while not stop.is_set():
                key = f"failover-{i}"
                for _ in range(200):  # bounded: each try waits for a connect_timeout at most
                    try:
                        run = start_workflow("faults-w5", idempotency_key=key)
                        acknowledged[str(run.pk)] = time.monotonic()
                        break
                    except Exception:
                        failed_starts += 1
                        connection.close()
                        time.sleep(0.2)
                i += 1
                stop.wait(1 / RATE)
            connection.close()

        producer = threading.Thread(target=produce)
        producer.start()
        time.sleep(BEFORE)
        old = cluster.primary()
        new = next(name for name in PORTS if name != old)
        acked_before_kill = len(acknowledged)
        t_kill = time.monotonic()
        cluster.kill(old)
        wait_for("the standby promoted", lambda: rest(new, "primary"))
        promoted = time.monotonic() - t_kill

        def completed_after_kill() -> bool:
            try:
                close_old_connections()
                return WorkflowRun.objects.filter(
                    status=RunStatus.COMPLETED,
                    pk__in=[r for r, t in acknowledged.copy().items() if t > t_kill],
                ).exists()
            except Exception:
                connection.close()
                return False

        wait_for("a run started after the kill completed", completed_after_kill)
        back = time.monotonic() - t_kill
        time.sleep(max(0.0, AFTER - (time.monotonic() - t_kill)))
        stop.set()
        producer.join(60)
        ids = list(acknowledged)

        def drained() -> bool:
            close_old_connections()
            return WorkflowRun.objects.filter(
                pk__in=ids, status=RunStatus.COMPLETED
            ).count() == len(ids)

        with contextlib.suppress(TimeoutError):
            wait_for("the acknowledged runs completed", drained)
        rows = dict(WorkflowRun.objects.filter(pk__in=ids).values_list("id", "status"))
        counts = {
            t.key: t.count for t in Tally.objects.all() if t.key.split(":")[0] in acknowledged
        }
        restarted = [w.args[-3] for w in workers if w.poll() is not None]
        result = {
            "fault": "failover",
            "moment": "W5-like workload",
            "tried": 1,
            "acknowledged": len(ids),
            "acknowledged_before_kill": acked_before_kill,
            "completed": sum(1 for s in rows.values() if s == RunStatus.COMPLETED),
            "lost": len(ids) - len(rows),
            "not_completed": len(ids) - sum(1 for s in rows.values() if s == RunStatus.COMPLETED),
            "effects_repeated": sum(c - 1 for c in counts.values() if c > 1),
            "effects_missing": 3 * len(ids) - len(counts),
            "failed_start_tries": failed_starts,
            "promoted_after_s": round(promoted, 1),
            "workers_back_after_s": round(back, 1),
            "workers_exited": restarted,
        }
        connection.close()
        return result
    finally:
        for w in workers:
            w.terminate()
            try:
                w.wait(20)
            except subprocess.TimeoutExpired:
                w.kill()
        for name, process in cluster.processes.items():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM if name != "etcd" else signal.SIGKILL)
        time.sleep(2)
        logs = Path(tempfile.mkdtemp(prefix="kumiflow-failover-"))
        for log in BASE.glob("*.log"):
            shutil.copy(log, logs)
        print(f"logs in {logs}", file=sys.stderr)
        cleanup()


def main() -> int:
    if os.geteuid() != 0:
        print("the failover starts its own cluster as the postgres user: run it as root")
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks clean up
    ensure_packages()
    result = run()
    print(json.dumps(result))
    ok = not (result["lost"] or result["not_completed"] or result["effects_repeated"])
    return 0 if ok and not result["workers_exited"] else 1


if __name__ == "__main__":
    sys.exit(main())
