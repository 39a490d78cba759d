"""The one rule of when a lease is free (store/leases.py): the resume loop's
claim, the admin's "stalled" list and figure, and the run page agree on a free,
a leased, an expired run and one at the last instant of its lease."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.urls import reverse

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.admin import overview
from kumiflow_django.models import WorkflowRun
from kumiflow_django.store import db, leases
from kumiflow_django.workers.resume import ResumeLoop, due_runs

pytestmark = pytest.mark.django_db

#: Each run's lease, in seconds from now (None: no lease).
LEASES = {"free": None, "leased": 60.0, "expired": -1.0, "at-expiry": 0.0}


@pytest.fixture
def naps(registry, clock):
    """Four due runs, one per kind of lease in ``LEASES``; their names by id."""
    define_workflow("nap", steps=[s.wait("PT1M"), s.return_("rested")])
    runs = {name: start_workflow("nap") for name in LEASES}
    clock.advance(minutes=2)
    now = clock.now()
    for name, offset in LEASES.items():
        if offset is not None:
            WorkflowRun.objects.filter(pk=runs[name].pk).update(
                lease_owner=f"worker-{name}", lease_until=now + timedelta(seconds=offset)
            )
    return {run.pk: name for name, run in runs.items()}


def test_the_claim_and_the_admin_agree_on_which_leases_are_free(admin_client, naps, clock):
    now = clock.now()
    assert {naps[d.id] for d in due_runs(now, 10)} == set(LEASES)
    claimable = {naps[d.id] for d in due_runs(now, 10, free=True)}
    assert claimable == {"free", "expired"}

    url = reverse("admin:kumiflow_workflowrun_changelist") + "?attention=stalled"
    listed = {naps[run.pk] for run in admin_client.get(url).context["cl"].result_list}
    assert listed == {"expired"}  # leased by a worker that stopped: claimable, not free
    assert overview.backlog(now)["stalled"].value == 1
    for pk, name in naps.items():
        page = admin_client.get(reverse("admin:kumiflow_workflowrun_change", args=[pk]))
        assert (b"ran out: the next worker takes it over" in page.content) == (name == "expired")

    # The lease itself: the same rows are taken, the stalled one as a recovery.
    claimed = ResumeLoop(worker_id="worker-new", threads=1)._lease(due_runs(now, 10), now)
    assert {naps[c.id] for c in claimed} == claimable
    assert [naps[c.id] for c in claimed if c.recovered] == ["expired"]


NOW = datetime(2026, 1, 1, tzinfo=UTC)
CASES = [
    (owner, until)
    for owner in ("", "worker")
    for until in (None, NOW - timedelta(microseconds=1), NOW, NOW + timedelta(seconds=1))
    if bool(owner) == (until is not None)  # a lease has both or neither
]


@pytest.mark.parametrize(("owner", "until"), CASES)
def test_the_query_and_the_python_forms_of_the_rule_agree(registry, owner, until):
    define_workflow("nap", steps=[s.wait("PT1M"), s.return_("rested")])
    run = start_workflow("nap")
    WorkflowRun.objects.filter(pk=run.pk).update(lease_owner=owner, lease_until=until)
    row = WorkflowRun.objects.filter(pk=run.pk)
    assert row.filter(leases.free_q(NOW)).exists() == leases.free(owner, until, NOW)
    assert row.filter(leases.stalled_q(NOW)).exists() == leases.stalled(owner, until, NOW)
    assert row.filter(leases.ran_out_q(NOW)).exists() == leases.ran_out(until, NOW)
    # Held up to and including its last instant; free after it, or with no lease.
    assert leases.free(owner, until, NOW) == (until is None or until < NOW)


@pytest.mark.django_db(transaction=True)
def test_a_lease_of_its_own_takes_the_same_rows_and_writes_itself(naps, clock):
    """Outside a transaction (a worker's loop) the lease is a transaction of
    its own: one statement on PostgreSQL, which must take what the locking
    read takes, say which it took over, and leave the others as they were."""
    now = clock.now()
    claimed = ResumeLoop(worker_id="worker-new", threads=1)._lease(due_runs(now, 10), now)
    assert {naps[c.id] for c in claimed} == {"free", "expired"}
    (recovered,) = [c.recovered for c in claimed if c.recovered]
    assert recovered["from"] == "worker-expired"
    owners = {naps[pk]: owner for pk, owner in WorkflowRun.objects.values_list("id", "lease_owner")}
    assert owners == {
        "free": "worker-new",
        "expired": "worker-new",
        "leased": "worker-leased",
        "at-expiry": "worker-at-expiry",
    }
    # Taken now: another worker's lease of the same runs takes none of them.
    assert ResumeLoop(worker_id="worker-other", threads=1)._lease(due_runs(now, 10), now) == []


@pytest.mark.django_db(transaction=True)
def test_a_lease_of_its_own_held_up_by_a_table_lock_leases_once_it_is_gone(naps, clock):
    """A migration that locks the run table (a non-concurrent CREATE INDEX
    blocks an UPDATE) holds up the one-statement lease as it holds up the
    due probe: the lease goes on when the lock is gone, takes the same runs,
    and leaves its connection's session as it found it (no SET: behind a
    transaction pooler a session's SET would land on another client's
    server connection)."""
    if not db.claims_in_one_statement():
        pytest.skip("the lease is a transaction here, bounded as every one")  # noqa: PT018
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
        )
        session = cursor.fetchone()
    now = clock.now()
    chunk = due_runs(now, 10)
    table = WorkflowRun._meta.db_table
    locked, release = threading.Event(), threading.Event()
    leased: list[object] = []
    after: list[object] = []

    def hold_the_table() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {table} IN SHARE MODE")  # a CREATE INDEX's lock
                locked.set()
                assert release.wait(timeout=30)
        finally:
            connection.close()

    def lease() -> None:
        try:
            leased.extend(ResumeLoop(worker_id="worker-new", threads=1)._lease(chunk, now))
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
                )
                after.append(cursor.fetchone())
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_table)
    holder.start()
    assert locked.wait(timeout=30)
    leaser = threading.Thread(target=lease)
    leaser.start()
    try:
        with connection.cursor() as cursor:  # the lease waits for the table's lock
            for _ in range(3000):
                cursor.execute(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
                    [table],
                )
                if cursor.fetchone()[0]:
                    break
                threading.Event().wait(0.01)
            else:
                pytest.fail("the lease never waited for the table's lock")
        assert not leased
    finally:
        release.set()
        holder.join(timeout=30)
        leaser.join(timeout=30)
    assert {naps[c.id] for c in leased} == {"free", "expired"}  # type: ignore[attr-defined]
    assert after == [session]  # the lease's session: as the server set it
