"""Retention: finished runs go with what they own, are archived, restored; one process at a time."""

from __future__ import annotations

import gzip
import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, models, transaction

from kumiflow_django import append_event, cancel_run, define_workflow, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import (
    CronSchedule,
    Dispatch,
    Event,
    ProcessLock,
    RunAttribute,
    WorkflowRun,
)
from kumiflow_django.projections import retention as retention_module
from kumiflow_django.projections.rebuild import rebuild_all
from kumiflow_django.projections.retention import (
    LOCK_NAME,
    LockLost,
    Restore,
    Retention,
    owned_streams,
)
from kumiflow_django.store import locks
from kumiflow_django.store.db import for_update
from kumiflow_django.store.locks import LockHeld
from kumiflow_django.testing import run_until_idle
from tests.processes import output, spawn
from tests.races import in_thread

TABLES: tuple[type[models.Model], ...] = (WorkflowRun, Dispatch, CronSchedule)


def snapshot() -> dict[str, list[dict]]:
    return {m.__name__: list(m._default_manager.order_by("pk").values()) for m in TABLES}


def log() -> list[dict]:
    return [dict(row) for row in Event.objects.order_by("position").values()]


def without(tables: dict[str, list[dict]], runs: set) -> dict[str, list[dict]]:
    """The tables as they are without these runs and what they own."""
    return {
        "WorkflowRun": [r for r in tables["WorkflowRun"] if r["id"] not in runs],
        "Dispatch": [d for d in tables["Dispatch"] if d["run_id"] not in runs],
        "CronSchedule": tables["CronSchedule"],
    }


@pytest.fixture
def history(registry, clock, mailoutbox):
    """Runs that finished 100 days ago (completed with a delivered mail, failed,
    cancelled), one that finished then with its mail still undelivered, one
    still waiting since then, and runs that finished today."""
    define_workflow(
        "mailer",
        trigger=on_event("order.placed"),
        attributes={"order": lambda ctx: ctx.event.payload["n"]},
        steps=[
            s.mail_send(to="shop@x.io", subject="order", body="placed"),
            s.compute("n", lambda ctx: ctx.event.payload["n"]),
        ],
    )
    define_workflow("broken", steps=[s.compute("x", lambda ctx: 1 / 0)])
    define_workflow("sleeper", steps=[s.wait("P365D"), s.return_(1)])

    for n in range(3):
        append_event(f"order-{n}", "order.placed", {"n": n})
    start_workflow("broken")
    cancelled = start_workflow("sleeper")
    waiting = start_workflow("sleeper")
    run_until_idle()
    cancel_run(cancelled.id, reason="no longer needed")
    append_event("order-3", "order.placed", {"n": 3})  # its mail stays in the outbox
    old = set(WorkflowRun.objects.values_list("id", flat=True))
    pending = Dispatch.objects.get(status="pending").run_id

    clock.advance(days=100)
    append_event("order-4", "order.placed", {"n": 4})
    start_workflow("broken")
    new = set(WorkflowRun.objects.values_list("id", flat=True)) - old
    going = old - {pending, waiting.id}
    assert len(going) == 5  # three mailers, one failed, one cancelled
    return {
        "going": going,
        "kept": {pending, waiting.id} | new,
        "cutoff": clock.now() - timedelta(days=50),
    }


@pytest.mark.django_db
def test_finished_runs_go_with_their_streams_and_outbox_rows(history):
    before, events_before = snapshot(), log()
    going = {str(r) for r in history["going"]}
    dispatches = {
        str(d)
        for d in Dispatch.objects.filter(run_id__in=history["going"]).values_list("id", flat=True)
    }
    assert len(dispatches) == 3

    report = Retention(history["cutoff"], batch_size=2).run()

    assert (report.runs, report.kept) == (5, 1)
    assert report.owned == {"dispatches": 3, "tasks": 0}
    assert report.batches >= 3, "bounded batches"
    assert snapshot() == without(before, history["going"])
    gone = going | dispatches
    assert log() == [e for e in events_before if e["stream_id"] not in gone]
    assert report.events == len(events_before) - len(log())
    assert Event.objects.filter(type="order.placed").count() == 5, "trigger events are the domain's"


def attribute_rows() -> set[tuple]:
    return set(RunAttribute.objects.values_list("run_id", "name", "value", "started_at"))


@pytest.mark.django_db
def test_search_attributes_go_with_their_runs_and_come_back_with_a_restore(history, tmp_path):
    before = attribute_rows()
    assert len(before) == 5  # the five mailer runs
    going = {row for row in before if row[0] in history["going"]}
    assert len(going) == 3

    report = Retention(history["cutoff"], batch_size=2, archive_dir=tmp_path).run()
    assert attribute_rows() == before - going

    assert report.archive is not None
    Restore(batch_size=2).restore([report.archive])
    assert attribute_rows() == before


@pytest.mark.django_db
def test_rebuild_after_retention_gives_the_same_tables(history):
    Retention(history["cutoff"]).run()
    after = snapshot()
    rebuild_all()
    assert snapshot() == after


@pytest.mark.django_db
def test_a_dry_run_counts_what_would_go_and_deletes_nothing(history, capsys):
    before = log()
    assert Retention(history["cutoff"]).count() == 5
    call_command("kumiflow_retention", "--finished-before", "P50D", "--dry-run", verbosity=0)
    call_command("kumiflow_retention", "--finished-before", "P101D", "--dry-run", verbosity=0)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("would delete 5 run(s) finished before 2026-02-20")
    assert out[1].startswith("would delete 0 run(s)")
    assert log() == before


@pytest.mark.django_db
def test_a_pending_delivery_of_no_run_holds_back_no_run(history, clock):
    Dispatch.objects.create(
        tenant_id="default", kind="mail", status="pending", version=1,
        created_at=clock.now(), updated_at=clock.now(),
    )  # fmt: skip
    assert Retention(history["cutoff"]).count() == 5


@pytest.mark.django_db
def test_archive_and_restore_give_back_every_table_and_every_event(history, tmp_path):
    before, events_before = snapshot(), log()

    report = Retention(history["cutoff"], batch_size=2, archive_dir=tmp_path).run()
    assert report.archive is not None and report.archive.parent == tmp_path
    with gzip.open(report.archive, "rt") as archive:
        header, *records = [json.loads(line) for line in archive]
    assert header["format"] == "kumiflow-archive"
    assert {r["run"] for r in records} == {str(r) for r in history["going"]}

    restored = Restore(batch_size=2).restore([report.archive])
    assert (restored.runs, restored.present, restored.conflicts) == (5, 0, [])
    assert log() == events_before, "every event back, verbatim, at its own position"
    assert snapshot() == before

    again = Restore().restore([report.archive])
    assert (again.runs, again.events, again.present) == (0, 0, 5), "restoring twice changes nothing"
    assert log() == events_before
    rebuild_all()
    assert snapshot() == before


@pytest.mark.django_db
def test_restore_into_a_log_that_moved_on(history, tmp_path, clock):
    report = Retention(history["cutoff"], archive_dir=tmp_path).run()
    assert report.archive is not None
    append_event("order-5", "order.placed", {"n": 5})
    head = Event.objects.order_by("-position").values_list("position", flat=True)[0]

    Restore().restore([report.archive])

    restored = Event.objects.filter(stream_id__in=[str(r) for r in history["going"]])
    assert restored.count() and max(restored.values_list("position", flat=True)) < head
    new = append_event("order-6", "order.placed", {"n": 6})
    assert new.position > head, "appends go on after the head, not into restored positions"
    assert WorkflowRun.objects.filter(id__in=history["going"]).count() == 5


@pytest.mark.django_db
def test_a_run_the_log_cannot_take_back_is_reported_and_the_rest_restored(
    registry, clock, tmp_path
):
    define_workflow(
        "keyed",
        trigger=on_event("order.placed"),
        idempotency_key=lambda event: event.payload["order"],
        steps=[s.return_(1)],
    )
    append_event("o-1", "order.placed", {"order": "A"})
    append_event("o-2", "order.placed", {"order": "B"})
    clock.advance(days=10)
    report = Retention(clock.now() - timedelta(days=1), archive_dir=tmp_path).run()
    assert report.runs == 2 and report.archive is not None
    append_event("o-3", "order.placed", {"order": "A"})  # a new run holds key A now

    with pytest.raises(CommandError, match="1 run"):
        call_command("kumiflow_restore", str(report.archive), verbosity=0)

    assert sorted(WorkflowRun.objects.values_list("idempotency_key", flat=True)) == ["A", "B"]  # type: ignore[type-var]
    assert WorkflowRun.objects.get(idempotency_key="A").started_at == clock.now(), "the new one"


@pytest.mark.django_db
def test_a_failed_deletion_takes_its_batch_back_out_of_the_archive(history, tmp_path, monkeypatch):
    real_delete, calls = Retention._delete, []

    def fail_the_second(self, *args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the database went away")
        return real_delete(self, *args)

    monkeypatch.setattr(Retention, "_delete", fail_the_second)
    with pytest.raises(RuntimeError):
        Retention(history["cutoff"], batch_size=2, archive_dir=tmp_path).run()
    [path] = tmp_path.iterdir()
    with gzip.open(path, "rt") as archive:
        header, *records = [json.loads(line) for line in archive]
    assert records, "the first batch is in the archive; the second was taken back"
    archived = {r["run"] for r in records}
    still_here = {
        str(r)
        for r in WorkflowRun.objects.filter(id__in=history["going"]).values_list("id", flat=True)
    }
    assert len(still_here) == 5 - len(records) and not archived & still_here
    assert not ProcessLock.objects.exclude(owner="").exists(), "the lock is released"


@pytest.mark.django_db
def test_an_archive_cut_short_restores_what_it_holds(history, tmp_path):
    report = Retention(history["cutoff"], batch_size=2, archive_dir=tmp_path).run()
    assert report.archive is not None
    data = report.archive.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) - 200])  # the last batch was being written
    restored = Restore().restore([cut])
    assert 0 < restored.runs < 5


def test_a_file_that_is_not_an_archive_is_refused(tmp_path):
    path = tmp_path / "x.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"format": "something else"}) + "\n")
    with pytest.raises(CommandError, match="not a kumiflow archive"):
        call_command("kumiflow_restore", str(path))
    with pytest.raises(CommandError, match="no such file"):
        call_command("kumiflow_restore", str(tmp_path / "missing.jsonl.gz"))


@pytest.mark.django_db
def test_the_lock_lets_one_process_in_and_frees_itself_when_it_expires(clock):
    locks.acquire(LOCK_NAME, "first", 60)
    with pytest.raises(LockHeld, match="held by first"):
        locks.acquire(LOCK_NAME, "second", 60)
    with pytest.raises(LockHeld):
        Retention(clock.now(), owner="second").run()
    clock.advance(seconds=61)
    locks.acquire(LOCK_NAME, "second", 60)  # the first one died: its lease ran out
    with transaction.atomic():
        assert not locks.renew(LOCK_NAME, "first", 60), "a holder that was taken over knows it"


@pytest.mark.django_db
def test_a_process_that_lost_the_lock_deletes_nothing_more(history, monkeypatch):
    real_renew, renewals, left = locks.renew, [], []
    going = WorkflowRun.objects.filter(id__in=history["going"])

    def taken_over_after_the_first_batch(name, owner, seconds):
        renewals.append(owner)
        if len(renewals) == 2:  # its lease ran out between two batches; another took it
            left.append(going.count())
            return False  # what renew() says then (test_the_lock_lets_one_process_in...)
        return real_renew(name, owner, seconds)

    monkeypatch.setattr(locks, "renew", taken_over_after_the_first_batch)
    with pytest.raises(LockLost):
        Retention(history["cutoff"], batch_size=1, owner="slow").run()
    assert left[0] >= 4, "one batch of one run at most"
    assert going.count() == left[0], "nothing deleted after the lock was lost"


@pytest.mark.django_db(transaction=True)
def test_a_second_retention_process_is_turned_away(registry):
    """A real second process: it finds the lock held and exits with status 1."""
    locks.acquire(LOCK_NAME, "this-test", 300)
    try:
        proc = spawn("kumiflow_retention", "--skip-checks", "--finished-before", "P1D")
        assert proc.wait(60) == 1
        assert "another kumiflow_retention is running" in output(proc)
        assert "held by this-test" in output(proc)
    finally:
        locks.release(LOCK_NAME, "this-test")
    proc = spawn("kumiflow_retention", "--skip-checks", "--finished-before", "P1D")
    assert proc.wait(60) == 0


@pytest.mark.django_db(transaction=True)
def test_the_commands_end_to_end(registry, tmp_path, clock):
    """kumiflow_retention --archive, then kumiflow_restore, in processes of their own."""
    define_workflow("quick", steps=[s.return_(1)])
    for _ in range(3):
        start_workflow("quick")
    before, events_before = snapshot(), log()
    proc = spawn(
        "kumiflow_retention",
        "--skip-checks",
        "--finished-before",
        "P1D",
        "--archive",
        str(tmp_path),
    )
    assert proc.wait(60) == 0
    assert not WorkflowRun.objects.exists()
    [archive] = tmp_path.iterdir()
    proc = spawn("kumiflow_restore", "--skip-checks", str(archive))
    assert proc.wait(60) == 0
    assert snapshot() == before
    assert log() == events_before


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_run_locked_by_another_transaction_is_passed_over_not_waited_for(registry, clock):
    define_workflow("quick", steps=[s.return_(1)])
    busy, free = start_workflow("quick"), start_workflow("quick")
    clock.advance(days=2)
    locked, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            list(for_update(WorkflowRun.objects.filter(pk=busy.id)))
            locked.set()
            release.wait(30)

    thread, errors = in_thread(hold)
    try:
        assert locked.wait(30)
        report = Retention(clock.now() - timedelta(days=1)).run()  # does not block
    finally:
        release.set()
        thread.join(30)
    assert not errors
    assert report.runs == 1
    assert list(WorkflowRun.objects.values_list("id", flat=True)) == [busy.id]
    assert not WorkflowRun.objects.filter(pk=free.id).exists()


@pytest.mark.django_db
def test_a_kind_of_owned_stream_without_work_to_do_goes_with_its_run(history):
    """A kind registered without ``keeps_run`` never keeps its run: every
    run with a delivered mail goes, the one whose mail is pending too."""
    from kumiflow_django.projections.dispatches import DISPATCHES
    from kumiflow_django.projections.retention import OwnedStream

    old_runs = WorkflowRun.objects.filter(finished_at__lt=history["cutoff"]).values("id")
    # The old run whose mail is undelivered.
    pending = Dispatch.objects.get(status="pending", run_id__in=old_runs).run_id
    with owned_streams.isolated():
        owned_streams.add("dispatches", OwnedStream("dispatches", DISPATCHES), replace=True)
        report = Retention(history["cutoff"]).run()

    assert (report.runs, report.kept) == (6, 0)
    assert report.owned["dispatches"] == 4
    assert not WorkflowRun.objects.filter(pk__in=history["going"] | {pending}).exists()


def test_what_a_run_owns_is_one_registry():
    assert list(owned_streams) == ["dispatches", "tasks"]
    assert retention_module.owned_streams is owned_streams


def _rewind_position_counter() -> None:
    """Make the log's position counter start again from 1, as in a new database."""
    table = Event._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_get_serial_sequence(%s, 'position')", [table])
            cursor.execute(f"ALTER SEQUENCE {cursor.fetchone()[0]} RESTART WITH 1")
        elif connection.vendor == "mysql":
            cursor.execute(f"ALTER TABLE {table} AUTO_INCREMENT = 1")
        else:
            cursor.execute("DELETE FROM sqlite_sequence WHERE name = %s", [table])


@pytest.mark.django_db(transaction=True)
def test_restore_into_a_database_whose_counter_is_behind_the_archive(registry, clock, tmp_path):
    """Appends after the restore never take a restored position."""
    define_workflow("quick", steps=[s.return_(1)])
    for _ in range(3):
        start_workflow("quick")
    clock.advance(days=2)
    report = Retention(clock.now() - timedelta(days=1), archive_dir=tmp_path).run()
    assert report.archive is not None
    call_command("flush", interactive=False, verbosity=0)  # an empty database
    _rewind_position_counter()

    Restore().restore([report.archive])
    highest = max(Event.objects.values_list("position", flat=True))
    assert append_event("next", "order.placed").position > highest


@pytest.mark.django_db
def test_an_archive_that_cannot_be_written_deletes_nothing_and_frees_the_lock(history, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(OSError):
        Retention(history["cutoff"], archive_dir=blocked / "archive").run()
    assert WorkflowRun.objects.filter(id__in=history["going"]).count() == 5
    assert not ProcessLock.objects.exclude(owner="").exists()


@pytest.mark.django_db
def test_a_run_goes_with_its_tasks_and_comes_back_with_them(registry, clock, tmp_path):
    from kumiflow_django.models import StepTask
    from testproject.shop.tasks import double

    define_workflow("tasked", steps=[s.task("doubled", double, args=[2])])
    run = start_workflow("tasked")
    run_until_idle()
    task = StepTask.objects.get(run_id=run.id)
    before_task = list(StepTask.objects.values())
    before = log()
    clock.advance(days=10)

    report = Retention(clock.now() - timedelta(days=1), archive_dir=tmp_path).run()
    assert (report.runs, report.owned["tasks"]) == (1, 1)
    assert not StepTask.objects.exists()
    assert not Event.objects.filter(stream_id=str(task.id)).exists()

    assert report.archive is not None
    Restore().restore([report.archive])
    assert list(StepTask.objects.values()) == before_task
    assert log() == before


# -- the default batch and pause ------------------------------------------------------


def _waits(retention: Retention) -> list[float]:
    """The pauses ``retention`` takes between batches (recorded, not slept)."""
    waits: list[float] = []

    def wait(timeout: float | None = None) -> bool:
        waits.append(timeout or 0.0)
        return False

    retention._stopping.wait = wait  # type: ignore[method-assign]
    return waits


@pytest.mark.django_db
def test_the_batch_and_the_pause_default_to_the_settings(history, settings):
    settings.KUMIFLOW_RETENTION_BATCH_SIZE = 2
    settings.KUMIFLOW_RETENTION_PAUSE = 0.25
    retention = Retention(history["cutoff"])
    waits = _waits(retention)
    report = retention.run()
    assert report.runs == 5 and report.batches >= 3
    assert waits == [0.25] * report.batches, "one pause after every batch"


@pytest.mark.django_db
def test_a_pause_of_zero_given_to_the_command_turns_the_pause_off(history, settings, monkeypatch):
    settings.KUMIFLOW_RETENTION_PAUSE = 0.25

    class Recorded(Retention):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)
            self.waits = _waits(self)

    made: list[Recorded] = []

    monkeypatch.setattr(
        "kumiflow_django.management.commands.kumiflow_retention.Retention", Recorded
    )
    call_command("kumiflow_retention", "--finished-before", "P50D", "--pause", "0", verbosity=0)
    (retention,) = made
    assert (retention.pause, retention.batch_size, retention.waits) == (0.0, 500, [])
    assert not WorkflowRun.objects.filter(id__in=history["going"]).exists()


def test_the_retention_settings_are_checked(settings):
    from kumiflow_django.checks import check_settings

    settings.KUMIFLOW_RETENTION_BATCH_SIZE = 0
    settings.KUMIFLOW_RETENTION_PAUSE = -0.5
    found = {m.id for m in check_settings()}
    assert {"kumiflow.E080", "kumiflow.E081"} <= found
    settings.KUMIFLOW_RETENTION_BATCH_SIZE = 100
    settings.KUMIFLOW_RETENTION_PAUSE = 0
    found = {m.id for m in check_settings()}
    assert not found & {"kumiflow.E080", "kumiflow.E081"}
    with pytest.raises(ValueError, match="pause"):
        Retention(datetime.now(UTC), pause=-1)
