"""Index kinds declared once in a model and built by each database as it can."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.backends.ddl_references import Statement


class SetIndex(models.Index):
    """An index of the rows whose ``fields`` are set: partial (``WHERE f IS
    NOT NULL``) where the database has partial indexes (SQLite, PostgreSQL),
    plain where it has none (MariaDB).

    For a column that is NULL in most rows (a run's parent): once ANALYZE has
    run, SQLite's planner counts the NULLs of a plain index as one huge group
    of equal keys and scans the table instead; the partial index holds only
    the rows a look-up by value can find. A look-up uses it only when its
    condition implies ``f IS NOT NULL`` (``f = x`` and ``f IN (...)`` do).

    The condition is added when the SQL is made, not declared with
    ``condition=``: Django would warn (models.W037, "conditions will be
    ignored") on MariaDB, where a plain index is what is wanted. The migration
    state holds this class too, so a table SQLite rebuilds in a later
    migration gets the partial index back.
    """

    def __init__(
        self, *, fields: Sequence[str], name: str, db_tablespace: str | None = None
    ) -> None:
        super().__init__(fields=fields, name=name, db_tablespace=db_tablespace)

    def create_sql(
        self,
        model: type[models.Model],
        schema_editor: BaseDatabaseSchemaEditor,
        using: str = "",
        **kwargs: Any,
    ) -> Statement:
        if not schema_editor.connection.features.supports_partial_indexes:
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        partial = models.Index(
            fields=self.fields,
            name=self.name,
            db_tablespace=self.db_tablespace,
            condition=models.Q(**{f"{field.lstrip('-')}__isnull": False for field in self.fields}),
        )
        return partial.create_sql(model, schema_editor, using=using, **kwargs)
