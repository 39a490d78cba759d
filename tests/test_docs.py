"""Every code block of the documentation runs.

Python blocks of a page run in order in one namespace, against the test
database, with an isolated workflow registry. Shell blocks run their
``python manage.py …`` lines through ``call_command``; a block that cannot
run here (a long-running process, an install) is preceded by
``<!-- not run: <reason> -->``. ``yaml`` and ``json`` blocks (configuration)
must parse. ``text`` blocks are signatures and output.

Pages whose top says ``<!-- project: newcomer -->`` (the installation, the
tutorials and the pages built on the tutorial's models) assume a project of
the reader's own: scripts/newcomer.py runs them in one made with
``startproject`` from the built wheel (CI), and here only their markers are
checked. No page's code may import the testproject or name its models: a
reader does not have them.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import django
import pytest
import yaml
from django.core.management import call_command

DOCS = Path(__file__).resolve().parent.parent / "docs"
FENCE = re.compile(
    r"(?P<skip><!-- not run: (?P<reason>[^>]*)-->\n)?```(?P<lang>[\w-]*)\n(?P<code>.*?)```", re.S
)
PAGES = sorted(DOCS.rglob("*.md"))
NEWCOMER_MARK = "<!-- project: newcomer -->"


def is_newcomer_page(page: Path) -> bool:
    return NEWCOMER_MARK in page.read_text().split("\n", 3)[:3]


#: The pages this test runs; the others run in the newcomer's project.
HERE = [page for page in PAGES if not is_newcomer_page(page)]

#: What only the testproject has: a reader's project has neither.
TESTPROJECT_ONLY = re.compile(r"\btestproject\b|[\"']shop\.[A-Z]")


def blocks(page: Path):
    return list(FENCE.finditer(page.read_text()))


@pytest.fixture
def clean_extensions():
    """Docs register handlers, step and dispatch kinds: take them back afterwards."""
    from kumiflow_django.definition.step import step_kinds
    from kumiflow_django.outbox.kinds import dispatch_kinds
    from kumiflow_django.projections.user import projections
    from kumiflow_django.steps.call import handlers
    from kumiflow_django.store import telemetry

    with (
        step_kinds.isolated(),
        dispatch_kinds.isolated(),
        handlers.isolated(),
        projections.isolated(),
        telemetry.isolated(),  # the tracing and metrics pages install integrations
    ):
        yield


@pytest.mark.parametrize("page", HERE, ids=[str(p.relative_to(DOCS)) for p in HERE])
@pytest.mark.django_db(databases=["default", "workflows"])
def test_the_code_blocks_of_a_page_run(
    page, registry, clean_extensions, mailoutbox, settings, monkeypatch
):
    # The page's code runs as a module that imports by its name, so that what it
    # defines has a dotted path (a task step's function needs one).
    module = types.ModuleType(f"kumiflow_docs_{page.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    if django.VERSION < (6, 0):  # the docs import django.tasks; 5.2 has the backport
        monkeypatch.setitem(sys.modules, "django.tasks", importlib.import_module("django_tasks"))
    namespace = module.__dict__
    for match in blocks(page):
        lang, code = match["lang"], match["code"]
        where = f"{page.name}: block starting {code.strip().splitlines()[0][:60]!r}"
        if match["skip"]:
            assert match["reason"].strip(), f"{where} is not run and says no reason"
            continue
        if lang == "python":
            exec(compile(code, str(page), "exec"), namespace)  # noqa: S102 - the docs' own code
        elif lang in ("sh", "console"):
            for line in code.splitlines():
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                words = shlex.split(line)
                assert words[:2] == ["python", "manage.py"], f"{where}: cannot run {line!r}"
                call_command(*words[2:])
        elif lang == "yaml":  # configuration (Prometheus): it must parse
            yaml.safe_load(code)
        elif lang == "json":
            json.loads(code)
        else:
            assert lang == "text", f"{where}: a {lang or 'plain'} block is neither run nor text"


def test_the_docs_name_every_page_in_the_navigation():
    nav = (DOCS.parent / "mkdocs.yml").read_text()
    for page in PAGES:
        assert str(page.relative_to(DOCS)) in nav, page


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_no_code_block_needs_the_testproject(page):
    for match in blocks(page):
        found = TESTPROJECT_ONLY.search(match["code"])
        assert not found, f"{page.name}: a block uses {found[0]!r}, which only the testproject has"


def test_every_block_of_the_newcomer_pages_says_how_it_runs():
    newcomer = subprocess.run(
        [sys.executable, str(DOCS.parent / "scripts" / "newcomer.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert newcomer.returncode == 0, newcomer.stderr
    listed = newcomer.stdout.removeprefix("newcomer: ").strip().split(", ")
    assert sorted(listed) == sorted(str(p.relative_to(DOCS)) for p in PAGES if is_newcomer_page(p))
    assert listed[:2] == ["installation.md", "tutorial.md"]  # in the navigation's order


@pytest.mark.django_db(databases=["default", "workflows"])
def test_the_http_api_pages_first_token_can_start_a_run(registry, capsys):
    """The first token a reader makes on the HTTP API page works for its first
    example, a start (it once lacked ``start_workflowrun``)."""
    from django.test import Client

    from kumiflow_django import define_workflow
    from kumiflow_django import steps as s

    text = (DOCS / "http-api.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("python manage.py kumiflow_token"))
    call_command(*shlex.split(line)[2:])
    secret = capsys.readouterr().out.strip()
    define_workflow("hello", steps=[s.return_("hi")])
    api = Client(headers={"Authorization": f"Bearer {secret}"})
    response = api.post(
        "/api/kumiflow/runs/", {"workflow": "hello"}, content_type="application/json"
    )
    assert response.status_code == 201, response.content


def test_the_readme_names_the_setting_its_signed_webhook_needs(registry):
    """The README's workflow signs a webhook: the README says which setting
    that needs, and ``manage.py check`` refuses the workflow without it."""
    from django.test import override_settings

    from kumiflow_django.checks import check_step_settings

    readme = (DOCS.parent / "README.md").read_text()
    workflow = next(m["code"] for m in FENCE.finditer(readme) if "define_workflow(" in m["code"])
    # the tutorial's customers.Customer is the testproject's shop.Customer
    here = workflow.replace('"customers.Customer"', '"shop.Customer"')
    exec(compile(here, "README.md", "exec"), {})  # noqa: S102 - the README's own code
    secrets = set(re.findall(r'secret="(\w+)"', workflow))
    assert secrets, "the README's workflow signs no webhook any more: drop this test"
    for name in secrets:
        assert f'KUMIFLOW_WEBHOOK_SECRETS = {{"{name}"' in readme
    with override_settings(KUMIFLOW_WEBHOOK_SECRETS={}):
        assert {m.id for m in check_step_settings()} == {"kumiflow.E044"}
    with override_settings(KUMIFLOW_WEBHOOK_SECRETS=dict.fromkeys(secrets, "s")):
        assert check_step_settings() == []
