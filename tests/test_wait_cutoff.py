"""A wait for an event and its cut-off: the one rule every wake-up check asks.

The races that make gaps (an event inserted before a run's cut-off and
committed after it) need two connections and run on the server databases
(tests/test_wait_for_event_race.py); the rule itself is data and is tested
here, on every database.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kumiflow_django import append_event
from kumiflow_django.definition.matching import Cutoff, Wait
from kumiflow_django.store import names as ev


def event(position: int, type_: str = "paid", tenant: str = "t", **payload: Any) -> Any:
    return SimpleNamespace(
        position=position, type=type_, tenant_id=tenant, payload=payload, metadata={}
    )


class TestCutoff:
    def test_a_wait_with_gaps_of_its_own_keeps_them(self):
        assert Cutoff.of(10, [7, 9], since_position=5, since_gaps=[3]) == Cutoff(10, (7, 9))

    def test_no_gaps_of_its_own_at_the_runs_start_takes_the_starts_gaps(self):
        assert Cutoff.of(5, None, since_position=5, since_gaps=[3, 4]) == Cutoff(5, (3, 4))

    def test_no_gaps_of_its_own_past_the_start_has_none(self):
        assert Cutoff.of(8, None, since_position=5, since_gaps=[3, 4]) == Cutoff(8, ())

    def test_an_empty_list_of_its_own_is_not_the_starts(self):
        assert Cutoff.of(5, [], since_position=5, since_gaps=[3]) == Cutoff(5, ())

    def test_no_start_gaps_at_all(self):
        assert Cutoff.of(5, None, since_position=5, since_gaps=None) == Cutoff(5, ())

    @pytest.mark.parametrize(
        ("position", "admitted"),
        [(11, True), (10, False), (9, True), (8, False), (7, True), (1, False)],
    )
    def test_admits_what_is_after_it_or_at_a_gap(self, position, admitted):
        assert Cutoff(10, (7, 9)).admits(position) is admitted


class TestWait:
    wait = Wait("paid", "t", {"payload.order": 7}, Cutoff(10, (4,)))

    def test_accepts_the_type_the_tenant_the_match_after_the_cutoff(self):
        assert self.wait.accepts(event(11, order=7))

    def test_accepts_an_event_at_a_gap_below_the_cutoff(self):
        assert self.wait.accepts(event(4, order=7))

    @pytest.mark.parametrize(
        "other",
        [
            pytest.param(event(11, "refunded", order=7), id="another-type"),
            pytest.param(event(11, tenant="u", order=7), id="another-tenant"),
            pytest.param(event(10, order=7), id="at-the-cutoff"),
            pytest.param(event(5, order=7), id="below-it-not-a-gap"),
            pytest.param(event(11, order=8), id="another-value"),
            pytest.param(event(11, order="7"), id="a-string-for-a-number"),
            pytest.param(event(11), id="the-path-missing"),
        ],
    )
    def test_refuses_what_it_does_not_await(self, other):
        assert not self.wait.accepts(other)

    def test_a_number_matches_its_float(self):
        assert self.wait.accepts(event(11, order=7.0))

    def test_an_awaited_alias_takes_each_of_its_types_not_itself(self):
        task = Wait(ev.TASK_SETTLED, "t", {}, Cutoff(0))
        for outcome in ev.TASK_OUTCOME_TYPES:
            assert task.accepts(event(1, outcome))
        assert not task.accepts(event(1, "task.started"))


@pytest.mark.django_db
class TestLookback:
    def test_finds_the_first_matching_event_after_the_cutoff(self):
        before = append_event("order-1", "paid", {"order": 1}, tenant="t")
        wrong = append_event("order-2", "paid", {"order": 2}, tenant="t")
        other_tenant = append_event("u-order-1", "paid", {"order": 1}, tenant="u")
        first = append_event("order-1", "paid", {"order": 1}, tenant="t", expected_version=1)
        append_event("order-1", "paid", {"order": 1}, tenant="t", expected_version=2)
        wait = Wait("paid", "t", {"payload.order": 1}, Cutoff(before.position))
        assert wrong.position and other_tenant.position
        found = wait.lookback()
        assert found is not None and found.position == first.position

    def test_finds_an_event_at_a_gap_below_the_cutoff(self):
        at_gap = append_event("order-1", "paid", {"order": 1}, tenant="t")
        later = append_event("order-2", "noise", {}, tenant="t")
        with_gap = Wait(
            "paid", "t", {"payload.order": 1}, Cutoff(later.position, (at_gap.position,))
        )
        without = Wait("paid", "t", {"payload.order": 1}, Cutoff(later.position))
        found = with_gap.lookback()
        assert found is not None and found.position == at_gap.position
        assert without.lookback() is None

    def test_accepts_what_lookback_finds(self):
        start = append_event("s", "noise", {}, tenant="t")
        append_event("order-9", "paid", {"order": 9, "extra": True}, tenant="t")
        wait = Wait("paid", "t", {"payload.order": 9}, Cutoff(start.position))
        found = wait.lookback()
        assert found is not None and wait.accepts(found)


class _Undone(Exception):
    pass


@pytest.mark.server_db
@pytest.mark.django_db
def test_the_gaps_below_a_position_are_the_positions_not_visible_in_its_window(monkeypatch):
    """Appends rolled back leave holes in the positions (a sequence is not
    rolled back): ``gaps_below`` names exactly the positions of its window that
    are not visible, in order, whether the hole is at the window's floor, in the
    middle, runs over several positions, or is above every visible event."""
    from django.db import transaction

    from kumiflow_django.definition import matching
    from kumiflow_django.store.models import Event

    def undone(*streams: str) -> None:
        with pytest.raises(_Undone), transaction.atomic():
            for stream in streams:
                append_event(stream, "noise", {}, tenant="t")
            raise _Undone

    undone("h-0")
    append_event("a", "noise", {}, tenant="t")
    undone("h-1", "h-2", "h-3")
    append_event("b", "noise", {}, tenant="t")
    append_event("c", "noise", {}, tenant="t")
    undone("h-4")
    append_event("d", "noise", {}, tenant="t")
    undone("h-5", "h-6")  # above every visible event

    visible = set(Event.objects.values_list("position", flat=True))
    # A server's sequence is not reset between tests: this test's own positions
    # start wherever the earlier tests left it.
    first, top = min(visible) - 1, max(visible) + 2
    assert len(set(range(first, top + 1)) - visible) >= 7
    for window in (3, 1000):
        monkeypatch.setattr(matching, "GAP_WINDOW", window)
        for position in (0, 1, *range(max(0, first - 3), top + 3)):
            low = max(0, position - window)
            expected = [p for p in range(low + 1, position + 1) if p not in visible]
            assert matching.gaps_below(position) == expected[-matching.MAX_GAPS :], position
