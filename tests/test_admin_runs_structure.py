"""The structure of a run on its admin page: task attempts, parallel branches side
by side, child runs with their parent and root, compensations in the timeline,
and the run list that hides child runs unless asked.

Each test defines a workflow, starts it, moves the virtual clock, and reads
the run's page as a superuser would.
"""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from kumiflow_django import append_event, current_task, define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus, StepTask, WorkflowRun
from kumiflow_django.testing import run_until_idle
from testproject.shop.tasks import double

pytestmark = pytest.mark.django_db


# Task functions: importable, so the task pool can run them.
def hostile() -> None:
    """Fails with an error that is markup: the page must show it as text."""
    raise RuntimeError("<script>alert('owned')</script>")


def flaky(n: int) -> int:
    """Fails its first attempt, then returns ``n``."""
    if current_task().attempt == 1:
        raise ConnectionError("the service is down")
    return n


def page_of(client, run) -> str:
    response = client.get(reverse("admin:kumiflow_workflowrun_change", args=[run.pk]))
    assert response.status_code == 200
    return str(response.content.decode())


def lineage_of(page: str) -> str:
    """The line at the head of a child run's page that names its parent and root."""
    match = re.search(r'id="kf-lineage">(.*?)</p>', page, re.S)
    assert match is not None
    return match.group(1)


def section(page: str, element_id: str) -> str:
    """The HTML of the panel ``element_id`` (to its closing fieldset or section)."""
    match = re.search(rf'id="{element_id}".*?</(fieldset|section)>', page, re.S)
    assert match is not None, element_id
    return match.group(0)


def lanes(page: str) -> dict[str, str]:
    """Each branch drawn in the branches panel: its name and its text."""
    panel = section(page, "kf-branches")
    parts = re.split(r'<div class="kf-lane [^"]*" data-branch="([^"]+)">', panel)[1:]
    found = zip(parts[::2], parts[1::2], strict=True)
    return {
        name: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text.split("</fieldset>")[0])).strip()
        for name, text in found
    }


def timeline_lines(page: str) -> list[str]:
    """What each line of the page's timeline says, as text."""
    found = re.findall(r'<span class="kf-what">(.*?)</span>', page, re.S)
    return [re.sub(r"\s+", " ", text).strip() for text in found]


def reload(run):
    return WorkflowRun.objects.get(pk=run.pk)


# -- task attempts -------------------------------------------------------------------


def test_every_attempt_of_a_task_is_listed_with_its_error_and_traceback(
    admin_client, registry, clock
):
    define_workflow(
        "flaky-sync",
        steps=[s.task("synced", flaky, args=[7], retry=3), s.return_(lambda c: c.steps["synced"])],
    )
    run = start_workflow("flaky-sync")
    run_until_idle()
    clock.advance(seconds=30)
    run_until_idle()
    assert reload(run).status == RunStatus.COMPLETED

    page = page_of(admin_client, run)
    panel = section(page, "kf-attempts")
    rows = re.findall(r'<tr class="kf-attempt kf-attempt-(\w+)"', panel)
    assert rows == ["retried", "completed"], "attempt 1 failed and was retried; 2 succeeded"
    assert "1 of 3" in panel and "2 of 3" in panel
    assert "ConnectionError: the service is down" in panel
    assert '<details class="kf-traceback"><summary>Traceback</summary>' in panel
    assert "Traceback (most recent call last)" in panel
    # Beside the task step in the picture: the task's state.
    picture = section(page, "kf-picture") if 'id="kf-picture"' in page else page
    assert re.search(r"task: <a [^>]*>.*completed.*</a> <small>attempt 2 of 3", picture, re.S)


def test_a_hostile_error_message_is_shown_as_text(admin_client, registry, clock):
    define_workflow("hostile", steps=[s.task("x", hostile, retry=1)])
    run = start_workflow("hostile")
    run_until_idle()
    assert reload(run).status == RunStatus.FAILED

    page = page_of(admin_client, run)
    assert "<script>alert(" not in page
    panel = section(page, "kf-attempts")
    assert "RuntimeError: &lt;script&gt;alert(&#x27;owned&#x27;)&lt;/script&gt;" in panel
    assert re.findall(r'kf-attempt kf-attempt-(\w+)"', panel) == ["failed"]


# -- branches ----------------------------------------------------------------------------


def checkout():
    define_workflow(
        "checkout",
        steps=[
            s.parallel(
                "done",
                {
                    "stock": [s.wait("PT1H"), s.compute("reserved", lambda ctx: "reserved")],
                    "payment": [
                        s.wait_for_event("payment.authorised", match={"payload.order": 7}),
                        s.compute("charge", lambda ctx: 1250),
                    ],
                    "carrier": [
                        s.compute("quote", lambda ctx: 9),
                        s.wait_for_event("carrier.booked", match={"payload.order": 7}),
                    ],
                },
            ),
            s.return_(lambda ctx: ctx.steps["done"]),
        ],
    )


def test_the_branches_of_a_parallel_step_are_drawn_side_by_side_with_where_each_is(
    admin_client, registry, clock
):
    checkout()
    run = start_workflow("checkout")
    append_event("payment-7", "payment.authorised", {"order": 7})
    run_until_idle()

    page = page_of(admin_client, run)
    assert 'id="kf-branches"' in page and page.index("kf-branches") < page.index("kf-picture")
    assert lanes(page) == {
        "stock": "stock waiting at 0.stock.0 (wait PT1H) waits for a timer until "
        + lanes(page)["stock"].split("until ", 1)[1],
        "payment": "payment done",
        "carrier": "carrier waiting at 0.carrier.1 (wait for carrier.booked) "
        "waits for event carrier.booked",
    }

    clock.advance(hours=1)
    run_until_idle()
    append_event("carrier-7", "carrier.booked", {"order": 7})
    run_until_idle()
    assert reload(run).status == RunStatus.COMPLETED
    assert lanes(page_of(admin_client, run)) == {
        "stock": "stock done",
        "payment": "payment done",
        "carrier": "carrier done",
    }


def test_a_failed_branch_is_marked_failed_where_it_failed(admin_client, registry, clock):
    define_workflow(
        "broken",
        steps=[
            s.parallel(
                "p",
                {
                    "waits": [s.wait("P1D")],
                    "fails": [s.wait("PT1M"), s.compute("x", lambda ctx: 1 / 0)],
                },
            )
        ],
    )
    run = start_workflow("broken")
    clock.advance(minutes=1)
    run_until_idle()
    assert reload(run).status == RunStatus.FAILED
    found = lanes(page_of(admin_client, run))
    assert found["fails"].startswith("fails failed at 0.fails.1")
    assert found["waits"].startswith("waits cancelled at 0.waits.0"), "the failure cancelled it"


def test_a_parallel_for_each_over_a_thousand_items_draws_a_bounded_page(
    admin_client, registry, clock
):
    define_workflow(
        "fan-out",
        steps=[
            s.for_each(
                lambda ctx: list(range(1000)),
                "n",
                [s.wait("PT1H"), s.compute("twice", lambda ctx: ctx.scope["n"] * 2)],
                parallel=True,
                max_concurrency=40,
                name="all",
            )
        ],
    )
    run = start_workflow("fan-out")
    page = page_of(admin_client, run)
    panel = section(page, "kf-branches")
    assert "1000 items: 40 in flight, 0 done, 960 not started" in panel
    assert len(lanes(page)) == 24
    assert lanes(page)["item 0"].startswith("item 0 waiting at 0.do.0 (wait PT1H)")
    assert "and 16 more in flight" in panel

    clock.advance(hours=1)
    run_until_idle()
    panel = section(page_of(admin_client, run), "kf-branches")
    assert "1000 items: 40 in flight, 40 done, 920 not started" in panel


# -- child runs ---------------------------------------------------------------------------


@pytest.fixture
def family(registry):
    define_workflow("leaf", steps=[s.wait("PT1H"), s.return_("leaf done")])
    define_workflow("middle", steps=[s.child("leaf", "leaf"), s.return_("middle done")])
    define_workflow("top", steps=[s.child("middle", "middle"), s.return_("top done")])
    top = start_workflow("top")
    middle = WorkflowRun.objects.get(parent_id=top.pk)
    leaf = WorkflowRun.objects.get(parent_id=middle.pk)
    return top, middle, leaf


def test_a_run_lists_its_children_and_a_child_links_to_its_parent_and_root(admin_client, family):
    top, middle, leaf = family
    page = page_of(admin_client, top)
    panel = section(page, "kf-children")
    middle_url = reverse("admin:kumiflow_workflowrun_change", args=[middle.pk])
    assert f'<a href="{middle_url}">{str(middle.pk)[:8]}</a>' in panel
    assert "<td>middle</td>" in panel and "waiting" in panel
    assert f"?parent={top.pk}" in panel, "all of them in the run list"
    assert f"waits at step 0 for child run {str(middle.pk)[:8]}" in timeline_lines(page)
    # The child step in the picture says which run it started.
    assert re.search(rf'child run <a href="{middle_url}">', page)

    top_url = reverse("admin:kumiflow_workflowrun_change", args=[top.pk])
    middle_page = page_of(admin_client, middle)
    lineage = lineage_of(middle_page)
    assert f'A child run of <a href="{top_url}">' in lineage and "root" not in lineage

    leaf_page = page_of(admin_client, leaf)
    lineage = lineage_of(leaf_page)
    assert f'A child run of <a href="{middle_url}">' in lineage
    assert f'root <a href="{top_url}">' in lineage and "depth 2" in lineage
    assert 'id="kf-lineage"' not in page, "a root run has no parent"


def changelist_ids(client, **params) -> set[str]:
    page = client.get(reverse("admin:kumiflow_workflowrun_changelist"), params).content.decode()
    return set(re.findall(r"/workflowrun/([0-9a-f-]{36})/change/", page))


def test_the_run_list_hides_child_runs_unless_asked_or_filtered_by_parent(admin_client, family):
    top, middle, leaf = family
    ids = {str(r.pk) for r in family}
    assert changelist_ids(admin_client) == {str(top.pk)}
    assert changelist_ids(admin_client, children="yes") == ids
    assert changelist_ids(admin_client, parent=str(top.pk)) == {str(middle.pk)}
    assert changelist_ids(admin_client, parent=str(middle.pk)) == {str(leaf.pk)}
    assert changelist_ids(admin_client, parent="not-a-run-id") == set()
    assert changelist_ids(admin_client, q=str(leaf.pk)[:8]) == {str(leaf.pk)}, "search finds it"
    page = admin_client.get(reverse("admin:kumiflow_workflowrun_changelist")).content.decode()
    assert "show child runs" in page and "no (default)" in page


# -- compensations ---------------------------------------------------------------------


def test_compensations_read_as_words_in_the_timeline(admin_client, registry, clock):
    def undo(what):
        return s.append_event("undo-log", "undo.ran", payload={"undo": what})

    define_workflow(
        "trip",
        steps=[
            s.compute("flight", lambda ctx: "FL1", compensate=[undo("flight")]),
            s.wait("PT1M"),
            s.compute("hotel", lambda ctx: "HO1", compensate=[s.wait("PT5M"), undo("hotel")]),
            s.wait("PT1M"),
            s.compute("payment", lambda ctx: 1 / 0),
        ],
    )
    run = start_workflow("trip")
    for minutes in (1, 1, 5):
        clock.advance(minutes=minutes)
        run_until_idle()
    assert reload(run).compensation == "compensated"

    page = page_of(admin_client, run)
    said = timeline_lines(page)
    started = next(t for t in said if "compensating step 2" in t and t.startswith("the run"))
    assert started.startswith("the run failed (step_failed: ZeroDivisionError")
    assert "compensating step 2 (compute hotel), then step 0 (compute flight)" in started
    assert any(
        t.startswith("compensating step 2 (compute hotel): waits at step 2.compensate.0")
        for t in said
    )
    assert said[-1].startswith(
        "compensated step 2 (compute hotel), step 0 (compute flight); then failed (step_failed)"
    )
    assert "· compensated" in page


def test_a_failed_compensation_says_which_step_it_undid(admin_client, registry, clock):
    def missing(ctx):
        raise KeyError("no such booking")

    define_workflow(
        "fragile",
        steps=[
            s.compute("a", lambda ctx: 1, compensate=[s.wait("PT1M")]),
            s.compute("b", lambda ctx: 2, compensate=[s.compute("oops", missing)]),
            s.wait("PT1M"),
            s.compute("c", lambda ctx: 1 / 0),
        ],
    )
    run = start_workflow("fragile")
    clock.advance(minutes=1)
    run_until_idle()
    assert reload(run).compensation == "compensation_failed"
    page = page_of(admin_client, run)
    said = timeline_lines(page)
    assert said[-1].startswith("the compensation of step 1 (compute b) failed: KeyError")


# -- bounded queries --------------------------------------------------------------------


def busy_run(registry, items: int):
    define_workflow(f"leaf-{items}", steps=[s.wait("P1D")])
    define_workflow(
        f"busy-{items}",
        steps=[
            s.for_each(
                lambda ctx: list(range(items)),
                "n",
                [
                    s.task("doubled", double, args=lambda ctx: [ctx.scope["n"]]),
                    s.child("kid", f"leaf-{items}", wait=False),
                    s.wait("P1D"),
                ],
                parallel=True,
                name="all",
            )
        ],
    )
    run = start_workflow(f"busy-{items}")
    run_until_idle()
    assert StepTask.objects.filter(run_id=run.pk).count() == items
    assert WorkflowRun.objects.filter(parent_id=run.pk).count() == items
    return run


def queries_for(client, run) -> int:
    with CaptureQueriesContext(connection) as captured:
        page_of(client, run)
    return len(captured)


def test_the_page_of_a_run_with_many_attempts_and_children_reads_a_bounded_number_of_rows(
    admin_client, registry, clock, django_assert_max_num_queries
):
    small = busy_run(registry, 2)
    large = busy_run(registry, 60)
    budget = queries_for(admin_client, small)
    with django_assert_max_num_queries(budget):
        page = page_of(admin_client, large)
    assert len(re.findall(r'<tr class="kf-child">', page)) == 50
    assert len(re.findall(r'<tr class="kf-attempt ', page)) == 60


def test_a_task_its_branch_lost_reads_cancelled_before_any_attempt(admin_client, registry, clock):
    define_workflow(
        "race",
        steps=[
            s.parallel(
                "first",
                {
                    "slow": [s.task("doubled", double, args=[4])],
                    "fast": [s.compute("now", lambda ctx: "fast")],
                },
                join="any",
            ),
        ],
    )
    run = start_workflow("race")
    page = page_of(admin_client, run)
    panel = section(page, "kf-attempts")
    assert re.findall(r'kf-attempt kf-attempt-(\w+)"', panel) == ["cancelled"]
    assert "none ran" in panel
    assert lanes(page) == {"slow": "slow cancelled", "fast": "fast done"}, "the join was met"
