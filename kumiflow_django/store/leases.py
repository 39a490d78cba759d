"""When a lease is free: the one rule of every claim, sweep, late result and admin page.

A worker that takes a row for a while writes a lease on it: who holds it
(an owner) and until when. The lease is held up to and including that
instant, and has *run out* after it: the row is free for another worker (a
run is taken over as a recovery, a task's attempt is given up and its late
result ignored). A row no one leased is free.

Each rule is written here twice, side by side: as a query for the rows in
the database (``*_q``) and as a test of a row in hand. The resume loop's
claim, the task loop's sweep, the recording of a task's result and the
admin's "stalled" figures all ask this module; a test checks that both
forms agree. (A dispatch has no lease columns: its attempt's lease is its
next attempt time, and it is due again when that comes.)
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Expression, Q

#: The columns of a lease on a run's row (a task's row has ``worker``).
OWNER = "lease_owner"
UNTIL = "lease_until"


def ran_out(until: datetime | None, now: datetime) -> bool:
    """Whether a lease held until ``until`` has run out at ``now`` (no lease
    has not: see :func:`free`)."""
    return until is not None and until < now


def ran_out_q(now: datetime | Expression, *, until: str = UNTIL) -> Q:
    """The rows whose lease has run out at ``now`` (as :func:`ran_out`)."""
    return Q(**{f"{until}__lt": now})


def free(owner: str, until: datetime | None, now: datetime) -> bool:
    """Whether a worker may take a row: no one leased it, or the lease ran out."""
    return not owner or ran_out(until, now)


def free_q(now: datetime | Expression, *, owner: str = OWNER, until: str = UNTIL) -> Q:
    """The rows a worker may take at ``now`` (as :func:`free`)."""
    return Q(**{owner: ""}) | ran_out_q(now, until=until)


def stalled(owner: str, until: datetime | None, now: datetime) -> bool:
    """Whether a row was leased and its lease ran out: its worker died or hangs."""
    return bool(owner) and ran_out(until, now)


def stalled_q(now: datetime, *, owner: str = OWNER, until: str = UNTIL) -> Q:
    """The rows leased whose lease ran out at ``now`` (as :func:`stalled`)."""
    return ~Q(**{owner: ""}) & ran_out_q(now, until=until)
