"""``python -m bench.faults [--quick] [--only NAME ...]``: run the faults, print the table.

Each fault: a *victim* worker in a namespace of its own takes the work and
stops at the moment's gate (see ``workflows.gate``); the harness cuts its
link (``cut``) or stops the process (``pause``, SIGSTOP), starts a second
worker on the host, and measures how soon that one takes the work over;
then it stops the second worker, heals the victim (link up, SIGCONT),
releases its gate, and checks that the victim's late commit was refused
(its counted effect still counts 1) and that it works again without a
restart (a probe run it completes alone).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
DATABASE = os.environ.get("FAULTS_DATABASE", "kumiflow_faults")
#: ``FAULTS_DB=mariadb``: the same faults against the machine's MariaDB.
MARIADB = os.environ.get("FAULTS_DB", "postgresql") == "mariadb"
PG = ("127.0.0.1", 3306 if MARIADB else 5432)
LEASE = float(os.environ.get("FAULTS_LEASE", "4"))
#: Longest wait for any one phase of a fault.
PHASE_BOUND = 120.0
MOMENTS = ("segment", "lease", "task", "cron", "flow", "settlement")
FAULTS = ("cut", "pause")
QUICK = [("segment", "cut")]


def url(host: str) -> str:
    if MARIADB:
        return f"mysql://root@{host}:{PG[1]}/{DATABASE}"
    return f"postgres://postgres@{host}:{PG[1]}/{DATABASE}"


os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.faults.settings")
os.environ["DATABASE_URL"] = url(PG[0])
os.environ["TESTPROJECT_ONE_DATABASE"] = "1"
os.environ["FAULTS_LEASE"] = str(LEASE)


@dataclass
class Row:
    fault: str
    moment: str
    tried: int = 0
    runs: int = 0
    completed: int = 0
    lost: int = 0
    effects_repeated: int = 0
    deliveries_repeated: int = 0
    takeover_s: float | None = None
    recover_s: float | None = None
    late_commit_refused: bool | None = None
    notes: list[str] = field(default_factory=list)


def wait_for(what: str, test: Callable[[], Any], bound: float = PHASE_BOUND) -> Any:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        value = test()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not within {bound:.0f} s")


def recreate_database() -> None:
    if MARIADB:
        import pymysql

        conn = pymysql.connect(host=PG[0], port=PG[1], user="root", autocommit=True)
        with conn.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{DATABASE}`")
            cursor.execute(f"CREATE DATABASE `{DATABASE}` CHARACTER SET utf8mb4")
        conn.close()
        return
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{DATABASE}"')


class Worker:
    """One ``manage.py kumiflow_worker`` process, its output in a file."""

    def __init__(self, role: str, host: Any, env: dict[str, str], logdir: Path) -> None:
        argv = [sys.executable, str(ROOT / "manage.py"), "kumiflow_worker"]
        argv += ["--no-dispatch", "--worker-id", role, "--max-interval", "0.5"]
        address = host.host_address if host is not None else PG[0]
        environment = {**os.environ, **env, "FAULTS_ROLE": role, "DATABASE_URL": url(address)}
        self.log = logdir / f"{role}.log"
        self.role = role
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                host.command(argv) if host is not None else argv,
                cwd=ROOT,
                env=environment,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        from bench.faults import net

        net.started(self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def tallies(prefixes: list[str]) -> dict[str, int]:
    from testproject.shop.models import Tally

    found = {}
    for row in Tally.objects.exclude(key="gate"):
        if any(row.key.startswith(p) for p in prefixes):
            found[row.key] = row.count
    return found


def create_work(moment: str) -> list[str]:
    """Start the runs of one fault; return the workflows whose runs to count."""
    from kumiflow_django import append_event, start_workflow

    if moment in ("segment", "lease"):
        for _ in range(3):
            start_workflow("faults-segment")
        return ["faults-segment"]
    if moment == "task":
        for _ in range(2):
            start_workflow("faults-task")
        return ["faults-task"]
    if moment == "flow":
        key = uuid.uuid4().hex
        for _ in range(3):
            append_event(f"flow-{key}", "faults.flow", {"key": key})
        return ["faults-flow"]
    if moment == "settlement":
        for _ in range(2):
            start_workflow("faults-parent")
        return ["faults-parent", "faults-child"]
    if moment == "cron":
        return ["faults-cron"]  # the schedule fires every second
    raise ValueError(moment)


def run_fault(moment: str, fault: str, n: int, logdir: Path) -> Row:
    from django.db import close_old_connections, connection

    from bench.faults import net
    from kumiflow_django import start_workflow
    from kumiflow_django.models import Event, RunStatus, WorkflowRun
    from testproject.shop.models import Tally

    row = Row(fault, moment, tried=1)
    gate_dir = Path(tempfile.mkdtemp(prefix=f"{moment}-{fault}-", dir=logdir))
    env = {"FAULTS_DIR": str(gate_dir)}
    if moment == "lease":
        env["FAULTS_GATE"] = "lock"
    if moment == "cron":
        env["FAULTS_CRON"] = "* * * * * *"
    before = set(WorkflowRun.objects.values_list("id", flat=True))
    since = Event.objects.order_by("-position").values_list("position", flat=True).first() or 0
    host = net.Host(n)
    victim = other = None
    holder = None
    try:
        host.create(PG)
        if moment == "lease":  # the harness holds the row the victim will wait for
            Tally.objects.get_or_create(key="gate")
            holder = hold_gate()
        victim = Worker("victim", host, env, gate_dir)
        workflows = create_work(moment)
        held = wait_for("the victim at the gate", lambda: _read(gate_dir / "entered"))
        what = held.split()[0]
        if moment == "lease":
            wait_for("the victim waiting for the lock", lambda: _waiting_for_lock())
        # the fault
        t_fault = time.monotonic()
        if fault == "cut":
            host.cut()
        else:
            victim.process.send_signal(signal.SIGSTOP)
        other = Worker("other", None, env, gate_dir)
        done = 2 if what.endswith(":task") else 1  # the victim's own execution of a task counted

        def taken_over() -> bool:
            close_old_connections()
            return Tally.objects.filter(key=what, count__gte=done).exists()

        try:
            wait_for("another worker taking the work over", taken_over)
            row.takeover_s = round(time.monotonic() - t_fault, 1)
        except TimeoutError as exc:
            row.notes.append(str(exc))
        mine = lambda: WorkflowRun.objects.filter(workflow__in=workflows).exclude(pk__in=before)  # noqa: E731
        try:
            wait_for(
                "the runs completed",
                lambda: mine().exists() and not mine().exclude(status=RunStatus.COMPLETED).exists(),
                bound=PHASE_BOUND if row.takeover_s is not None else 5,
            )
        except TimeoutError as exc:
            row.notes.append(str(exc))
        other.stop()
        if holder is not None:
            holder.rollback()
        # heal, release the gate, and let the victim try its late commit
        t_heal = time.monotonic()
        if fault == "cut":
            host.heal()
        else:
            victim.process.send_signal(signal.SIGCONT)
        (gate_dir / "release").write_text("")
        try:
            wait_for("the victim leaving the gate", lambda: (gate_dir / "returned").exists())
            time.sleep(2.0)  # its commit (or its error) follows at once
        except TimeoutError as exc:
            row.notes.append(str(exc))
        close_old_connections()
        counts = tallies([str(r) for r in mine().values_list("id", flat=True)])
        row.late_commit_refused = counts.get(what, 0) == done
        # the victim alone again: does it work without a restart?
        probe = start_workflow("faults-segment")
        try:
            wait_for(
                "the victim completing a probe run",
                lambda: WorkflowRun.objects.filter(
                    pk=probe.pk, status=RunStatus.COMPLETED
                ).exists(),
            )
            row.recover_s = round(time.monotonic() - t_heal, 1)
        except TimeoutError as exc:
            row.notes.append(str(exc))
        victim.stop()
        victim = None
        runs = list(mine().exclude(pk=probe.pk).values_list("id", "status"))
        row.runs = len(runs)
        row.completed = sum(1 for _, status in runs if status == RunStatus.COMPLETED)
        row.lost = row.runs - row.completed
        counts = tallies([str(r) for r, _ in runs])
        row.effects_repeated = sum(c - 1 for k, c in counts.items() if not k.endswith(":task"))
        row.deliveries_repeated = sum(c - 1 for k, c in counts.items() if k.endswith(":task"))
        row.deliveries_repeated += occurrences_repeated(since)
        refusals = [
            line.split(" ", 3)[-1][:160]
            for line in _lines_of(gate_dir / "victim.log")
            if "Error" in line or "error" in line or "terminat" in line
        ]
        row.notes.extend(refusals[:2])
        connection.close()
    finally:
        for worker in (other, victim):
            if worker is not None:
                worker.stop()
        if holder is not None:
            holder.close()
        host.destroy()
    return row


def occurrences_repeated(since: int) -> int:
    """Cron occurrences fired more than once since log position ``since`` (each
    is an idempotency key: two fired events naming one would be a repeat)."""
    from kumiflow_django.models import Event
    from kumiflow_django.store import names

    fired = [
        occurrence
        for payload in Event.objects.filter(position__gt=since, type=names.CRON_FIRED).values_list(
            "payload", flat=True
        )
        for occurrence in payload.get("scheduled_for", [])
    ]
    return len(fired) - len(set(fired))


def _lines_of(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() and path.read_text().strip() else None


def hold_gate() -> Any:
    """A connection of the harness's own holding the gate row's lock."""
    select = "SELECT 1 FROM shop_tally WHERE `key` = 'gate' FOR UPDATE"
    if MARIADB:
        import pymysql

        holder = pymysql.connect(host=PG[0], port=PG[1], user="root", database=DATABASE)
        # READ COMMITTED, as Django's connections: no gap locks beside the row
        holder.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        holder.cursor().execute(select)
        return holder
    import psycopg

    holder = psycopg.connect(url(PG[0]).replace("postgres://", "postgresql://"))
    holder.execute(select.replace("`", '"'))
    return holder


def _waiting_for_lock() -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        if MARIADB:  # no application names: the victim's statement is the one waiting
            cursor.execute(
                "SELECT 1 FROM information_schema.processlist WHERE info LIKE %s "
                "AND info LIKE %s AND id <> CONNECTION_ID()",
                ["%shop_tally%", "%FOR UPDATE%"],
            )
        else:
            cursor.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'victim' "
                "AND wait_event_type = 'Lock'"
            )
        return cursor.fetchone() is not None


COLUMNS = [
    ("fault", "fault"),
    ("moment", "moment"),
    ("tried", "tried"),
    ("completed", "runs completed"),
    ("lost", "runs lost"),
    ("effects_repeated", "effects repeated"),
    ("deliveries_repeated", "deliveries repeated"),
    ("takeover_s", "taken over after (s, slowest)"),
    ("recover_s", "back to work after (s, slowest)"),
    ("late_commit_refused", "late commit refused"),
]


def table(rows: list[Row]) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "NO"
        return str(value)

    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |"]
    lines.append("|" + "|".join("---" for _ in COLUMNS) + "|")
    for row in rows:
        lines.append("| " + " | ".join(cell(getattr(row, k)) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def failover() -> Row:
    """The failover (bench/faults/failover.py) in a process of its own: its
    Django settings name the cluster's two hosts."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.faults.failover"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    row = Row("failover", "W5-like workload", tried=1)
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        row.notes.append(f"failover did not report: {done.stderr[-2000:]}")
        return row
    row.runs = found["acknowledged"]
    row.completed = found["completed"]
    row.lost = found["acknowledged"] - found["completed"]
    row.effects_repeated = found["effects_repeated"]
    row.takeover_s = found["promoted_after_s"]
    row.recover_s = found["workers_back_after_s"]
    row.late_commit_refused = None
    row.notes.append(json.dumps(found))
    if found["workers_exited"]:
        row.notes.append(f"workers exited: {found['workers_exited']}")
        row.lost = max(row.lost, 1)
    print(*done.stderr.strip().splitlines()[-1:], file=sys.stderr)
    return row


def combine(tries: list[Row]) -> Row:
    """One row for the tries of one fault: sums, the slowest times, and refused
    only when every late commit was."""
    first = tries[0]
    row = Row(first.fault, first.moment, tried=len(tries))
    for name in ("runs", "completed", "lost", "effects_repeated", "deliveries_repeated"):
        setattr(row, name, sum(getattr(t, name) for t in tries))
    for name in ("takeover_s", "recover_s"):
        values = [getattr(t, name) for t in tries]
        setattr(row, name, None if None in values else max(values))
    row.late_commit_refused = all(t.late_commit_refused for t in tries)
    row.notes = [note for t in tries for note in t.notes]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one partition (CI)")
    parser.add_argument("--only", nargs="*", help="faults as moment:fault, e.g. task:cut")
    parser.add_argument(
        "--failover", action="store_true", help="also kill a Patroni primary (always with --quick)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="tries of each fault")
    parser.add_argument(
        "--cleanup",
        action="store_true",
        help="only remove what a run left (namespaces, workers, the Patroni cluster)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "faults.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the fault suite creates network namespaces: run it as root")
    if args.cleanup:  # .ci/run's trap: a run killed by a timeout cleans up nothing itself
        from bench.faults import failover as cluster
        from bench.faults import net as links

        links.cleanup()
        cluster.cleanup()
        return 0
    if args.only:
        plan = [tuple(item.split(":")) for item in args.only]
    elif args.quick:
        plan = QUICK
    else:
        plan = [(m, f) for f in FAULTS for m in MOMENTS]

    import django

    from bench.faults import net

    # SIGTERM (a CI timeout) unwinds like ^C: the finally blocks clean up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    net.cleanup()
    recreate_database()
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    rows = []
    logdir = Path(tempfile.mkdtemp(prefix="kumiflow-faults-"))
    try:
        n = 0
        for moment, fault in plan:
            tries = []
            for _ in range(max(1, args.repeat)):
                n += 1
                started = time.monotonic()
                tries.append(run_fault(moment, fault, n, logdir))
                print(
                    f"{moment}:{fault} done in {time.monotonic() - started:.0f} s",
                    *tries[-1].notes,
                    sep="\n  ",
                    file=sys.stderr,
                )
            rows.append(combine(tries))
    finally:
        net.cleanup()
    if args.failover or (args.quick and not args.only):
        rows.append(failover())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    print(f"{'MariaDB' if MARIADB else 'PostgreSQL'}, lease {LEASE:g} s; logs in {logdir}")
    print(table(rows))
    bad = [
        r
        for r in rows
        if r.lost or r.effects_repeated or r.late_commit_refused is False or r.completed < r.runs
    ]
    return 1 if bad or any(r.takeover_s is None for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
