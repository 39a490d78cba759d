"""Years of history, loaded in bulk: finished runs cloned from one real run.

    python -m bench.history DATABASE_URL RUNS [--newest-days 100] [--oldest-days 400]

One run of ``bench-w10`` goes through the engine (its trigger event and four
run events: started, waiting, resumed, completed); it is cloned RUNS times
with new ids, its times moved so that the runs finished between
``--oldest-days`` and ``--newest-days`` ago, oldest first. PostgreSQL gets
``COPY``, the others multi-row ``INSERT``s; then ``VACUUM ANALYZE`` (the
steady state autovacuum keeps a large table in). Loaded in a process of its
own, so that the process that measures stays as small as a worker.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BATCH = 2000  # rows per INSERT where there is no COPY
#: The clones' search attributes: ``customer`` C-0 … C-999 (a thousand runs
#: each in a million), ``tier`` one of four (a quarter of the runs each).
CUSTOMERS = 1000
TIERS = ("bronze", "silver", "gold", "platinum")


def _template() -> tuple[list[Any], Any]:
    """The events (trigger first) and the row of one finished ``bench-w10`` run."""
    from kumiflow_django import append_event
    from kumiflow_django.models import Event, WorkflowRun
    from kumiflow_django.testing import run_until_idle, virtual_clock

    with virtual_clock(datetime(2000, 1, 1, tzinfo=UTC)) as clock:
        trigger = append_event("history-template", "bench.w10", {"n": 1})
        clock.advance(minutes=2)
        run_until_idle(dispatch=False, cron=False)
    run = WorkflowRun.objects.get(workflow="bench-w10", trigger_position=trigger.position)
    assert run.status == "completed"
    events = [trigger, *Event.objects.filter(stream_id=str(run.id)).order_by("version")]
    assert len(events) == 5, [e.type for e in events]
    return events, run


def _fields(model: Any) -> list[Any]:
    """The columns a clone gives values to (not the database's own counters)."""
    return [
        f
        for f in model._meta.concrete_fields
        if not (f.primary_key and f.get_internal_type() in ("AutoField", "BigAutoField"))
    ]


def _rows(n: int, newest: datetime, oldest: datetime) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """("event" | "run" | "attribute", values in field order) of ``n`` cloned runs."""
    from kumiflow_django.models import Event, RunAttribute, WorkflowRun

    events, run = _template()
    run_id = str(run.id)
    base = events[0].created_at
    event_fields, run_fields = _fields(Event), _fields(WorkflowRun)
    attribute_fields = _fields(RunAttribute)
    texts = {}
    for e in events:
        for name in ("payload", "metadata"):
            texts[(e.version, e.stream_id, name)] = json.dumps(getattr(e, name))
    json_fields = {f.attname for f in run_fields if f.get_internal_type() == "JSONField"}
    run_values = {f.attname: getattr(run, f.attname) for f in run_fields}
    for name in json_fields:
        value = run_values[name]
        run_values[name] = None if value is None else json.dumps(value)
    span = (newest - oldest) / max(n, 1)
    for i in range(n):
        start = oldest + span * i
        new_run, new_sid = str(uuid.uuid4()), f"history-{i}"
        customer, tier = f"C-{i % CUSTOMERS}", TIERS[i % len(TIERS)]

        def clone(
            text: str, new_run: str = new_run, customer: str = customer, tier: str = tier
        ) -> str:
            return (
                text.replace(run_id, new_run)
                .replace("C-TEMPLATE", customer)
                .replace("T-TEMPLATE", tier)
            )

        for e in events:
            when = start + (e.created_at - base)
            values = {
                "event_id": str(uuid.uuid4()),
                "tenant_id": e.tenant_id,
                "stream_type": e.stream_type,
                "stream_id": new_run if e.stream_id == run_id else new_sid,
                "version": e.version,
                "type": e.type,
                "schema_version": e.schema_version,
                "payload": clone(texts[(e.version, e.stream_id, "payload")]),
                "metadata": clone(texts[(e.version, e.stream_id, "metadata")]),
                "created_at": when,
                "created_by": e.created_by,
            }
            yield "event", tuple(values[f.attname] for f in event_fields)
        row = dict(run_values)
        row["id"] = new_run
        row["started_at"] = start + (run.started_at - base)
        row["updated_at"] = row["finished_at"] = start + (run.finished_at - base)
        row["attributes"] = json.dumps({"customer": customer, "tier": tier})
        yield "run", tuple(row[f.attname] for f in run_fields)
        for name, value in (("customer", customer), ("tier", tier)):
            attribute = {
                "run_id": new_run,
                "tenant_id": run.tenant_id,
                "workflow": run.workflow,
                "name": name,
                "value": value,
                "started_at": row["started_at"],
                "top": run.parent_id is None,
            }
            yield "attribute", tuple(attribute[f.attname] for f in attribute_fields)


def load(n: int, *, newest_days: float = 100, oldest_days: float = 400) -> dict[str, Any]:
    from django.db import connection

    from kumiflow_django.models import Event, RunAttribute, WorkflowRun

    now = datetime.now(UTC)
    rows = _rows(n, now - timedelta(days=newest_days), now - timedelta(days=oldest_days))
    tables = {"event": Event, "run": WorkflowRun, "attribute": RunAttribute}
    began = time.perf_counter()
    counts = {"event": 0, "run": 0, "attribute": 0}
    if connection.vendor == "postgresql":
        _copy(rows, tables, counts)
    else:
        _insert(rows, tables, counts)
    loaded = time.perf_counter() - began
    if connection.vendor == "postgresql":
        import psycopg

        s = connection.settings_dict
        with psycopg.connect(
            host=s["HOST"], port=s["PORT"], user=s["USER"], dbname=s["NAME"], autocommit=True
        ) as conn:
            for model in tables.values():
                conn.execute(f"VACUUM ANALYZE {model._meta.db_table}")
    return {
        "runs": counts["run"],
        "events": counts["event"],
        "attributes": counts["attribute"],
        "load_s": round(loaded, 1),
        "rows_per_s": round(sum(counts.values()) / loaded),
        "vacuum_s": round(time.perf_counter() - began - loaded, 1),
    }


def _copy(
    rows: Iterator[tuple[str, tuple[Any, ...]]], tables: dict[str, Any], counts: dict[str, int]
) -> None:
    """COPY streams at once, one per table, each on its own connection."""
    import psycopg
    from django.db import connection

    s = connection.settings_dict
    params = {"host": s["HOST"], "port": s["PORT"], "user": s["USER"], "dbname": s["NAME"]}
    with (
        psycopg.connect(**params) as events_conn,
        psycopg.connect(**params) as runs_conn,
        psycopg.connect(**params) as attributes_conn,
        events_conn.cursor().copy(_copy_sql(tables["event"])) as events,
        runs_conn.cursor().copy(_copy_sql(tables["run"])) as runs,
        attributes_conn.cursor().copy(_copy_sql(tables["attribute"])) as attributes,
    ):
        streams = {"event": events, "run": runs, "attribute": attributes}
        for kind, values in rows:
            streams[kind].write_row(
                tuple(v.isoformat() if isinstance(v, datetime) else v for v in values)
            )
            counts[kind] += 1


def _copy_sql(model: Any) -> str:
    columns = ", ".join(f'"{f.column}"' for f in _fields(model))
    return f'COPY "{model._meta.db_table}" ({columns}) FROM STDIN'


def _insert(
    rows: Iterator[tuple[str, tuple[Any, ...]]], tables: dict[str, Any], counts: dict[str, int]
) -> None:
    from django.db import connection, transaction

    fields = {kind: _fields(model) for kind, model in tables.items()}
    pending: dict[str, list[tuple[Any, ...]]] = {kind: [] for kind in tables}

    def flush(kind: str) -> None:
        batch, pending[kind] = pending[kind], []
        if not batch:
            return
        model = tables[kind]
        columns = ", ".join(connection.ops.quote_name(f.column) for f in fields[kind])
        marks = ", ".join(["%s"] * len(fields[kind]))
        prepared = [
            tuple(
                f.get_db_prep_save(_python(f, v), connection)
                for f, v in zip(fields[kind], row, strict=True)
            )
            for row in batch
        ]
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({columns}) VALUES ({marks})",
                prepared,
            )
        counts[kind] += len(batch)

    for kind, values in rows:
        pending[kind].append(values)
        if len(pending[kind]) >= BATCH:
            flush(kind)
    for kind in tables:
        flush(kind)


def _python(field: Any, value: Any) -> Any:
    """The Python value the field's own adaptation expects."""
    kind = field.get_internal_type()
    if value is None:
        return None
    if kind == "JSONField":
        return json.loads(value)
    if kind == "UUIDField":
        return uuid.UUID(value)
    return value


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url")
    parser.add_argument("runs", type=int)
    parser.add_argument("--newest-days", type=float, default=100)
    parser.add_argument("--oldest-days", type=float, default=400)
    args = parser.parse_args()
    from bench.common import setup_django

    setup_django(args.url)
    result = load(args.runs, newest_days=args.newest_days, oldest_days=args.oldest_days)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
