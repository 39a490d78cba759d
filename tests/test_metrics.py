"""Prometheus metrics: counters and histograms of the work a process did,
gauges read from the database at scrape time, served by a Django view and by
``kumiflow_worker --metrics-port``, both scraped over real HTTP and parsed
with prometheus_client's own parser."""

from __future__ import annotations

import datetime as dt
import re
import threading
import uuid

import pytest
import requests
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from kumiflow_django import append_event, cancel_run, define_workflow, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.checks import check_settings
from kumiflow_django.definition import serving
from kumiflow_django.models import Dispatch, RunStatus, WorkflowRun
from kumiflow_django.observability import metrics
from kumiflow_django.observability.metrics import DatabaseCollector, MetricsServer
from kumiflow_django.store import telemetry
from kumiflow_django.testing import run_until_idle
from kumiflow_django.workers.worker import Worker
from tests.processes import output, spawn, stop, wait_for
from tests.receiver import Receiver, Reply

TOKEN = "a-metrics-token-of-32-characters"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def registry_():
    with metrics.isolated() as registry:
        yield registry


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


# -- counters and histograms ----------------------------------------------


@pytest.mark.django_db
def test_runs_are_counted_per_workflow_when_their_transaction_commits(
    registry, registry_, django_capture_on_commit_callbacks
):
    define_workflow("ok", steps=[s.compute("a", lambda ctx: 1)])
    define_workflow("bad", steps=[s.compute("a", lambda ctx: 1 / 0)])
    define_workflow("slow", steps=[s.wait("P1D")])
    with django_capture_on_commit_callbacks(execute=True):
        start_workflow("ok")
        start_workflow("ok")
        start_workflow("bad")
        cancel_run(start_workflow("slow").id, reason="not needed")

    assert value(registry_, "kumiflow_runs_started_total", workflow="ok") == 2
    assert value(registry_, "kumiflow_runs_completed_total", workflow="ok") == 2
    assert value(registry_, "kumiflow_runs_failed_total", workflow="bad", reason="step_failed") == 1
    assert value(registry_, "kumiflow_runs_cancelled_total", workflow="slow") == 1
    assert value(registry_, "kumiflow_segments_total", workflow="ok", outcome="completed") == 2
    assert value(registry_, "kumiflow_segments_total", workflow="bad", outcome="failed") == 1
    assert value(registry_, "kumiflow_segments_total", workflow="slow", outcome="suspended") == 1
    assert value(registry_, "kumiflow_segment_duration_seconds_count", workflow="ok") == 2

    # A start whose transaction rolls back started nothing.
    with (
        django_capture_on_commit_callbacks(execute=True),
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        start_workflow("ok")
        raise RuntimeError("the request failed")
    assert value(registry_, "kumiflow_runs_started_total", workflow="ok") == 2


@pytest.mark.django_db
def test_wake_lateness_is_now_minus_the_wake_time(registry, registry_, clock):
    define_workflow("nap", steps=[s.wait("PT1H"), s.compute("after", lambda ctx: 1)])
    start_workflow("nap")
    clock.advance(hours=1, seconds=30)
    assert run_until_idle().resumed == 1
    labels = {"workflow": "nap", "reason": "timer"}
    assert value(registry_, "kumiflow_wake_lateness_seconds_count", **labels) == 1
    assert value(registry_, "kumiflow_wake_lateness_seconds_sum", **labels) == 30.0
    assert value(registry_, "kumiflow_wake_lateness_seconds_bucket", **labels, le="10.0") == 0
    assert value(registry_, "kumiflow_wake_lateness_seconds_bucket", **labels, le="30.0") == 1


@pytest.mark.django_db
def test_deliveries_are_counted_by_outcome_with_their_latency(registry, registry_, clock, settings):
    settings.KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
    settings.KUMIFLOW_DISPATCH_RETRY = {"attempts": 2, "base": 10.0, "jitter": 0.0}
    with Receiver(Reply(503), Reply(200)) as receiver:
        define_workflow("hook", steps=[s.webhook_send(receiver.url, body={})])
        start_workflow("hook")
        clock.advance(seconds=5)
        run_until_idle()
        clock.advance(seconds=10)
        run_until_idle()
    assert value(registry_, "kumiflow_deliveries_total", kind="webhook", outcome="retry") == 1
    assert value(registry_, "kumiflow_deliveries_total", kind="webhook", outcome="delivered") == 1
    assert value(registry_, "kumiflow_delivery_latency_seconds_sum", kind="webhook") == 15.0
    labels = {"kind": "webhook", "outcome": "delivered"}
    assert value(registry_, "kumiflow_delivery_duration_seconds_count", **labels) == 1


def test_the_task_attempt_hook_counts_attempts_and_their_duration(registry_):
    for outcome in ("failed", "succeeded"):
        with telemetry.task_attempt(
            run_id=uuid.uuid4(),
            workflow="agent",
            tenant="acme",
            step_path=[0],
            task="fetch",
            attempt=1,
        ) as attempt:
            attempt.outcome = outcome
    labels = {"workflow": "agent", "task": "fetch"}
    assert value(registry_, "kumiflow_task_attempts_total", **labels, outcome="failed") == 1
    assert value(registry_, "kumiflow_task_attempts_total", **labels, outcome="succeeded") == 1
    assert value(registry_, "kumiflow_task_duration_seconds_count", **labels, outcome="failed") == 1


@pytest.mark.django_db
def test_a_broken_integration_never_fails_the_work_it_watches(registry, caplog):
    class Broken:
        def count(self, metric, value, labels):
            raise ValueError("wrong labels")

        observe = count

        def span(self, *args):
            raise RuntimeError("no tracer")

        def carrier(self):
            raise RuntimeError("no context")

    define_workflow("ok", steps=[s.compute("a", lambda ctx: 1)])
    with telemetry.isolated():
        telemetry.set_meter(Broken())
        telemetry.set_tracer(Broken())
        assert start_workflow("ok").status == RunStatus.COMPLETED
        assert append_event("s1", "anything", {}).metadata == {}
    assert "telemetry: segments could not be counted" in caplog.text
    assert "telemetry: the segment span could not be started" in caplog.text
    assert "telemetry: the trace context could not be read" in caplog.text


@pytest.mark.django_db
def test_every_declared_metric_is_exposed(registry_):
    names = {family.name for family in registry_.collect()}
    for name in telemetry.METRICS:
        assert f"kumiflow_{name}" in names, name


@pytest.mark.parametrize(
    ("name", "setting", "check_id"),
    [
        ("TRACING", "yes", "kumiflow.E030"),
        ("METRICS", 1, "kumiflow.E031"),
        ("METRICS_TOKEN", "too-short", "kumiflow.E032"),
        ("METRICS_TOKEN", [], "kumiflow.E032"),
        ("METRICS_TOKEN", [TOKEN, 7], "kumiflow.E032"),
        ("METRICS_TOKEN", f" {TOKEN}", "kumiflow.E032"),
    ],
)
def test_the_observability_settings_are_checked(name, setting, check_id, settings):
    setattr(settings, f"KUMIFLOW_{name}", setting)
    assert [message.id for message in check_settings()] == [check_id]


def test_integrations_asked_for_pass_the_checks_where_installed(settings):
    settings.KUMIFLOW_TRACING = settings.KUMIFLOW_METRICS = True
    settings.KUMIFLOW_METRICS_TOKEN = [TOKEN, TOKEN[::-1]]
    assert check_settings() == []


# -- gauges from the database ---------------------------------------------


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


@pytest.mark.django_db
def test_the_gauges_are_read_from_the_database_at_scrape_time(registry, registry_, clock):
    clock.set(at("2026-05-01T12:00:00+00:00"))
    define_workflow("nap", steps=[s.wait("PT1H")])
    define_workflow(
        "await",
        trigger=on_event("go"),
        steps=[s.wait_for_event("paid", match={"payload.k": 1}, timeout=None)],
    )
    define_workflow("hook", steps=[s.webhook_send("https://hooks.example.com/x", body={})])
    for _ in range(3):
        start_workflow("nap")
    append_event("g1", "go", {})
    start_workflow("hook")
    Dispatch.objects.update(status="dead", next_attempt_at=None)
    start_workflow("hook")

    assert value(registry_, "kumiflow_runs_due") == 0
    assert value(registry_, "kumiflow_runs_waiting", status="waiting") == 3
    assert value(registry_, "kumiflow_runs_waiting", status="waiting_event") == 1
    assert value(registry_, "kumiflow_runs_waiting", status="retry_scheduled") == 0
    assert value(registry_, "kumiflow_outbox_pending") == 1
    assert value(registry_, "kumiflow_outbox_dead") == 1
    assert value(registry_, "kumiflow_outbox_due") == 1
    assert value(registry_, "kumiflow_database_up") == 1

    assert value(registry_, "kumiflow_runs_waiting_for_definition") == 0
    clock.advance(hours=3)  # no worker ran: the three naps are due, two hours late
    assert value(registry_, "kumiflow_runs_due") == 3
    # ...and no live worker process serves their definition (none has a heartbeat)
    assert value(registry_, "kumiflow_runs_waiting_for_definition") == 3
    serving.beat("a-worker")  # this process's definitions: now served
    assert value(registry_, "kumiflow_runs_waiting_for_definition") == 0
    assert value(registry_, "kumiflow_runs_oldest_due_age_seconds") == 7200
    assert value(registry_, "kumiflow_outbox_oldest_due_age_seconds") == 3 * 3600


@pytest.mark.django_db
def test_a_database_that_cannot_be_read_is_reported_not_guessed(registry_, monkeypatch, caplog):
    def unreachable(self, now):
        raise DatabaseError("server closed the connection")

    monkeypatch.setattr(DatabaseCollector, "read", unreachable)
    assert value(registry_, "kumiflow_database_up") == 0
    assert value(registry_, "kumiflow_runs_due") is None
    assert "metrics: reading the database failed" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_scrape_in_a_thread_of_its_own_leaves_no_connection_open(registry_):
    """prometheus_client's own server answers each scrape in a new thread."""
    from django.db import connections

    left_open = []

    def scrape():
        assert registry_.get_sample_value("kumiflow_database_up") == 1
        left_open.append(connections["default"].connection is not None)

    thread = threading.Thread(target=scrape)
    thread.start()
    thread.join(30)
    assert left_open == [False]


def explain(sql: str) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql)
            return "\n".join(str(row[-1]) for row in cursor.fetchall())
        cursor.execute("EXPLAIN " + sql)
        rows = cursor.fetchall()
        if connection.vendor == "postgresql":
            return "\n".join(row[0] for row in rows)
        columns = [c[0] for c in cursor.description]
        return "\n".join(
            f"{row[columns.index('table')]} type={row[columns.index('type')]} "
            f"key={row[columns.index('key')]}"
            for row in rows
        )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_gauge_queries_read_indexes_not_the_tables():
    """With 20,000 finished runs and delivered dispatches, every gauge query
    reads one of the indexes the engine already has."""
    now = at("2026-05-01T12:00:00+00:00")
    done = {"status": RunStatus.COMPLETED, "version": 2, "started_at": now, "updated_at": now}
    WorkflowRun.objects.bulk_create(
        [WorkflowRun(tenant_id="t", workflow="w", fingerprint="f", **done) for _ in range(20_000)],
        batch_size=2000,
    )
    delivered = {"status": "delivered", "version": 3, "created_at": now, "updated_at": now}
    Dispatch.objects.bulk_create(
        [Dispatch(tenant_id="t", kind="webhook", **delivered) for _ in range(20_000)],
        batch_size=2000,
    )
    with connection.cursor() as cursor:
        for table in ("kumiflow_workflowrun", "kumiflow_dispatch"):
            cursor.execute(
                f"ANALYZE TABLE {table}" if connection.vendor == "mysql" else f"ANALYZE {table}"
            )
            if connection.vendor == "mysql":
                cursor.fetchall()
    with CaptureQueriesContext(connection) as captured:
        DatabaseCollector().read(now)
    indexes = {
        "kumiflow_workflowrun": (
            "kumiflow_run_due_idx",
            "kumiflow_run_status_idx",
            "kumiflow_run_finished_idx",  # (status, finished_at): the console's
        ),
        "kumiflow_dispatch": ("kumiflow_dispatch_due_idx", "kumiflow_dispatch_status_idx"),
    }
    # The heartbeat rows (one per worker process: a table this small is read
    # whole) say which runs wait for a definition: the seventh query reads the
    # due range once more.
    heartbeats = [q for q in captured.captured_queries if "kumiflow_workerprocess" in q["sql"]]
    assert len(heartbeats) == 1
    assert len(captured.captured_queries) == 8
    for query in captured.captured_queries:
        sql = query["sql"]
        if query in heartbeats:
            continue
        table = "kumiflow_workflowrun" if "kumiflow_workflowrun" in sql else "kumiflow_dispatch"
        plan = explain(sql)
        assert any(index in plan for index in indexes[table]), f"{sql}\n{plan}"
        assert not re.search(rf"Seq Scan on {table}|SCAN {table}\b(?! USING)|type=ALL", plan), plan


# -- the endpoints, over HTTP ----------------------------------------------


@pytest.fixture
def scraped(registry, registry_, transactional_db, settings, live_server):
    settings.ROOT_URLCONF = "tests.metrics_urls"
    settings.KUMIFLOW_METRICS_TOKEN = TOKEN
    define_workflow("ok", steps=[s.compute("a", lambda ctx: 1)])
    start_workflow("ok")
    return f"{live_server.url}/metrics"


def test_the_view_serves_the_exposition_format_to_a_bearer_token(scraped):
    response = requests.get(scraped, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "no-cache" in response.headers["Cache-Control"]
    samples = parse(response.text)
    assert sample(samples, "kumiflow_segments_total", workflow="ok", outcome="completed") == 1
    assert sample(samples, "kumiflow_runs_waiting", status="waiting") == 0
    assert sample(samples, "kumiflow_database_up") == 1


def test_the_view_answers_openmetrics_when_asked(scraped):
    response = requests.get(
        scraped,
        headers={
            "Authorization": f"Bearer {TOKEN}",
            "Accept": "application/openmetrics-text; version=1.0.0",
        },
        timeout=10,
    )
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")


def test_the_view_refuses_strangers_and_wrong_tokens(scraped):
    anonymous = requests.get(scraped, timeout=10)
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    assert "kumiflow_" not in anonymous.text
    wrong = requests.get(scraped, headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401
    basic = requests.get(scraped, headers={"Authorization": f"Basic {TOKEN}"}, timeout=10)
    assert basic.status_code == 401


def test_the_view_lets_in_a_user_with_the_permission_to_view_runs(
    scraped, client, django_user_model
):
    user = django_user_model.objects.create_user("ops", password="x")
    client.force_login(user)
    cookies = {"sessionid": client.cookies["sessionid"].value}
    assert requests.get(scraped, cookies=cookies, timeout=10).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    response = requests.get(scraped, cookies=cookies, timeout=10)
    assert response.status_code == 200
    assert sample(parse(response.text), "kumiflow_database_up") == 1


@pytest.mark.django_db
def test_the_view_says_when_metrics_are_switched_off(rf, admin_user):
    request = rf.get("/metrics")
    request.user = admin_user
    with telemetry.isolated():
        metrics.uninstall()
        try:
            response = metrics.metrics_view(request)
        finally:
            metrics.install()
    assert response.status_code == 404
    assert b"KUMIFLOW_METRICS" in response.content


@pytest.mark.django_db(transaction=True)
def test_the_worker_serves_metrics_beside_its_loops_and_stops_them_with_it(registry_, settings):
    settings.KUMIFLOW_METRICS_TOKEN = [TOKEN, "the-token-being-rotated-out-now"]
    server = MetricsServer("127.0.0.1", 0)
    worker = Worker(max_interval=0.2, services=[server])
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert requests.get(server.url, timeout=10).status_code == 401
        for token in settings.KUMIFLOW_METRICS_TOKEN:
            response = requests.get(
                server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
            )
            assert response.status_code == 200
            assert sample(parse(response.text), "kumiflow_database_up") == 1
        assert requests.get(server.url.replace("/metrics", "/other"), timeout=10).status_code == 404
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    with pytest.raises(requests.ConnectionError):
        requests.get(server.url, timeout=10)


@pytest.mark.django_db(transaction=True)
def test_kumiflow_worker_metrics_port_serves_the_process_and_the_database():
    with transaction.atomic():
        append_event("p1", "poison.requested", {})  # a deferred run: the worker runs it
    worker = spawn(
        "kumiflow_worker", "--no-cron", "--no-dispatch", "--max-interval", "0.2",
        "--metrics-port", "0", "-v", "1",
    )  # fmt: skip
    try:
        wait_for(lambda: "metrics: serving http://" in output(worker), 60, "the metrics endpoint")
        url = re.search(r"metrics: serving (http://\S+)", output(worker))[1]  # type: ignore[index]

        def scrape() -> Samples:
            return parse(requests.get(url, timeout=10).text)

        wait_for(
            lambda: (
                sample(
                    scrape(), "kumiflow_segments_total", workflow="poison-pill", outcome="suspended"
                )
                == 1
            ),
            60,
            "the worker's segment in its own counters",
        )
        samples = scrape()
        assert sample(samples, "kumiflow_runs_waiting", status="waiting") == 1
        # Counters are per process: this test's process started the run.
        assert sample(samples, "kumiflow_runs_started_total", workflow="poison-pill") is None
    finally:
        codes = stop([worker])
    assert codes == [0], output(worker)[-2000:]
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=10)


@pytest.mark.django_db
def test_the_metrics_port_is_refused_where_it_cannot_serve():
    with pytest.raises(CommandError, match="not --once"):
        call_command("kumiflow_worker", "--once", "--metrics-port", "0")
    with socket_in_use() as port, pytest.raises(CommandError, match="cannot listen"):
        call_command("kumiflow_worker", "--metrics-port", str(port))


def socket_in_use():
    import contextlib
    import socket

    @contextlib.contextmanager
    def bound():
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            yield taken.getsockname()[1]

    return bound()
