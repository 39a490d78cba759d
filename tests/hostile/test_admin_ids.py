"""Malformed ids in admin URLs and filters (issue 11, item 13).

Every admin URL of the app, with ids and filter values an attacker or a
careless link would carry: not a UUID, a huge string, a NUL character (raw
and as the text ``%00``), a negative or huge position, unicode. None is a
server error: a run's page and its operations answer 404, Django's own pages
redirect with "does not exist", and a filter the field cannot hold shows an
empty list. Each filter also has a row with a real value, so the empty lists
are not empty by accident.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

import pytest

from kumiflow_django import append_event, define_workflow, on_cron, on_event
from kumiflow_django import steps as s
from kumiflow_django.models import Dispatch, Event, WorkflowRun
from kumiflow_django.workers.cron import CronLoop

pytestmark = pytest.mark.django_db

A = "/admin/kumiflow/"
HUGE = "x" * 5000
NUL = "a\x00b"
UNKNOWN_UUID = "12345678-1234-1234-1234-1234567890ab"
BAD_IDS = {
    "not a uuid": "not-a-uuid",
    "huge": HUGE,
    "NUL": NUL,
    "%00 as text": "%00",
    "negative": "-1",
    "huge integer": "99999999999999999999999",
    "past bigint": "9223372036854775808",
    "unicode": "ü😀",
}


@pytest.fixture
def data(registry):
    """A run with an outbox row, its events, and a cron schedule."""
    define_workflow(
        "order",
        trigger=on_event("order.placed"),
        steps=[s.mail_send(to="shop@example.com", subject="order", body="placed")],
    )
    define_workflow("nightly", trigger=on_cron("0 3 * * *"), steps=[])
    append_event("o-1", "order.placed", {"order": 1})
    CronLoop().run_once()
    run = WorkflowRun.objects.get()
    return {
        "run8": str(run.id)[:8],  # before {run}: "{run8}" does not contain "{run}"
        "run": str(run.id),
        "dispatch": str(Dispatch.objects.get().id),
        "position": str(Event.objects.earliest("position").position),
    }


def url(path: str, **params: str) -> str:
    """A list URL; ``{run}`` in a value stands for the run's id."""
    return A + path + ("?" + urlencode(params, safe="{}", quote_via=quote) if params else "")


def page(model: str, object_id: str, view: str = "change/") -> str:
    """An object's URL; ``{run}`` or ``{position}`` stand for the real ones."""
    return f"{A}{model}/{quote(object_id, safe='{}')}/{view}"


# (id, method, URL, expected status, rows on the list or None)
CASES: list[tuple[str, str, str, int, int | None]] = []


def case(name: str, method: str, address: str, status: int, rows: int | None = None) -> None:
    CASES.append((name, method, address, status, rows))


for label, bad in BAD_IDS.items():
    # pages of one object: the run's page is ours (404); Django's redirect with a message
    case(f"run page, {label}", "get", page("workflowrun", bad), 404)
    case(f"run history, {label}", "get", page("workflowrun", bad, "history/"), 302)
    for operation in ("cancel", "retry", "retry-current", "wake"):
        address = page("workflowrun", bad, f"operate/{operation}/")
        case(f"run {operation}, {label}", "post", address, 404)
        case(f"run {operation} confirmation, {label}", "get", address, 404)
    case(f"run send-event, {label}", "get", page("workflowrun", bad, "send-event/"), 404)
    case(f"run send-event POST, {label}", "post", page("workflowrun", bad, "send-event/"), 404)
    for operation in ("redeliver", "cancel"):
        address = page("dispatch", bad, f"operate/{operation}/")
        case(f"dispatch {operation}, {label}", "get", address, 404)
        case(f"dispatch {operation} POST, {label}", "post", address, 404)
    for operation in ("fire", "enable", "disable"):
        address = page("cronschedule", bad, f"operate/{operation}/")
        case(f"schedule {operation}, {label}", "get", address, 404)
        case(f"schedule {operation} POST, {label}", "post", address, 404)
    case(f"event page, {label}", "get", page("event", bad), 302)
    case(f"dispatch page, {label}", "get", page("dispatch", bad), 302)
    case(f"schedule page, {label}", "get", page("cronschedule", bad), 302)
    case(f"schedule history, {label}", "get", page("cronschedule", bad, "history/"), 302)
    # filters: an empty list
    for model, param in [
        ("workflowrun", "tenant"),
        ("workflowrun", "workflow"),
        ("workflowrun", "status"),
        ("workflowrun", "status__exact"),
        ("dispatch", "run"),
        ("dispatch", "status__exact"),
        ("dispatch", "kind__exact"),
        ("event", "stream"),
        ("event", "type"),
        ("event", "tenant"),
    ]:
        case(f"{model} ?{param}=, {label}", "get", url(f"{model}/", **{param: bad}), 200, 0)

    # Django's search box refuses a NUL itself, with a message: the list is not searched
    everything = 1 if bad == NUL else 0
    case(f"run search, {label}", "get", url("workflowrun/", q=bad), 200, everything)

case("run page, unknown uuid", "get", page("workflowrun", UNKNOWN_UUID), 404)
case("run cancel, unknown uuid", "post", page("workflowrun", UNKNOWN_UUID, "operate/cancel/"), 404)
case("run, an unknown operation", "post", page("workflowrun", "{run}", "operate/bogus/"), 403)
case("run, an unknown operation by GET", "get", page("workflowrun", "{run}", "operate/bogus/"), 403)
case("dispatch, an unknown operation", "get", page("dispatch", "{dispatch}", "operate/x/"), 403)
case("run page", "get", page("workflowrun", "{run}"), 200)
case("run cancel confirmation", "get", page("workflowrun", "{run}", "operate/cancel/"), 200)
case("run cancel, the real run", "post", page("workflowrun", "{run}", "operate/cancel/"), 302)
case("run send-event, the real run", "get", page("workflowrun", "{run}", "send-event/"), 200)
case("dispatch redeliver, real", "get", page("dispatch", "{dispatch}", "operate/redeliver/"), 200)
case("schedule fire, the real one", "get", page("cronschedule", "nightly", "operate/fire/"), 200)
case("overview", "get", A + "workflowrun/overview/", 200)
case("run search, a run id prefix", "get", url("workflowrun/", q="{run8}"), 200, 1)
case("dispatch ?run=, blank", "get", url("dispatch/", run=" "), 200, 1)
case("event page, a real position", "get", page("event", "{position}"), 200)
case("event search, huge position", "get", url("event/", q="99999999999999999999999"), 200, 0)
case("schedule ?enabled__exact=, NUL", "get", url("cronschedule/", enabled__exact=NUL), 302)
# the same filters with real values match: the empty lists above are not an accident
for model, param, value, rows in [
    ("workflowrun", "tenant", "default", 1),
    ("workflowrun", "workflow", "order", 1),
    ("workflowrun", "status__exact", "completed", 1),
    ("workflowrun", "q", "{run}", 1),
    ("dispatch", "run", "{run}", 1),
    ("dispatch", "run", UNKNOWN_UUID, 0),
    ("dispatch", "kind__exact", "mail", 1),
    ("event", "stream", "{run}", 2),
    ("event", "type", "order.placed", 1),
    ("event", "tenant", "default", 1),  # the engine's events are hidden by default
    ("event", "engine", "shown", 5),
    ("event", "engine", "only", 4),
    ("event", "type", "order.", 1),  # the start of a type
]:
    case(f"{model} ?{param}={value}", "get", url(f"{model}/", **{param: value}), 200, rows)


@pytest.mark.parametrize(
    ("method", "address", "status", "rows"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_malformed_id_or_filter_value_is_not_a_server_error(
    admin_client, data, method, address, status, rows
):
    for name, value in data.items():
        address = address.replace("{" + name + "}", value)
    response = getattr(admin_client, method)(address)
    assert response.status_code == status
    if rows is not None:
        assert response.context["cl"].result_count == rows
        assert len(response.context["cl"].result_list) == rows
