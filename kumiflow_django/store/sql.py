"""Plain SQL for the engine's hot paths: reading a stream's head, inserting
events and run rows, updating the columns of a run that a segment changed,
and the wake-up by an awaited event (its look-up, the lock of the runs it
found, their paused scopes' read).

The ORM's SQL compiler costs more than the database on these paths (a
segment writes a few small rows); the statements here are built once per
shape and fed with each field's own ``get_db_prep_save``, so values are
adapted exactly as the ORM would adapt them.

The loops' polls (the resume loop's due probe, its lease, its next wake
time; the dispatch, cron and task loops' due and next-due reads) keep their
ORM queries, compiled once per shape instead (:func:`values`): the query is
the one its manager methods build (``due()``, ``free_q()``), its changing
values :class:`Slot` objects. On PostgreSQL the resume loop's lease wraps
its compiled locking read in one UPDATE (:func:`update_selected`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any, NamedTuple, cast

from django.core.exceptions import EmptyResultSet
from django.db import NotSupportedError, connections, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models import Expression, Field, Model, QuerySet
from django.db.models.fields import AutoFieldMixin
from django.db.models.lookups import Exact, In
from django.db.transaction import TransactionManagementError

from kumiflow_django.store import db


@functools.cache
def _insert_sql(
    model: type[Model], using: str, rows: int, returning: bool
) -> tuple[str, tuple[Field[Any, Any], ...], tuple[type | None, ...]]:
    connection = connections[using]
    qn = connection.ops.quote_name
    meta = model._meta
    pk = meta.pk
    assert pk is not None
    fields = tuple(f for f in meta.concrete_fields if not (returning and f is pk))
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    columns = ", ".join(qn(_column(f)) for f in fields)
    # Table and column names come from the model, quoted; values are parameters.
    sql = f"INSERT INTO {qn(meta.db_table)} ({columns}) VALUES {', '.join([row] * rows)}"  # noqa: S608
    if returning:
        sql += f" RETURNING {qn(_column(pk))}"
    return sql, fields, tuple(_passes_through(f, connection) for f in fields)


#: Field classes whose ``pre_save`` and ``get_db_prep_save`` give back a value
#: of this exact type (or None) unchanged, on every backend.
_PLAIN: dict[type[Field[Any, Any]], type] = {
    models.CharField: str,
    models.TextField: str,
    models.BooleanField: bool,
}
#: Integer fields give back an ``int`` unchanged where the backend does not
#: adapt integers (PostgreSQL wraps them in typed integers: the full path there).
_INTEGERS = (
    models.IntegerField,
    models.SmallIntegerField,
    models.BigIntegerField,
    models.PositiveIntegerField,
    models.PositiveSmallIntegerField,
    models.PositiveBigIntegerField,
)


def _passes_through(field: Field[Any, Any], connection: BaseDatabaseWrapper) -> type | None:
    """The type of value ``field`` stores as it is (the same as its
    ``get_db_prep_save`` would give), or None: every value takes the field's
    own path. Exact classes only: a subclass may adapt values its own way."""
    kind = type(field)
    if kind in _PLAIN:
        return _PLAIN[kind]
    adapts_integers = type(connection.ops).adapt_integerfield_value
    if kind in _INTEGERS and adapts_integers is BaseDatabaseOperations.adapt_integerfield_value:
        return int
    return None


def _column(field: Field[Any, Any]) -> str:
    assert field.column is not None
    return field.column


def insert(model: type[Model], objs: Sequence[Model], *, using: str, return_pk: bool) -> None:
    """INSERT the objects in one statement; with ``return_pk`` fill in their
    (auto) primary keys from ``RETURNING``. The caller checks that the backend
    can return rows from a bulk insert."""
    if not objs:
        return
    connection = connections[using]
    sql, fields, plain = _insert_sql(model, using, len(objs), return_pk)
    params: list[Any] = []
    for obj in objs:
        params += _save_params(obj, fields, plain, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        keys = [pk for (pk,) in cursor.fetchall()] if return_pk else None
    _stored(model, objs, keys, using)


def _stored(
    model: type[Model], objs: Sequence[Model], keys: Sequence[Any] | None, using: str
) -> None:
    """Mark ``objs`` as saved in ``using``, as the ORM's save leaves them;
    with ``keys``, their primary keys, one for each in order."""
    pk_attname = model._meta.pk.attname
    if keys is not None:
        assert len(keys) == len(objs), "an INSERT inserts all its rows or none"
    for i, obj in enumerate(objs):
        if keys is not None:
            setattr(obj, pk_attname, keys[i])
        obj._state.adding = False
        obj._state.db = using


@functools.cache
def _last_row_sql(
    model: type[Model], using: str, columns: tuple[str, ...], where: tuple[str, ...], lock: bool
) -> str:
    connection = connections[using]
    qn = connection.ops.quote_name
    meta = model._meta
    order = qn(_column(meta.get_field(columns[0])))  # type: ignore[arg-type]
    selected = ", ".join(qn(_column(meta.get_field(c))) for c in columns)  # type: ignore[arg-type]
    conditions = " AND ".join(f"{qn(_column(meta.get_field(c)))} = %s" for c in where)  # type: ignore[arg-type]
    # Table and column names come from the model, quoted; values are parameters.
    sql = f"SELECT {selected} FROM {qn(meta.db_table)} WHERE {conditions} ORDER BY {order} DESC"  # noqa: S608
    sql += " LIMIT 1"
    if lock and connection.features.has_select_for_update:
        sql += " FOR UPDATE"
    return sql


def last_row(
    model: type[Model],
    columns: tuple[str, ...],
    where: dict[str, str],
    *,
    using: str,
    lock: bool = False,
) -> tuple[Any, ...] | None:
    """``columns`` of the row matching ``where`` (text columns, by attname) with
    the highest first column, or None; with ``lock``, locked where the database
    can. What ``filter(**where).order_by("-first").values_list(*columns).first()``
    reads, without building the query each time (every append reads its
    stream's head so). The columns come back as the driver reads them: only
    for columns the driver returns as their Python value (integers, text)."""
    sql = _last_row_sql(model, using, columns, tuple(where), lock)
    with connections[using].cursor() as cursor:
        cursor.execute(sql, list(where.values()))
        row = cursor.fetchone()
    return None if row is None else tuple(row)


def snapshot(obj: Model) -> dict[str, Any]:
    """The loaded column values of ``obj`` (a field deferred with ``only()``
    is left out, not loaded: a change of a partial row writes what it loaded)."""
    values = obj.__dict__
    return {f.attname: values[f.attname] for f in obj._meta.concrete_fields if f.attname in values}


def update_changed(obj: Model, before: dict[str, Any], *, where: dict[str, Any], using: str) -> int:
    """UPDATE the columns of ``obj`` that differ from ``before``, for the row
    matching ``where`` (attnames); return the number of rows changed."""
    sql, params = _update_statement(obj, before, where, connections[using])
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def _update_statement(
    obj: Model, before: dict[str, Any], where: dict[str, Any], connection: BaseDatabaseWrapper
) -> tuple[str, list[Any]]:
    qn = connection.ops.quote_name
    meta = obj._meta
    values = obj.__dict__
    changed = [
        f
        for f in meta.concrete_fields
        if not f.primary_key
        and f.attname in before
        and values.get(f.attname, before[f.attname]) != before[f.attname]
    ]
    if not changed:
        changed = [meta.get_field("version")]  # type: ignore[list-item]
    keys: list[Any] = [meta.get_field(k) for k in where]
    sets = ", ".join(f"{qn(_column(f))} = %s" for f in changed)
    conditions = " AND ".join(f"{qn(_column(f))} = %s" for f in keys)
    params = [f.get_db_prep_save(getattr(obj, f.attname), connection) for f in changed]
    params += [
        f.get_db_prep_value(v, connection, prepared=False)
        for f, v in zip(keys, where.values(), strict=True)
    ]
    # Table and column names come from the model, quoted; values are parameters.
    return f"UPDATE {qn(meta.db_table)} SET {sets} WHERE {conditions}", params  # noqa: S608


class Update(NamedTuple):
    """One row's UPDATE in :func:`write_together`: the columns of ``obj`` that
    differ from ``before``, for the row matching ``where`` (attnames)."""

    obj: Model
    before: dict[str, Any]
    where: dict[str, Any]


def write_together(
    inserts: Sequence[tuple[type[Model], Sequence[Model], bool]],
    updates: Sequence[Update],
    *,
    using: str,
) -> list[int]:
    """The INSERTs (model, objects, whether to fill in their auto primary
    keys, as :func:`insert`) and the UPDATEs (as :func:`update_changed`) of
    one write; the number of rows each UPDATE changed, in their order.

    Where the database runs data-modifying statements inside ``WITH``
    (:func:`~kumiflow_django.store.db.writes_in_one_statement`), they are one
    statement, one round trip: a segment's events, its run's new or changed
    row. What it writes, and the errors it raises (a version clash of the
    log, a constraint of a row), are those of the statements one by one: a
    failing part fails the statement, and the enclosing transaction or
    savepoint rolls back all of it, as it would the statements before it.

    The order in which PostgreSQL runs the parts is its own (its docs call
    it unpredictable), and nothing here depends on it: no part reads
    another's rows, the rows updated are already locked by the writer (the
    lock order took them before the segment), and a new row's contender
    collides on a unique index whichever part runs first.

    Only where the database has them, and only a write that fits in one
    statement's parameters (:func:`fits_one_statement`): elsewhere the caller
    sends them one by one."""
    assert db.writes_in_one_statement(using), "data-modifying WITH is PostgreSQL's"
    inserts = [(model, objs, pk) for model, objs, pk in inserts if objs]
    for model, _objs, return_pk in inserts:
        # Keys are matched to rows by their order: only a sequence's keys,
        # drawn row by row in the order of VALUES, can be.
        assert not return_pk or isinstance(cast(Any, model._meta.pk), AutoFieldMixin), model
    if not inserts and not updates:
        return []
    connection = connections[using]
    qn = connection.ops.quote_name
    parts: list[str] = []
    params: list[Any] = []
    selected: list[str] = []
    for model, objs, return_pk in inserts:
        statement, fields, plain = _insert_sql(model, using, len(objs), return_pk)
        name = f"w{len(parts)}"
        parts.append(f"{name} AS ({statement})")
        for obj in objs:
            params += _save_params(obj, fields, plain, connection)
        if return_pk:
            pk = qn(_column(model._meta.pk))
            # Each row takes its key from the sequence in the order of VALUES.
            selected.append(f"ARRAY(SELECT {pk} FROM {name} ORDER BY {pk})")  # noqa: S608
    for update in updates:
        statement, values = _update_statement(update.obj, update.before, update.where, connection)
        name = f"w{len(parts)}"
        parts.append(f"{name} AS ({statement} RETURNING 1)")
        params += values
        selected.append(f"(SELECT COUNT(*) FROM {name})")  # noqa: S608
    sql = f"WITH {', '.join(parts)} SELECT {', '.join(selected) or 'NULL'}"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    assert row is not None
    # The keys of each INSERT that returns them, then each UPDATE's count.
    selected_values = iter(row)
    for model, objs, return_pk in inserts:
        _stored(model, objs, next(selected_values) if return_pk else None, using)
    return [int(next(selected_values)) for _update in updates]


#: The parameters one statement may bind: the protocol's 16-bit count
#: (PostgreSQL with server-side binding; client-side binding has no bound).
MAX_PARAMS = 65_535


def fits_one_statement(
    inserts: Sequence[tuple[type[Model], Sequence[Model], bool]], updates: Sequence[Update]
) -> bool:
    """Whether :func:`write_together` may bind all of a write's values in one
    statement: a fan-out of a thousand children whose statements fit one by
    one must not fail because they were fused. Counted from above: every
    column of every row, every column of every changed row and its key."""
    count = sum(len(model._meta.concrete_fields) * len(objs) for model, objs, _pk in inserts)
    count += sum(len(u.obj._meta.concrete_fields) + len(u.where) for u in updates)
    return count <= MAX_PARAMS


def insert_if_absent(model: type[Model], values: dict[str, Any], *, using: str) -> bool:
    """Insert one row unless it would break a unique constraint; True if it was
    inserted (then this transaction holds the new row's lock). One statement:
    ``ON CONFLICT DO NOTHING`` (PostgreSQL, SQLite) or ``INSERT IGNORE`` (MariaDB)."""
    connection = connections[using]
    quote = connection.ops.quote_name
    fields = [model._meta.get_field(name) for name in values]
    concrete = [f for f in fields if isinstance(f, Field)]
    assert len(concrete) == len(fields), "only concrete fields"
    columns = ", ".join(quote(_column(f)) for f in concrete)
    params = [f.get_db_prep_save(values[f.name], connection) for f in concrete]
    marks = ", ".join(["%s"] * len(fields))
    table = quote(model._meta.db_table)
    if not db.supports_on_conflict(using):
        sql = f"INSERT IGNORE INTO {table} ({columns}) VALUES ({marks})"  # noqa: S608 - quoted names
    else:
        sql = f"INSERT INTO {table} ({columns}) VALUES ({marks}) ON CONFLICT DO NOTHING"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return bool(cursor.rowcount == 1)


@functools.cache
def _select_sql(
    model: type[Model], using: str, keys: tuple[str, ...]
) -> tuple[str, tuple[Any, ...]]:
    qn = connections[using].ops.quote_name
    meta = model._meta
    fields = tuple(meta.get_field(key) for key in keys)
    columns = ", ".join(qn(_column(f)) for f in meta.concrete_fields)
    conditions = " AND ".join(f"{qn(_column(f))} = %s" for f in fields)  # type: ignore[arg-type]
    # Table and column names come from the model, quoted; values are parameters.
    return f"SELECT {columns} FROM {qn(meta.db_table)} WHERE {conditions}", fields  # noqa: S608


def select_one[M: Model](model: type[M], **where: Any) -> M | None:
    """The row whose columns (attnames) have these values, one unique key, or None.

    ``model.objects.filter(**where).first()`` without the ORM's compiler, which
    costs several times the database on a request that reads one row by its key
    (the API's token and run lookups): the statement is built once per shape,
    its values adapted by each field's ``get_db_prep_value``, the row converted
    by the ORM's own converters (:func:`fetch`), and the read routed as the ORM
    routes it (the model's manager, then ``db_for_read``: a replica-readable
    request may read a replica).
    """
    using = model._default_manager.get_queryset().db
    sql, fields = _select_sql(model, using, tuple(where))
    params = [prep(f, value, using) for f, value in zip(fields, where.values(), strict=True)]
    concrete = tuple(model._meta.concrete_fields)
    for row in fetch(sql, params, concrete, using=using):
        return model.from_db(using, [f.attname for f in concrete], row)
    return None


# -- Reads converted as the ORM converts them ------------------------------

#: A database column's converter: ``(value, expression, connection)``, as
#: the ORM's compiler calls it.
Converter = Callable[[Any, Any, BaseDatabaseWrapper], Any]


@functools.cache
def _converters(
    fields: tuple[Field[Any, Any], ...], using: str
) -> tuple[tuple[int, Any, tuple[Converter, ...]], ...]:
    """For each column of ``fields`` that needs one: its index, its column
    expression and the converters the ORM's compiler applies to it (the
    backend's, then the field's: ``SQLCompiler.get_converters``)."""
    connection = connections[using]
    found = []
    for i, field in enumerate(fields):
        assert field.model is not None
        col = field.get_col(field.model._meta.db_table)
        converters = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
        if converters:
            found.append((i, col, tuple(converters)))
    return tuple(found)


def fetch(
    sql: str, params: Sequence[Any], fields: tuple[Field[Any, Any], ...], *, using: str
) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` (a statement built once per shape by its caller,
    its names quoted, its values parameters), each column converted as the
    ORM converts a column of its field (``fields``, one per selected column,
    in order): what ``values_list()`` of those fields gives."""
    connection = connections[using]
    converting = _converters(fields, using)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not converting:
        return [tuple(row) for row in rows]
    converted = []
    for row in rows:
        values = list(row)
        for i, col, converters in converting:
            value = values[i]
            for converter in converters:
                value = converter(value, col, connection)
            values[i] = value
        converted.append(tuple(values))
    return converted


def prep(field: Field[Any, Any], value: Any, using: str) -> Any:
    """``value`` as a parameter compared with ``field``'s column (what a
    ``filter()`` on the field sends)."""
    return field.get_db_prep_value(value, connections[using], prepared=False)


def column(field: Field[Any, Any], using: str, *, table: bool = False) -> str:
    """The quoted column of ``field`` (with ``table``: qualified by its table)."""
    qn = connections[using].ops.quote_name
    name = qn(_column(field))
    if table:
        assert field.model is not None
        return f"{qn(field.model._meta.db_table)}.{name}"
    return name


#: How MariaDB compares a text expression byte for byte.
_BYTES = "BINARY {}"


def exactly(expression: str, using: str) -> str:
    """``expression`` as compared byte for byte: where ``=`` and ``IN`` on
    text follow a collation that ignores case, accents and trailing spaces
    (MariaDB's), ``BINARY expression``; else itself. For a filter that must
    not let "ACME" stand for "acme" (a tenant), beside the plain comparison
    that finds the candidates by index."""
    return expression if db.text_equality_is_exact(using) else _BYTES.format(expression)


def exact_in(field: str, values: Collection[str], using: str | None = None) -> models.Q:
    """``Q(<field>__in=values)`` that means it byte for byte on every database
    (see :func:`exactly`): the filter of a tenant's rows, or of an attribute's
    value, which must not take "ACME" for "acme" where the collation says
    they are equal."""
    wanted = list(values)
    # One value: an equality, as a filter() of it would be (its index plan).
    q = models.Q(**{field: wanted[0]} if len(wanted) == 1 else {f"{field}__in": wanted})
    if db.text_equality_is_exact(using or db.alias()):
        return q
    as_bytes = models.Func(
        models.F(field), template=_BYTES.format("%(expressions)s"), output_field=models.CharField()
    )
    same = Exact(as_bytes, wanted[0]) if len(wanted) == 1 else In(as_bytes, wanted)
    return q & models.Q(same)


def table(model: type[Model], using: str) -> str:
    """The quoted table of ``model``."""
    return str(connections[using].ops.quote_name(model._meta.db_table))


# -- Rows by primary key, locked -------------------------------------------


def _lock_sql(using: str, lock: bool, skip_locked: bool) -> str:
    """The locking clause where the database has one (what ``db.for_update``
    asks of the ORM): ``FOR UPDATE``, with ``SKIP LOCKED`` when asked and able."""
    connection = connections[using]
    features = connection.features
    if not (lock and features.has_select_for_update):
        return ""
    skip = skip_locked and features.has_select_for_update_skip_locked
    return " " + str(connection.ops.for_update_sql(skip_locked=skip))


@functools.lru_cache(maxsize=256)  # one shape per number of keys
def _by_pk_sql(
    model: type[Model], using: str, count: int, whole: bool, lock: bool, skip_locked: bool
) -> tuple[str, tuple[Field[Any, Any], ...]]:
    meta = model._meta
    pk = meta.pk
    assert pk is not None
    fields: tuple[Field[Any, Any], ...] = tuple(meta.concrete_fields) if whole else (pk,)
    selected = ", ".join(column(f, using, table=True) for f in fields)
    key = column(pk, using, table=True)
    marks = ", ".join(["%s"] * count)
    # Table and column names come from the model, quoted; values are parameters.
    sql = f"SELECT {selected} FROM {table(model, using)} WHERE {key} IN ({marks})"  # noqa: S608
    return f"{sql} ORDER BY {key} ASC{_lock_sql(using, lock, skip_locked)}", fields


def routed(model: type[Model], *, lock: bool = False) -> str:
    """The database the ORM reads ``model`` from (locking: writes it to).
    A lock outside a transaction is refused, as the ORM refuses it: in
    autocommit it would hold nothing."""
    manager = model._default_manager
    if lock:
        using = manager.get_queryset().db
        connection = connections[using]
        if connection.features.has_select_for_update:
            using = str(manager.select_for_update().db)
            if connections[using].get_autocommit():
                raise TransactionManagementError(
                    "select_for_update cannot be used outside of a transaction."
                )
        return str(using)
    return str(manager.get_queryset().db)


def by_pk[M: Model](
    model: type[M], pks: Collection[Any], *, lock: bool = False, skip_locked: bool = False
) -> list[M]:
    """The rows of ``model`` whose primary keys are ``pks``, by key; with
    ``lock``, locked (``skip_locked``: but those another transaction holds)
    where the database can. What ``db.for_update(filter(pk__in=pks)
    .order_by("pk"))`` reads, without building the query each time."""
    if not pks:
        return []
    using = routed(model, lock=lock)
    sql, fields = _by_pk_sql(model, using, len(pks), True, lock, skip_locked)
    pk = model._meta.pk
    assert pk is not None
    rows = fetch(sql, [prep(pk, key, using) for key in pks], fields, using=using)
    names = [f.attname for f in fields]
    return [model.from_db(using, names, row) for row in rows]


def lock_by_pk(model: type[Model], pks: Collection[Any], *, skip_locked: bool = False) -> list[Any]:
    """Lock the rows of ``model`` whose primary keys are ``pks``, in key
    order, reading only their keys (returned: those locked)."""
    if not pks:
        return []
    using = routed(model, lock=True)
    sql, fields = _by_pk_sql(model, using, len(pks), False, True, skip_locked)
    rows = fetch(sql, [prep(fields[0], key, using) for key in pks], fields, using=using)
    return [row[0] for row in rows]


# -- Deleting rows -----------------------------------------------------------


@functools.cache
def _delete_sql(
    model: type[Model], using: str, where: tuple[str, ...]
) -> tuple[str, tuple[Any, ...]]:
    meta = model._meta
    fields = tuple(meta.get_field(name) for name in where)
    conditions = " AND ".join(f"{column(f, using)} = %s" for f in fields)  # type: ignore[arg-type]
    # Table and column names come from the model, quoted; values are parameters.
    return f"DELETE FROM {table(model, using)} WHERE {conditions}", fields  # noqa: S608


def delete(model: type[Model], *, using: str, **where: Any) -> int:
    """DELETE the rows whose columns (attnames) have these values, in one
    statement; return how many. For a model no row refers to and no signal
    watches (a projection's rows): the ORM's ``filter().delete()`` collects
    first, and builds its query each time."""
    sql, fields = _delete_sql(model, using, tuple(where))
    params = [prep(f, value, using) for f, value in zip(fields, where.values(), strict=True)]
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


# -- Rows numbered after the head of their group ----------------------------


@functools.cache
def _insert_after_head_sql(
    model: type[Model],
    using: str,
    rows: int,
    counter: str,
    group: tuple[str, ...],
    refused: tuple[str, int],
    expected: bool,
) -> tuple[str, tuple[Field[Any, Any], ...], tuple[type | None, ...]]:
    connection = connections[using]
    qn = connection.ops.quote_name
    meta = model._meta
    pk = meta.pk
    assert pk is not None
    numbered = meta.get_field(counter)
    fields = tuple(f for f in meta.concrete_fields if f is not pk and f is not numbered)
    table_name = qn(meta.db_table)
    counter_column = qn(_column(numbered))  # type: ignore[arg-type]
    in_group = " AND ".join(f"{qn(_column(meta.get_field(c)))} = %s" for c in group)  # type: ignore[arg-type]
    refused_column = qn(_column(meta.get_field(refused[0])))  # type: ignore[arg-type]
    refused_values = ", ".join(["%s"] * refused[1])
    # The head's row (by the unique key of the group and its counter) must not
    # be of a refused kind; with ``expected``, the head must be where it is said.
    guard = (
        f"NOT EXISTS (SELECT 1 FROM {table_name} WHERE {in_group}"  # noqa: S608 - quoted names
        f" AND {counter_column} = m.v AND {refused_column} IN ({refused_values}))"
    )
    if expected:
        guard += " AND m.v = %s"
    head = (
        f"SELECT m.v AS v FROM (SELECT COALESCE(MAX({counter_column}), 0) AS v"  # noqa: S608
        f" FROM {table_name} WHERE {in_group}) m WHERE {guard}"
    )
    columns = ", ".join([*(qn(_column(f)) for f in fields), counter_column])
    values = ", ".join(["%s"] * len(fields))
    selects = " UNION ALL ".join(
        f"SELECT {values}, h.v + {i} FROM h"  # noqa: S608 - marks and an integer
        for i in range(1, rows + 1)
    )
    sql = (
        f"WITH h AS ({head}) INSERT INTO {table_name} ({columns}) {selects}"  # noqa: S608
        f" RETURNING {qn(_column(pk))}, {counter_column}"
    )
    return sql, fields, tuple(_passes_through(f, connection) for f in fields)


def insert_after_head(
    model: type[Model],
    objs: Sequence[Model],
    *,
    using: str,
    counter: str,
    group: dict[str, str],
    refused: tuple[str, Collection[str]],
    expected: int | None = None,
) -> bool:
    """INSERT the objects numbered after the head of their group in one
    statement: their ``counter`` is the group's highest (0 for an empty group)
    plus 1, 2, ... in order, read by the INSERT itself (no read before it).
    Nothing is inserted when the head's row has one of the ``refused`` values
    (``(column, values)``), or, with ``expected``, when the head is not there;
    then False. Fills in the primary keys and counters (``RETURNING``). Only
    where ``db.reads_head_in_insert``: the head is the statement's snapshot."""
    if not objs:
        return True
    connection = connections[using]
    kinds = tuple(refused[1])
    sql, fields, plain = _insert_after_head_sql(
        model,
        using,
        len(objs),
        counter,
        tuple(group),
        (refused[0], len(kinds)),
        expected is not None,
    )
    params: list[Any] = [*group.values(), *group.values(), *kinds]
    if expected is not None:
        params.append(expected)
    for obj in objs:
        params += _save_params(obj, fields, plain, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        returned = sorted(cursor.fetchall(), key=lambda row: row[1])
    if not returned:
        return False
    assert len(returned) == len(objs), "an INSERT ... SELECT inserts all its rows or none"
    counter_attname = model._meta.get_field(counter).attname  # type: ignore[union-attr]
    for obj, (_pk, number) in zip(objs, returned, strict=True):
        setattr(obj, counter_attname, number)
    _stored(model, objs, [pk for pk, _number in returned], using)
    return True


def _save_params(
    obj: Model,
    fields: tuple[Field[Any, Any], ...],
    plain: tuple[type | None, ...],
    connection: BaseDatabaseWrapper,
) -> list[Any]:
    """The INSERT parameters of ``obj``'s ``fields``, as each field's own
    ``get_db_prep_save`` gives them (a plain value passed as it is)."""
    params: list[Any] = []
    values = obj.__dict__
    for f, kind in zip(fields, plain, strict=True):
        if kind is not None:
            value = values[f.attname] if f.attname in values else getattr(obj, f.attname)
            if value is None or type(value) is kind:
                params.append(value)
                continue
        params.append(f.get_db_prep_save(f.pre_save(obj, True), connection))
    return params


def rows(sql: str, params: Sequence[Any], *, using: str) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` (built by its caller, its names quoted, its values
    parameters) as the driver gives them, for a caller that converts each
    column once into what it needs (the API's run list)."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return [tuple(row) for row in cursor.fetchall()]


# -- ORM queries compiled once per shape --------------------------------------


class Slot(Expression):
    """A value of a query compiled once per shape (:func:`values`): stands in
    the query where the value would, and is sent as ``Value(value,
    output_field)`` would send it (the field's ``get_db_prep_value``), the
    value given at each execution. Slots are equal by name and field."""

    def __init__(self, name: str, output_field: Field[Any, Any]) -> None:
        super().__init__(output_field=output_field)
        self.name = name

    def as_sql(self, compiler: Any, connection: BaseDatabaseWrapper) -> tuple[str, Any]:
        return "%s", (self,)

    def bind(self, value: Any, connection: BaseDatabaseWrapper) -> Any:
        if value is None:  # "= NULL" matches nothing, where the ORM would say IS NULL
            raise ValueError(f"slot {self.name!r}: a compiled query compares no None")
        return self.output_field.get_db_prep_value(value, connection, prepared=False)


#: The moment a compiled poll compares due times and leases with (``now=``).
NOW = Slot("now", models.DateTimeField())


class _Compiled(NamedTuple):
    sql: str
    #: The statement's parameters: constants (adapted) and slots (bound per execution).
    params: tuple[Any, ...]
    #: The field of each selected column, in order (for the ORM's converters).
    fields: tuple[Field[Any, Any], ...]
    #: Whether it locks its rows (then only inside a transaction, as the ORM says).
    locks: bool
    #: The model whose rows it reads.
    model: type[Model] | None


#: Compiled queries by (key, alias). Bounded: a key that changes for good
#: (the definitions a worker serves, after a deploy) leaves entries behind.
_COMPILED: dict[tuple[Hashable, str], _Compiled] = {}
_COMPILED_MAX = 512


#: A query that can match no row (an empty ``IN`` list): the ORM sends nothing.
_NOTHING = _Compiled("", (), (), False, None)


def _compile(qs: QuerySet[Any, Any], using: str) -> _Compiled:
    compiler = qs.query.get_compiler(using=using)
    try:
        sql, params = compiler.as_sql()
    except EmptyResultSet:
        return _NOTHING
    fields = []
    for expression, _, _ in compiler.select:
        target = getattr(expression, "target", None)
        if not isinstance(target, Field):
            raise TypeError(f"a compiled query selects plain columns only, not {expression!r}")
        fields.append(target)
    return _Compiled(sql, tuple(params), tuple(fields), bool(qs.query.select_for_update), qs.model)


def _compiled(key: Hashable, build: Callable[[], QuerySet[Any, Any]], using: str) -> _Compiled:
    compiled = _COMPILED.get((key, using))
    if compiled is None:
        qs = build().using(using)
        if qs.query.select_for_update and connections[using].get_autocommit():
            # The ORM compiles a locking read only inside a transaction: one that
            # sends nothing (the read is sent later, where it may run).
            with transaction.atomic(using=using, savepoint=False):
                compiled = _compile(qs, using)
        else:
            compiled = _compile(qs, using)  # the ORM's own checks, once
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        _COMPILED[(key, using)] = compiled
    return compiled


def _bound(
    compiled: _Compiled, slots: dict[str, Any], connection: BaseDatabaseWrapper
) -> list[Any]:
    return [
        p.bind(slots[p.name], connection) if isinstance(p, Slot) else p for p in compiled.params
    ]


def values(
    key: Hashable, build: Callable[[], QuerySet[Any, Any]], *, using: str, **slots: Any
) -> list[tuple[Any, ...]]:
    """The rows of the ``values_list()`` query ``build()`` gives on ``using``,
    its values given as :class:`Slot` objects and sent from ``slots`` (by
    name); each column converted as the ORM converts it.

    The query is built and compiled by the ORM once per ``key`` and database:
    the same query's SQL as the ORM's, without the ORM's cost of building it
    at each execution (it costs more than the database on the loops' polls).
    ``key`` names everything but the slots that shapes the query: a query
    built from other constants under the same key would send the first one's.
    """
    connection = connections[using]
    compiled = _compiled(key, build, using)
    if compiled.locks and connection.get_autocommit():
        raise TransactionManagementError(
            "select_for_update cannot be used outside of a transaction."
        )
    if compiled is _NOTHING:
        return []
    return fetch(compiled.sql, _bound(compiled, slots, connection), compiled.fields, using=using)


@functools.lru_cache(maxsize=256)
def _update_selected_sql(
    model: type[Model],
    select: str,
    fields: tuple[Field[Any, Any], ...],
    using: str,
    sets: tuple[str, ...],
) -> str:
    connection = connections[using]
    qn = connection.ops.quote_name
    meta = model._meta
    pk = meta.pk
    assert pk is not None and pk in fields, "the read selects the primary key"
    assert all(f.model is model for f in fields), "the read selects the updated table's columns"
    names = [f"c{i}" for i in range(len(fields))]
    assignments = ", ".join(f"{qn(_column(meta.get_field(name)))} = %s" for name in sets)  # type: ignore[arg-type]
    target = qn(meta.db_table)
    returned = ", ".join(f"picked.{name}" for name in names)
    key = names[fields.index(pk)]
    # Names come from the model, quoted; the read is the ORM's; values are parameters.
    return (
        f"UPDATE {target} SET {assignments} FROM ({select}) AS picked ({', '.join(names)})"  # noqa: S608
        f" WHERE {target}.{qn(_column(pk))} = picked.{key} RETURNING {returned}"
    )


def update_selected(
    key: Hashable,
    build: Callable[[], QuerySet[Any, Any]],
    *,
    using: str,
    sets: dict[str, Any],
    **slots: Any,
) -> list[tuple[Any, ...]]:
    """Set ``sets`` (field names and values) on the rows the locking read
    ``build()`` gives (a ``values_list()`` with the primary key, compiled once
    per ``key`` as :func:`values` compiles it), in one statement; return the
    rows as the read saw them, before the update, converted as :func:`values`
    converts them. Only where ``db.claims_in_one_statement``: outside a
    transaction the statement is one of its own."""
    if not db.claims_in_one_statement(using):
        raise NotSupportedError("an UPDATE returning the rows as they were: PostgreSQL only")
    connection = connections[using]
    compiled = _compiled(key, build, using)
    if compiled is _NOTHING:
        return []
    model = compiled.model
    assert model is not None
    fields = [model._meta.get_field(name) for name in sets]
    sql = _update_selected_sql(model, compiled.sql, compiled.fields, using, tuple(sets))
    params = [f.get_db_prep_save(v, connection) for f, v in zip(fields, sets.values(), strict=True)]  # type: ignore[union-attr]
    params += _bound(compiled, slots, connection)
    return fetch(sql, params, compiled.fields, using=using)
