"""Build the wheel and check what it holds: the package with its migrations,
templates, static files and py.typed, and nothing of the testproject or the tests."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--outdir", out, str(root)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wheel = next(Path(out).glob("kumiflow_django-*.whl"))
        names = zipfile.ZipFile(wheel).namelist()
    problems = []
    needed = [
        "kumiflow_django/py.typed",
        "kumiflow_django/migrations/0001_initial.py",
        *(
            f"kumiflow_django/{layer}/__init__.py"
            for layer in ("store", "definition", "steps", "projections", "outbox", "engine")
        ),
        *(f"kumiflow_django/{layer}/__init__.py" for layer in ("cron", "workers", "admin")),
    ]
    for name in needed:
        if name not in names:
            problems.append(f"missing {name}")
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        problems.append("no LICENSE in the dist-info")
    if not any(n.startswith("kumiflow_django/templates/") and n.endswith(".html") for n in names):
        problems.append("no templates")
    for static in (
        "kumiflow_django/static/kumiflow/console.css",
        "kumiflow_django/static/kumiflow/console.js",
    ):
        if static not in names:
            problems.append(f"missing {static}")
    for forbidden in ("testproject/", "tests/", "bench/", "docs/"):
        if any(n.startswith(forbidden) for n in names):
            problems.append(f"contains {forbidden}")
    print(f"{wheel.name}: {len(names)} files")
    for p in problems:
        print(f"  PROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
