"""Log records as JSON lines, with the run's fields (no dependency).

Every logger of kumiflow-django adds ``run_id``, ``workflow``, ``tenant``
and ``step_path`` to its records (``kumiflow_django.store.telemetry``);
:class:`JsonFormatter` writes them, with whatever else a record carries in
``extra``, as one JSON object per line. Use it in ``LOGGING`` (see
docs/logging.md). :class:`RunFieldsFilter` adds the same fields to the
records of your own loggers, logged while a run's step executes.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from kumiflow_django.store.telemetry import RunFieldsFilter

__all__ = ["JsonFormatter", "RunFieldsFilter"]

#: Attributes every LogRecord has: not copied as extra fields.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
#: The run's fields: always written (null outside a run).
FIELDS = ("run_id", "workflow", "tenant", "step_path")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (ISO 8601, UTC), ``level``,
    ``logger``, ``message``, the run's fields, any other ``extra`` field,
    and ``exc_info``/``stack_info`` as text when there are."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            entry[name] = getattr(record, name, None)
        for name, value in vars(record).items():
            if name not in _STANDARD and name not in entry:
                entry[name] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)
