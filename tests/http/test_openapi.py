"""The OpenAPI document: valid OpenAPI 3.1, served, and true of every answer the API gives."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client
from django.urls import resolve
from openapi_schema_validator import OAS31Validator, oas31_format_checker
from openapi_spec_validator import validate

from kumiflow_django import define_workflow
from kumiflow_django import steps as s
from kumiflow_django.http import openapi
from tests.http.conftest import API

pytestmark = pytest.mark.django_db


@pytest.fixture
def document(db):
    response = Client().get(f"{API}openapi.json")
    assert response.status_code == 200
    return response.json()


def test_the_served_document_is_valid_openapi_3_1(document):
    validate(document)  # raises on any error
    assert document["openapi"] == "3.1.0"
    assert document["servers"] == [{"url": "/api/kumiflow"}]


def test_every_documented_path_is_mounted_and_every_mounted_path_documented(document):
    from kumiflow_django.http.urls import urlpatterns

    assert len(urlpatterns) == len(document["paths"])
    for path, methods in document["paths"].items():
        url = API.rstrip("/") + path.replace("{run_id}", str(uuid.uuid4()))
        match = resolve(url)
        assert match.url_name == next(e.name for e in openapi.ENDPOINTS if e.path == path)
        assert set(methods) <= {"get", "post"}


class Checker:
    """Validates answers against the document: the status must be documented for
    the operation, and a JSON body must match the documented schema."""

    def __init__(self, document):
        self.document = document
        self.seen: set[tuple[str, str, int]] = set()

    def __call__(self, method: str, path: str, response) -> None:
        operation = self.document["paths"][path][method]
        status = str(response.status_code)
        assert status in operation["responses"], f"{method} {path} answered undocumented {status}"
        content = operation["responses"][status].get("content", {})
        if "application/json" in content:
            schema = {
                **content["application/json"]["schema"],
                "components": self.document["components"],
            }
            OAS31Validator(schema, format_checker=oas31_format_checker).validate(response.json())
        else:
            assert response["Content-Type"].split(";")[0] in content or not content
        self.seen.add((method, path, response.status_code))


def test_every_answer_matches_the_document(document, token_client, registry):
    check = Checker(document)
    define_workflow(
        "approval",
        steps=[
            s.wait_for_event("go", match={"payload.order": lambda ctx: ctx.event.payload["order"]}),
            s.return_({"done": True}),
        ],
    )
    define_workflow("broken", steps=[s.compute("x", lambda ctx: 1 / 0)])
    api = token_client()
    viewer = token_client("view_workflowrun")
    missing = f"{API}runs/{uuid.uuid4()}/"

    check("get", "/openapi.json", Client().get(f"{API}openapi.json"))
    started = api.post_json(f"{API}runs/", {"workflow": "approval", "payload": {"order": 1}})
    check("post", "/runs/", started)
    run = started.json()["id"]
    check("post", "/runs/", api.post_json(f"{API}runs/", {"workflow": 1}))
    check("post", "/runs/", viewer.post_json(f"{API}runs/", {"workflow": "approval"}))
    check("post", "/runs/", Client().post(f"{API}runs/"))
    failed = api.post_json(f"{API}runs/", {"workflow": "broken"})
    check("post", "/runs/", failed)

    check("get", "/runs/", api.get(f"{API}runs/", {"limit": 1}))
    check("get", "/runs/", api.get(f"{API}runs/", {"limit": "x"}))
    check("get", "/runs/{run_id}/", api.get(f"{API}runs/{run}/"))
    check("get", "/runs/{run_id}/", api.get(missing))
    check("post", "/runs/{run_id}/wake/", api.post_json(f"{API}runs/{run}/wake/"))
    check("post", "/runs/{run_id}/wake/", api.post_json(f"{API}runs/{run}/wake/"))  # 409 now
    check("post", "/runs/{run_id}/retry/", api.post_json(f"{API}runs/{failed.json()['id']}/retry/"))
    check("post", "/runs/{run_id}/retry/", api.post_json(f"{API}runs/{run}/retry/", {"x": 1}))
    broken = failed.json()["id"]
    check("get", "/runs/{run_id}/restart/", api.get(f"{API}runs/{broken}/restart/"))
    check("get", "/runs/{run_id}/restart/", api.get(f"{missing}restart/"))
    restart = f"{API}runs/{broken}/restart/"
    check("post", "/runs/{run_id}/restart/", api.post_json(restart, {"from_step": "0"}))
    check("post", "/runs/{run_id}/restart/", api.post_json(restart, {"from_step": "9"}))
    check("post", "/runs/{run_id}/restart/", api.post_json(restart, {}))
    check("post", "/runs/{run_id}/cancel/", api.post_json(f"{API}runs/{run}/cancel/"))
    check("post", "/runs/{run_id}/cancel/", api.post_json(f"{missing}cancel/"))
    check("post", "/events/", api.post_json(f"{API}events/", {"stream_id": "o", "type": "go"}))
    stale = {"stream_id": "o", "type": "go", "expected_version": 0}
    check("post", "/events/", api.post_json(f"{API}events/", stale))
    check("get", "/runs/{run_id}/events/", api.get(f"{API}runs/{run}/events/"))
    check(
        "get",
        "/runs/{run_id}/events/",
        api.get(f"{API}runs/{run}/events/", HTTP_LAST_EVENT_ID="99"),
    )
    check("get", "/runs/{run_id}/events/", api.get(f"{missing}events/"))
    check(
        "get",
        "/runs/{run_id}/events/",
        api.get(f"{API}runs/{run}/events/", HTTP_LAST_EVENT_ID="-1"),
    )

    define_workflow(
        "inbox",
        attributes={"customer": lambda ctx: ctx.event.payload["customer"]},
        steps=[s.approval("manager", fields={"note": str})],
    )
    waiting = api.post_json(f"{API}runs/", {"workflow": "inbox", "payload": {"customer": "C-1"}})
    waiting_id = waiting.json()["id"]
    check("get", "/runs/", api.get(f"{API}runs/", {"attribute": "customer:C-1"}))
    check("get", "/runs/", api.get(f"{API}runs/", {"attribute": "no colon"}))
    check("get", "/approvals/", api.get(f"{API}approvals/"))
    approve = f"{API}runs/{waiting_id}/approve/"
    check("post", "/runs/{run_id}/approve/", api.post_json(approve, {"choice": "maybe"}))
    check("post", "/runs/{run_id}/approve/", viewer.post_json(approve, {"choice": "approve"}))
    decided = api.post_json(approve, {"choice": "approve", "fields": {"note": "ok"}})
    check("post", "/runs/{run_id}/approve/", decided)
    assert decided.json()["status"] == "completed"
    check("post", "/runs/{run_id}/approve/", api.post_json(approve, {"choice": "approve"}))
    other = api.post_json(f"{API}runs/", {"workflow": "approval", "payload": {"order": 2}})
    other_run = other.json()["id"]
    check("post", "/runs/{run_id}/pause/", api.post_json(f"{API}runs/{other_run}/pause/"))
    check("post", "/runs/{run_id}/pause/", api.post_json(f"{API}runs/{other_run}/pause/"))
    check("post", "/runs/{run_id}/resume/", api.post_json(f"{API}runs/{other_run}/resume/"))
    check("post", "/runs/{run_id}/fail/", api.post_json(f"{API}runs/{other_run}/fail/"))
    bulk = {"action": "cancel", "filters": {"workflow": "approval"}}
    check("post", "/bulk/", api.post_json(f"{API}bulk/", {**bulk, "dry_run": True}))
    job = api.post_json(f"{API}bulk/", bulk)
    check("post", "/bulk/", job)
    check("post", "/bulk/", api.post_json(f"{API}bulk/", {"action": "explode"}))
    check("get", "/bulk/{operation_id}/", api.get(f"{API}bulk/{job.json()['id']}/"))
    check("get", "/bulk/{operation_id}/", api.get(f"{API}bulk/{uuid.uuid4()}/"))

    statuses = {status for _, _, status in check.seen}
    assert statuses == {200, 201, 202, 204, 400, 401, 403, 404, 409}
    operations = {(m, p) for m, p, _ in check.seen}
    assert operations == {(e.method, e.path) for e in openapi.ENDPOINTS}, "every operation"


def test_the_example_answers_of_the_docs_match_the_document(document):
    """docs/http-api.md marks its example answers with the operation and status they show."""
    import json
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "http-api.md").read_text()
    examples = re.findall(r"<!-- response: (\w+) (\d+) -->\n```text\n(.*?)```", page, re.S)
    assert len(examples) >= 4
    operations = {e.operation_id: e for e in openapi.ENDPOINTS}
    for operation_id, status, body in examples:
        endpoint = operations[operation_id]
        answer = document["paths"][endpoint.path][endpoint.method]["responses"][status]
        schema = {
            **answer["content"]["application/json"]["schema"],
            "components": document["components"],
        }
        OAS31Validator(schema, format_checker=oas31_format_checker).validate(json.loads(body))
