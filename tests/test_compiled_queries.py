"""A query compiled once per shape (``store.sql.values``) must send what the
ORM would send for the same query each time: the same SQL, the same values
adapted the same way, the same rows converted the same way; and a key that
names its shape must not serve another shape's statement."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import NotSupportedError, connection, models, transaction
from django.db.models import Q, QuerySet
from django.db.transaction import TransactionManagementError

from kumiflow_django import append_event, define_workflow, on_event
from kumiflow_django import steps as s
from kumiflow_django.engine import unserved
from kumiflow_django.models import WorkflowRun
from kumiflow_django.projections.claims import unclaimed
from kumiflow_django.store import db, leases
from kumiflow_django.store import sql as rowsql
from kumiflow_django.workers import resume

pytestmark = pytest.mark.django_db

NOW = rowsql.Slot("now", models.DateTimeField())


@pytest.fixture
def waits(registry):
    """Start a run that waits ``minutes`` (1, 60 or 120): due once the clock has passed them."""
    for minutes in (1, 60, 120):
        define_workflow(
            f"nap{minutes}",
            trigger=on_event(f"nap.{minutes}"),
            steps=[s.wait(f"PT{minutes}M"), s.return_(1)],
        )

    def start(minutes: int) -> WorkflowRun:
        before = set(WorkflowRun.objects.values_list("id", flat=True))
        append_event(f"nap-{uuid.uuid4()}", f"nap.{minutes}")
        (run,) = WorkflowRun.objects.exclude(id__in=before)
        return run

    return start


def _same_as_orms(key: object, orm: QuerySet[Any, Any], **slots: object) -> None:
    """The statement compiled under ``key``, its slots bound to ``slots``, is
    the ORM's for ``orm`` (where the ORM inlines a value, the compiled query
    has the same value in parentheses: an expression's ``(%s)``)."""
    compiled = rowsql._COMPILED[(key, "default")]
    with transaction.atomic():
        sql, params = orm.query.get_compiler(using="default").as_sql()
    assert re.sub(r"([<>=]) \(%s\)", r"\1 %s", compiled.sql) == sql
    bound = [
        p.bind(slots[p.name], connection) if isinstance(p, rowsql.Slot) else p
        for p in compiled.params
    ]
    assert bound == list(params)


@pytest.fixture(autouse=True)
def _fresh_cache():
    rowsql._COMPILED.clear()
    yield
    rowsql._COMPILED.clear()


def test_the_due_probe_sends_the_orms_statement_and_reads_its_rows(waits, clock):
    due, later, leased = waits(1), waits(60), waits(1)
    clock.advance(minutes=2)
    WorkflowRun.objects.filter(pk=leased.pk).update(
        lease_owner="other", lease_until=clock.now() + timedelta(minutes=5)
    )
    only = unserved.claim_filter()
    now = clock.now()

    def orm() -> list[tuple[object, ...]]:
        qs = WorkflowRun.objects.due(now).filter(leases.free_q(now), only)
        return list(qs.order_by("wake_at").values_list(*resume._COLUMNS)[:101])

    def compiled() -> list[tuple[object, ...]]:
        return rowsql.values(
            ("test probe", only),
            lambda: (
                resume._due(NOW, True, only).order_by("wake_at").values_list(*resume._COLUMNS)[:101]
            ),
            using="default",
            now=now,
        )

    assert compiled() == orm()
    qs = WorkflowRun.objects.due(now).filter(leases.free_q(now), only)
    _same_as_orms(
        ("test probe", only), qs.order_by("wake_at").values_list(*resume._COLUMNS)[:101], now=now
    )
    assert [row[0] for row in compiled()] == [due.id]  # not the later one, not the leased one
    assert later.id not in {row[0] for row in compiled()}


def test_the_lease_read_binds_each_key_and_moment_anew(waits, clock):
    first, second = waits(1), waits(1)
    clock.advance(minutes=2)
    only = unserved.claim_filter()

    def lease(run: WorkflowRun, now: object) -> list[tuple[object, ...]]:
        with transaction.atomic():
            return rowsql.values(
                ("test lease", 1, only),
                lambda: resume._leasing(1, only),
                using="default",
                now=now,
                id0=run.id,
            )

    assert [row[0] for row in lease(first, clock.now())] == [first.id]
    assert [row[0] for row in lease(second, clock.now())] == [second.id]
    # Before their wake time the same statement finds nothing: the moment is bound too.
    assert lease(first, clock.now() - timedelta(hours=1)) == []
    now = clock.now()
    assert lease(first, now) == list(
        WorkflowRun.objects.filter(pk=first.pk).values_list(*resume._Leased._fields)
    )
    rows = WorkflowRun.objects.due(now).filter(leases.free_q(now), only, pk__in=[first.id])
    _same_as_orms(
        ("test lease", 1, only),
        unclaimed(rows).values_list(*resume._Leased._fields),
        now=now,
        id0=first.id,
    )


@pytest.mark.django_db(transaction=True)
def test_a_locking_compiled_read_outside_a_transaction_is_refused_as_the_orm_refuses_it(waits):
    only = unserved.claim_filter()
    run = waits(1)
    if not connection.features.has_select_for_update:
        pytest.skip("nothing is locked on this database")  # noqa: PT018 - a fact of the backend
    for _ in range(2):  # when it is compiled, and when it is served from the cache
        with pytest.raises(TransactionManagementError):
            rowsql.values(
                ("test lock", only),
                lambda: unclaimed(WorkflowRun.objects.filter(pk=run.id)).values_list("id"),
                using="default",
            )
        with transaction.atomic():
            rows = rowsql.values(
                ("test lock", only),
                lambda: unclaimed(WorkflowRun.objects.filter(pk=run.id)).values_list("id"),
                using="default",
            )
        assert rows == [(run.id,)]


def test_a_compiled_query_selects_columns_only():
    with pytest.raises(TypeError, match="plain columns"):
        rowsql.values(
            "test annotation",
            lambda: WorkflowRun.objects.annotate(n=models.Count("id")).values_list("n"),
            using="default",
        )


def test_a_slot_without_a_value_is_an_error_not_a_null():
    with pytest.raises(KeyError):
        rowsql.values(
            "test missing",
            lambda: WorkflowRun.objects.filter(wake_at__lte=NOW).values_list("id"),
            using="default",
        )


def test_the_next_due_run_is_the_orms(waits, clock):
    assert resume.ResumeLoop().next_due() is None
    waits(120)
    soon = waits(60)
    assert resume.ResumeLoop().next_due() == soon.wake_at
    clock.advance(minutes=200)
    assert resume.ResumeLoop().run_once() == 2
    assert resume.ResumeLoop().next_due() is None


def test_a_query_that_can_match_nothing_reads_nothing_as_the_orm_does(waits, clock):
    waits(1)
    clock.advance(minutes=2)
    nobody = Q(fingerprint__in=[]) | Q(status="queued", workflow__in=[])
    assert list(resume._due(clock.now(), True, nobody).values_list("id")) == []
    assert resume.due_runs(clock.now(), 10, free=True, only=nobody) == []
    assert len(resume.due_runs(clock.now(), 10, free=True, only=unserved.claim_filter())) == 1


def test_the_idle_loops_polls_read_what_the_orm_reads(registry, clock):
    from kumiflow_django import on_cron, start_workflow
    from kumiflow_django.cron.schedules import sync_schedules
    from kumiflow_django.models import CronSchedule, Dispatch
    from kumiflow_django.outbox.delivery import due_dispatches
    from kumiflow_django.workers.cron import CronLoop
    from kumiflow_django.workers.dispatch import DispatchLoop

    assert DispatchLoop().next_due() is None
    assert CronLoop().next_due() is None
    define_workflow("nightly", trigger=on_cron("0 9 * * *"), steps=[s.return_(1)])
    define_workflow("hook", steps=[s.webhook_send("https://crm.example.com/hook", body={})])
    sync_schedules()
    start_workflow("hook")
    start_workflow("hook")

    first = Dispatch.objects.order_by("next_attempt_at").values_list("next_attempt_at", flat=True)
    assert DispatchLoop().next_due() == first.first()
    fires = CronSchedule.objects.order_by("next_fire_at").values_list("next_fire_at", flat=True)
    assert CronLoop().next_due() == fires.first() is not None
    for now in (clock.now() - timedelta(hours=1), clock.now()):
        orm = Dispatch.objects.due(now).order_by("next_attempt_at").values_list("id", "version")
        assert due_dispatches(now, 10) == list(orm[:10])
    assert len(due_dispatches(clock.now(), 10)) == 2
    assert len(due_dispatches(clock.now(), 1)) == 1  # the limit is part of the shape


def test_a_slot_bound_to_none_is_refused_not_compared_with_null():
    with pytest.raises(ValueError, match="no None"):
        rowsql.values(
            "test none",
            lambda: WorkflowRun.objects.filter(wake_at__lte=NOW).values_list("id"),
            using="default",
            now=None,
        )


def test_an_update_returning_the_rows_as_they_were_is_refused_where_it_cannot_be_one():
    if db.claims_in_one_statement():
        pytest.skip("it can here")  # noqa: PT018
    with pytest.raises(NotSupportedError):
        rowsql.update_selected(
            "test update",
            lambda: WorkflowRun.objects.values_list("id"),
            using="default",
            sets={"lease_owner": "w"},
        )
