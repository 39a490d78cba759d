"""Finding runs by what an operator has at hand, each through an index.

- the first characters of a run id (at least :data:`MIN_ID_PREFIX` hex
  digits, as the lists show them): a range of the primary key (on MariaDB,
  whose UUID type orders by the last group first, a scan);
- the start of an idempotency key: ``LIKE 'k%'`` where the database uses an
  index for it (PostgreSQL with the pattern operators, MariaDB/MySQL), a
  range of the key index on SQLite (whose ``LIKE`` ignores case and no index);
- a value a waiting run matches on (an order id it waits for the payment
  of): the correlation key each single-field match of the registry would
  have for it, exactly.
"""

from __future__ import annotations

import string
import uuid
from typing import Any

from django.db.models import Q

from kumiflow_django.definition import matching
from kumiflow_django.definition.registry import registry
from kumiflow_django.projections.waits import RunWait
from kumiflow_django.store import db, limits

#: A run id prefix needs this many hex digits: fewer would match a sixteenth
#: of all runs per digit left out.
MIN_ID_PREFIX = 4
_HEX = frozenset(string.hexdigits)


def id_range(term: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The run ids starting with ``term`` (hex digits, dashes ignored) as a range."""
    digits = term.replace("-", "").lower()
    if not MIN_ID_PREFIX <= len(digits) <= 32 or not set(digits) <= _HEX:
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def key_prefix(field: str, term: str) -> Q | None:
    """Rows whose ``field`` starts with ``term``, by an index."""
    if not term or len(term) > limits.IDEMPOTENCY_KEY:
        return None
    condition = Q(**{f"{field}__startswith": term})
    if db.prefix_needs_range() and ord(term[-1]) < 0x10FFFF:
        upper = term[:-1] + chr(ord(term[-1]) + 1)
        condition &= Q(**{f"{field}__gte": term, f"{field}__lt": upper})
    return condition


def correlation_keys(term: str) -> list[str]:
    """The correlation keys of a single-field match on ``term`` (as text and as
    a number), for every single-field match the registered workflows wait on."""
    candidates: list[Any] = [term]
    if term.lstrip("-").isdigit() and len(term) < 19:
        candidates.append(int(term))
    keys = []
    for workflow in registry.all_versions():
        for path_sets in workflow.awaited.values():
            for paths in path_sets:
                if len(paths) == 1:
                    keys += [matching.correlation_key({paths[0]: v}) for v in candidates]
    return sorted(set(keys))


def id_prefix(term: str) -> Q | None:
    """Runs whose id starts with ``term``: a range of the primary key, except on
    MariaDB's own UUID type, which orders a UUID by its last group first (so a
    prefix is no range there: the condition is a ``LIKE``, which scans)."""
    bounds = id_range(term)
    if bounds is None:
        return None
    if not db.uuid_prefix_is_a_range():
        digits = term.replace("-", "").lower()
        dashed = "-".join(
            part
            for part in (digits[:8], digits[8:12], digits[12:16], digits[16:20], digits[20:])
            if part
        )
        return Q(id__startswith=dashed)
    return Q(id__gte=bounds[0], id__lte=bounds[1])


def runs_matching(term: str) -> Q | None:
    """The condition a search term puts on the runs; None: it can match none."""
    condition: Q | None = None
    parts = [key_prefix("idempotency_key", term), id_prefix(term)]
    keys = correlation_keys(term)
    if keys:
        # A run that waits for an event matching on the term (its own wait or a branch's).
        parts.append(Q(pk__in=RunWait.objects.filter(correlation_key__in=keys).values("run_id")))
    for part in parts:
        if part is not None:
            condition = part if condition is None else condition | part
    return condition
