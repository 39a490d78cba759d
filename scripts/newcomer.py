"""A newcomer's first hour, run by CI: the docs are the script.

In a temporary folder: build the wheel, make a fresh virtual environment,
install the wheel (not the checkout), ``django-admin startproject``, then go
through the pages whose top says ``<!-- project: newcomer -->`` in the order
of mkdocs.yml's navigation, doing what each block says:

- ``<!-- newcomer: settings -->`` before a Python block: append it to the
  project's settings.py (a block that only repeats what ``startproject``
  wrote already is an error: the doc would have the reader paste noise);
- ``<!-- newcomer: file PATH -->``: write the block to PATH in the project
  (the first block for a path replaces what is there, later ones append);
- a Python block without a marker: run it in the page's shell (one process
  and one namespace per page, like ``manage.py shell``; writing a file
  ends the shell, as a reader would restart it);
- a ``sh``/``console`` block: run its ``python manage.py …`` lines;
- ``<!-- newcomer: worker -->`` before a ``sh`` block: start it in the
  background (a long-running ``kumiflow_worker``);
- ``<!-- newcomer: kill worker -->``: SIGKILL the worker started last (the
  block is what the reader types; the script kills its own process by id);
- ``<!-- not run: REASON -->``: skipped; ``text`` blocks are output.

Writing a file while a worker runs is an error: the worker runs the old code
until it is restarted, and the page must say so (stop it, start it again).
A block that fails ends the run with the page and block named. Commands and
the worker run in the project's folder, as a reader runs them; the shell runs
in the folder above it (the project on its path), so that a database path
relative to the current folder shows up.

    python scripts/newcomer.py                 # what CI runs
    python scripts/newcomer.py --here          # this interpreter, no wheel (quicker)
    python scripts/newcomer.py --docs DIR --keep --pages installation.md,tutorial.md
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The project's name: ``shop``, so that docs telling a reader to
#: ``startapp shop`` (a name that collides with the project) fail here.
PROJECT = "shop"
PAGE_MARK = "<!-- project: newcomer -->"
FENCE = re.compile(r"```(?P<lang>[\w-]*)\n(?P<code>.*?)```", re.S)
MARK = re.compile(r"<!-- (?P<kind>newcomer|not run): ?(?P<what>[^>]*?) ?-->\s*$")
#: Longest time one block (or command) may take.
BLOCK_SECONDS = 120


class Failed(Exception):
    """A block of a page did not do what the page says."""


@dataclass
class Block:
    page: Path
    number: int  # 1-based, among the page's fenced blocks
    line: int
    lang: str
    code: str
    kind: str  # "newcomer", "not run" or ""
    what: str

    @property
    def where(self) -> str:
        first = self.code.strip().splitlines()[0][:60] if self.code.strip() else ""
        return f"{self.page}: block {self.number} (line {self.line}, {first!r})"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for number, match in enumerate(FENCE.finditer(text), start=1):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.match(before.strip())
        found.append(
            Block(
                page,
                number,
                text.count("\n", 0, match.start()) + 1,
                match["lang"],
                match["code"],
                mark["kind"] if mark else "",
                mark["what"].strip() if mark else "",
            )
        )
    return found


def newcomer_pages(docs: Path) -> list[Path]:
    """The pages marked for the newcomer's project, in the navigation's order."""
    nav = re.findall(r"^\s*-\s.*?(\S+\.md)\s*$", (docs.parent / "mkdocs.yml").read_text(), re.M)
    ordered = [docs / name for name in nav if (docs / name).exists()]
    ordered += sorted(p for p in docs.rglob("*.md") if p not in ordered)
    return [p for p in ordered if PAGE_MARK in p.read_text().split("\n", 3)[0:3]]


def plan(block: Block) -> str:
    """What the run does with a block, or Failed if the page does not say."""
    if block.kind == "not run":
        if not block.what:
            raise Failed(f"{block.where} is not run and says no reason")
        return "skip"
    if block.lang == "text":
        return "skip"
    if block.kind == "newcomer":
        if block.what == "settings" and block.lang == "python":
            return "settings"
        if block.what.startswith("file ") and block.lang == "python":
            return "file"
        if block.what in ("worker", "kill worker") and block.lang in ("sh", "console"):
            return block.what
        raise Failed(
            f"{block.where}: unknown marker 'newcomer: {block.what}' for a {block.lang} block"
        )
    if block.lang == "python":
        return "shell"
    if block.lang in ("sh", "console"):
        return "commands"
    raise Failed(f"{block.where}: a {block.lang or 'plain'} block is neither run nor text")


# -- the shell: one process per page that execs blocks in one namespace ------

SHELL = r"""
import json, os, sys, traceback, types
proto = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # what the blocks print goes to stderr, the protocol to the old stdout
import django
django.setup()
module = types.ModuleType("newcomer_shell")
sys.modules[module.__name__] = module
for line in sys.stdin:
    block = json.loads(line)
    try:
        exec(compile(block["code"], block["where"], "exec"), module.__dict__)
        answer = {"ok": True}
    except BaseException:
        answer = {"ok": False, "error": traceback.format_exc()}
    proto.write(json.dumps(answer) + "\n")
    proto.flush()
"""


#: Cancels the pending webhooks to hosts other than this machine (see
#: ``Project.keep_outbox_local``), through the public ``cancel_dispatch``.
KEEP_LOCAL = """
from urllib.parse import urlsplit
from kumiflow_django import cancel_dispatch
from kumiflow_django.models import Dispatch
local = {"127.0.0.1", "localhost", "::1"}
for d in Dispatch.objects.filter(kind="webhook", status__in=["pending", "failed"]):
    if urlsplit(str(d.request.get("url", ""))).hostname not in local:
        cancel_dispatch(d.id, reason="the newcomer step's machine has no network", by="newcomer")
"""


class Project:
    def __init__(self, folder: Path, python: Path) -> None:
        self.folder = folder  # the folder the project was made in
        self.dir = folder / PROJECT
        self.python = python
        self.env = {**os.environ, "DJANGO_SETTINGS_MODULE": f"{PROJECT}.settings"}
        self.env.pop("DATABASE_URL", None)
        self.shell: subprocess.Popen[str] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.written: set[str] = set()
        self.logs = folder / "logs"
        self.logs.mkdir(exist_ok=True)

    def run(self, words: list[str], where: str) -> None:
        try:
            done = subprocess.run(
                words,
                cwd=self.dir,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=BLOCK_SECONDS,
            )
        except subprocess.TimeoutExpired as exc:
            raise Failed(f"{where}: {shlex.join(words)} took more than {BLOCK_SECONDS} s") from exc
        if done.returncode:
            raise Failed(f"{where}: {shlex.join(words)} failed:\n{done.stdout}{done.stderr}")

    def manage(self, line: str, where: str) -> list[str]:
        words = shlex.split(line.split("#", 1)[0])
        if words[:2] != ["python", "manage.py"]:
            raise Failed(f"{where}: cannot run {line.strip()!r} (only python manage.py …)")
        return [str(self.python), "manage.py", *words[2:]]

    # blocks
    def settings(self, block: Block) -> None:
        path = self.dir / PROJECT / "settings.py"
        before = path.read_text()
        _refuse_repeats(before, block)
        path.write_text(before + "\n\n" + block.code)

    def file(self, block: Block) -> None:
        if any(w.poll() is None for w in self.workers):
            raise Failed(
                f"{block.where}: the page changes code while a worker runs, which keeps "
                "running the old code: stop the worker first and start it again after"
            )
        name = block.what.removeprefix("file ").strip()
        path = self.dir / name
        if not path.resolve().is_relative_to(self.dir.resolve()):
            raise Failed(f"{block.where}: {name} is outside the project")
        path.parent.mkdir(parents=True, exist_ok=True)
        text = block.code if name not in self.written else path.read_text() + "\n\n" + block.code
        path.write_text(text)
        self.written.add(name)
        self.end_shell()

    def commands(self, block: Block) -> None:
        for line in block.code.splitlines():
            if line.split("#", 1)[0].strip():
                self.run(self.manage(line, block.where), block.where)

    def worker(self, block: Block) -> None:
        self.keep_outbox_local(block.where)
        for line in block.code.splitlines():
            if line.split("#", 1)[0].strip():
                with (self.logs / f"worker-{len(self.workers) + 1}.log").open("wb") as log:
                    self.workers.append(
                        subprocess.Popen(
                            self.manage(line, block.where),
                            cwd=self.dir,
                            env=self.env,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                        )
                    )

    def keep_outbox_local(self, where: str) -> None:
        """This machine reaches no network: before a worker delivers the outbox,
        cancel the pages' webhooks to hosts that are not this machine (the
        tutorial's CRM example), so that nothing tries to resolve or reach them."""
        self.run([str(self.python), "manage.py", "shell", "-c", KEEP_LOCAL], where)

    def kill_worker(self, block: Block) -> None:
        running = [w for w in self.workers if w.poll() is None]
        if not running:
            raise Failed(f"{block.where}: there is no running worker to kill")
        running[-1].send_signal(signal.SIGKILL)
        running[-1].wait()

    def run_in_shell(self, block: Block) -> None:
        if self.shell is None:
            with (self.logs / f"shell-{block.page.stem}.log").open("a") as log:
                self.shell = subprocess.Popen(
                    [str(self.python), "-c", SHELL],
                    cwd=self.folder,  # not the project: a relative path shows
                    env={**self.env, "PYTHONPATH": str(self.dir)},
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                )
        shell = self.shell
        assert shell.stdin and shell.stdout
        timer = threading.Timer(BLOCK_SECONDS, shell.kill)
        timer.start()
        try:
            shell.stdin.write(json.dumps({"code": block.code, "where": str(block.page)}) + "\n")
            shell.stdin.flush()
            line = shell.stdout.readline()
        finally:
            timer.cancel()
        if not line:
            self.shell = None
            raise Failed(f"{block.where}: the shell ended (more than {BLOCK_SECONDS} s?)")
        answer = json.loads(line)
        if not answer["ok"]:
            raise Failed(f"{block.where} failed:\n{answer['error']}")

    def end_shell(self) -> None:
        if self.shell is not None:
            assert self.shell.stdin
            self.shell.stdin.close()
            self.shell.wait(timeout=30)
            self.shell = None

    def stop(self) -> None:
        self.end_shell()
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                try:
                    worker.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()


def _refuse_repeats(settings_py: str, block: Block) -> None:
    """A settings block must change something: one that sets a name to the value
    startproject wrote already only makes the reader paste it twice."""
    before: dict[str, object] = {"__file__": "settings.py"}
    exec(compile(settings_py, "settings.py", "exec"), before)  # noqa: S102 - startproject's own
    written = {name: repr(value) for name, value in before.items() if name.isupper()}
    after = before  # the block may change values in place (+=)
    exec(compile(block.code, str(block.page), "exec"), after)  # noqa: S102 - the doc's block
    assigned = {
        target.id
        for node in ast.walk(ast.parse(block.code))
        if isinstance(node, ast.Assign | ast.AugAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and target.id.isupper()
    }
    repeated = sorted(n for n in assigned if n in written and written[n] == repr(after[n]))
    if repeated:
        raise Failed(
            f"{block.where} sets {', '.join(repeated)} to what startproject's settings.py "
            "has already"
        )


def go_through(project: Project, pages: list[Path]) -> None:
    for page in pages:
        for block in blocks(page):
            action = plan(block)
            print(f"newcomer: {block.where}: {action}", flush=True)
            if action == "settings":
                project.settings(block)
            elif action == "file":
                project.file(block)
            elif action == "shell":
                project.run_in_shell(block)
            elif action == "commands":
                project.commands(block)
            elif action == "worker":
                project.worker(block)
            elif action == "kill worker":
                project.kill_worker(block)
        project.stop()  # what a page started ends with it


def install(folder: Path, here: bool) -> Path:
    """The interpreter of the newcomer's project: a fresh venv with the built wheel."""
    if here:
        return Path(sys.executable)
    dist = folder / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wheel = next(dist.glob("kumiflow_django-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(folder / "venv")], check=True)
    python = folder / "venv" / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
        check=True,
    )
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="the docs folder")
    parser.add_argument("--here", action="store_true", help="use this interpreter, no wheel")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--check", action="store_true", help="only check the markers")
    parser.add_argument(
        "--pages",
        help="only these of the pages, comma-separated (e.g. installation.md,tutorial.md)",
    )
    args = parser.parse_args(argv)
    pages = newcomer_pages(args.docs.resolve())
    if args.pages:
        wanted = [args.docs.resolve() / name for name in args.pages.split(",")]
        unknown = [str(p) for p in wanted if p not in pages]
        if unknown:
            print(f"newcomer: not newcomer pages: {', '.join(unknown)}", file=sys.stderr)
            return 2
        pages = [p for p in pages if p in wanted]
    try:
        for page in pages:
            for block in blocks(page):
                plan(block)
    except Failed as exc:
        print(f"newcomer: FAILED: {exc}", file=sys.stderr)
        return 1
    if args.check:
        print("newcomer: " + ", ".join(str(p.relative_to(args.docs.resolve())) for p in pages))
        return 0
    folder = Path(tempfile.mkdtemp(prefix="kumiflow-newcomer-"))
    started = time.monotonic()
    python = install(folder, args.here)
    django_admin = str(python.parent / "django-admin")
    subprocess.run([django_admin, "startproject", PROJECT], cwd=folder, check=True)
    project = Project(folder, python)
    try:
        go_through(project, pages)
    except Failed as exc:
        print(f"newcomer: FAILED: {exc}", file=sys.stderr)
        for log in sorted(project.logs.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-30:]
            print(f"--- {log.name} (last lines)\n" + "\n".join(tail), file=sys.stderr)
        print(f"newcomer: the project is in {folder}", file=sys.stderr)
        return 1
    finally:
        project.stop()
    print(f"newcomer: {len(pages)} pages ran in {time.monotonic() - started:.0f} s")
    if not args.keep:
        subprocess.run(["rm", "-rf", str(folder)], check=False)
    else:
        print(f"newcomer: the project is in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
