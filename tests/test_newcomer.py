"""scripts/newcomer.py, CI's newcomer step, fails when a docs block breaks.

The slow tests run the step (with this interpreter instead of a fresh venv
from the wheel, which CI does) on a copy of the docs with one line broken or
one of the docs' old errors put back, and expect a non-zero exit naming the
page and the block, and what went wrong.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "newcomer.py"


def load_newcomer():
    spec = importlib.util.spec_from_file_location("newcomer", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def docs_copy(tmp_path: Path, page: str, old: str, new: str) -> Path:
    """A copy of docs/ (and mkdocs.yml, for the order) with ``old`` replaced in ``page``."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    path = tmp_path / "docs" / page
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {page}"
    path.write_text(text.replace(old, new))
    return tmp_path / "docs"


def newcomer(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_docs_markers_are_all_known():
    done = newcomer("--check")
    assert done.returncode == 0, done.stderr


def test_an_unknown_marker_fails_naming_the_page_and_block(tmp_path):
    docs = docs_copy(
        tmp_path,
        "tutorial.md",
        "<!-- newcomer: file customers/views.py -->",
        "<!-- newcomer: fiel customers/views.py -->",
    )
    done = newcomer("--check", "--docs", docs)
    assert done.returncode == 1
    assert "tutorial.md: block 5 (line" in done.stderr
    assert "unknown marker 'newcomer: fiel customers/views.py'" in done.stderr


def test_a_settings_block_that_repeats_startproject_is_refused(tmp_path):
    """The installation page once repeated the MAILERS that Django 6.1's
    startproject writes: pasting it changes nothing."""
    newcomer_module = load_newcomer()
    subprocess.run(
        [str(Path(sys.executable).parent / "django-admin"), "startproject", "shop"],
        cwd=tmp_path,
        check=True,
    )
    settings_py = (tmp_path / "shop" / "shop" / "settings.py").read_text()
    old_block = (
        "import django\n\nif django.VERSION >= (6, 1):\n"
        '    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}}\n'
        "else:\n"
        '    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"\n'
    )
    block = newcomer_module.Block(
        Path("installation.md"), 4, 38, "python", old_block, "newcomer", "settings"
    )
    if "MAILERS" in settings_py:  # Django 6.1 and later
        with pytest.raises(newcomer_module.Failed, match="sets MAILERS to what startproject"):
            newcomer_module._refuse_repeats(settings_py, block)
    changed = newcomer_module.Block(
        Path("installation.md"), 3, 28, "python", 'DEFAULT_FROM_EMAIL = "a@b.c"\n', "", ""
    )
    newcomer_module._refuse_repeats(settings_py, changed)  # a new name: fine


#: The docs' old errors, each put back into a copy of its page: the page,
#: what is put back, the block that must fail, what it says, the pages to run.
OLD_ERRORS = {
    "a broken line": (
        "tutorial.md",
        ('sign_up("ada", "ada@example.com")', 'sign_up("ada")  # a broken line'),
        "tutorial.md: block 7 (line",  # the "Try it" block
        "TypeError: sign_up() missing 1 required positional argument",
        "installation.md,tutorial.md",
    ),
    # a process started in another folder opens another, empty database
    "a database relative to the current folder": (
        "installation.md",
        ('"NAME": BASE_DIR / "db.sqlite3",', '"NAME": "db.sqlite3",'),
        "tutorial.md: block 7 (line",  # the first block run from elsewhere
        "no such table",
        "installation.md,tutorial.md",
    ),
    "an app named like the project": (
        "tutorial.md",
        ("python manage.py startapp customers", "python manage.py startapp shop"),
        "tutorial.md: block 1 (line",
        "conflicts with the name of an existing Python module",
        "installation.md,tutorial.md",
    ),
    "wake_run not imported": (
        "tutorial.md",
        ("from kumiflow_django import wake_run\n", ""),
        "tutorial.md: block 11 (line",
        "NameError: name 'wake_run' is not defined",
        "installation.md,tutorial.md",
    ),
    "a Customer without the version that steps/model.md uses": (
        "tutorial.md",
        ("    version = models.PositiveIntegerField(default=1)", ""),
        "model.md: block 1 (line",
        "KeyError at step 1 (model.update 'c2'): 'version'",
        "installation.md,tutorial.md,steps/model.md",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("error", list(OLD_ERRORS))
def test_an_old_error_of_the_docs_fails_the_step(tmp_path, error):
    page, (old, new), block, message, pages = OLD_ERRORS[error]
    docs = docs_copy(tmp_path, page, old, new)
    done = newcomer("--here", "--docs", docs, "--pages", pages)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "newcomer: FAILED: " in done.stderr
    assert block in done.stderr, done.stderr[-3000:]
    assert message in done.stderr, done.stderr[-3000:]


def test_writing_code_while_a_worker_runs_is_refused(tmp_path):
    """A worker keeps the code it started with: a page that changes a file
    under a running worker must stop and start it again."""
    newcomer_module = load_newcomer()
    project = newcomer_module.Project(tmp_path, Path(sys.executable))
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        project.workers.append(running)
        block = newcomer_module.Block(
            Path("tutorial-checkout.md"), 6, 130, "python", "X = 1\n", "newcomer", "file a.py"
        )
        with pytest.raises(newcomer_module.Failed, match="while a worker runs"):
            project.file(block)
    finally:
        running.kill()
        running.wait()
    project.file(block)  # no worker: written
    assert (tmp_path / newcomer_module.PROJECT / "a.py").read_text() == "X = 1\n"
