"""The benchmark: W1-W8 on SQLite and PostgreSQL, optionally side by side with DBOS.

    python bench/run.py [--db sqlite,postgres] [--peer dbos] [--only W1,W1-observed,W3]

W12 (the console's overview and run list with a million runs) runs only when
asked for: ``--only W12`` (``BENCH_W12_RUNS`` sets its size).

Every workload runs in a fresh child process (a fresh database, its own
peak memory). One JSON line per workload and engine, then the targets and a
summary table. Nothing is tuned to a target: where one is missed, the JSON
and the table say so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DBS = {"sqlite": "sqlite", "postgres": "postgresql"}


def child(engine: str, workload: str, db: str) -> None:
    if engine == "kumiflow":
        from bench.kumiflow_workloads import WORKLOADS
    else:
        from bench.dbos_workloads import WORKLOADS
    from bench.common import emit

    began = time.perf_counter()
    result = WORKLOADS[workload](db)
    result["seconds"] = round(time.perf_counter() - began, 1)
    emit(result)


def run_child(engine: str, workload: str, db: str, timeout: float) -> dict[str, Any]:
    base = {"workload": workload, "engine": engine, "db": db}
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", engine, workload, db],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return base | {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return base | {"error": " | ".join(tail)[:500]}
    return base | json.loads(lines[-1])


def _get(results: list[dict[str, Any]], workload: str, engine: str, db: str) -> dict[str, Any]:
    for r in results:
        if (r["workload"], r["engine"], r["db"]) == (workload, engine, db) and "error" not in r:
            return r
    return {}


def targets(results: list[dict[str, Any]], peer: bool) -> list[dict[str, Any]]:
    """The issue's targets, judged on what was measured."""
    out: list[dict[str, Any]] = []

    def target(name: str, met: bool | None, detail: str) -> None:
        out.append({"target": name, "met": met, "detail": detail})

    k = lambda w, db="postgresql": _get(results, w, "kumiflow", db)  # noqa: E731
    d = lambda w, db="postgresql": _get(results, w, "dbos", db)  # noqa: E731
    for db in ("postgresql", "sqlite"):
        observed = k("W1-observed", db)
        if observed:
            target(
                f"W1 with tracing and metrics within 15 % of W1 without them ({db})",
                observed["cost"] <= 0.15,
                f"{observed['workflows_per_s']} vs {observed['workflows_per_s_without']}/s side "
                f"by side ({observed['cost']:+.1%} time per workflow; CPU {observed['cpu_cost']:+.1%})",
            )
    w1 = k("W1")
    if w1:
        target(
            "W1 >= 1/3 of raw insert rate",
            w1["ratio_to_raw_inserts"] >= 1 / 3,
            f"{w1['ratio_to_raw_inserts']:.2f} of {w1['raw_inserts_per_s']}/s",
        )
        if peer and d("W1"):
            ratio = w1["workflows_per_s"] / d("W1")["workflows_per_s"]
            target("W1 >= 5x DBOS", ratio >= 5, f"{ratio:.1f}x")
    w2 = k("W2")
    if w2:
        target(
            "W2 p99 lateness < 250 ms", w2["lateness_p99_ms"] < 250, f"{w2['lateness_p99_ms']} ms"
        )
        if peer and d("W2"):
            ratio = w2["wall_minus_sleep_s"] / max(d("W2")["wall_minus_sleep_s"], 1e-9)
            target("W2 wall-2s <= half of DBOS", ratio <= 0.5, f"{ratio:.2f} of DBOS")
    for db in ("postgresql", "sqlite"):
        w3 = k("W3", db)
        if w3:
            target(
                f"W3 p99 < 10 ms ({db})", w3["latency_p99_ms"] < 10, f"{w3['latency_p99_ms']} ms"
            )
    if peer and k("W3") and d("W3"):
        ratio = d("W3")["all_complete_s"] / k("W3")["all_complete_s"]
        target("W3 all complete >= 2x faster than DBOS", ratio >= 2, f"{ratio:.1f}x")
    w4 = k("W4")
    if w4:
        worst = max(w4["ratio_0_due"], w4["ratio_100_due"])
        target("W4 poll with 100k finished <= 1.2x empty", worst <= 1.2, f"{worst:.2f}x")
        if peer and d("W4").get("finished_100k_claim_ms"):
            ours, theirs = w4["finished_100k_0_due_ms"], d("W4")["finished_100k_claim_ms"]
            target(
                "W4 poll no slower than DBOS's queue claim",
                ours <= theirs,
                f"{ours} vs {theirs} ms",
            )
    w5 = k("W5")
    if w5:
        target("W5 0 runs lost", w5["runs_lost"] == 0, str(w5["runs_lost"]))
        target(
            "W5 0 repeated database side effects",
            w5["side_effects_repeated"] == 0,
            str(w5["side_effects_repeated"]),
        )
        target(
            "W5 deliveries repeated at most once, same key",
            w5["deliveries_max_per_key"] <= 2 and w5["deliveries_distinct_keys"] == 200,
            f"max {w5['deliveries_max_per_key']} per key, {w5['deliveries_distinct_keys']} keys",
        )
    w6 = k("W6")
    if w6:
        target(
            "W6 memory within 10% (200 vs 20,000 sleeping)",
            abs(w6["memory_growth"]) <= 0.10,
            f"{w6['memory_growth']:+.1%}",
        )
    w7 = k("W7")
    if w7 and "all_complete_s" in w7:
        ideal = 1.5 * w7["ideal_s"]
        if w1:
            bound = ideal + 500 / w1["workflows_per_s"]
            target(
                "W7 all complete <= 1.5 x (500 x 0.2 s / 32) + W1's time for 500",
                w7["completed"] and w7["all_complete_s"] <= bound,
                f"{w7['all_complete_s']} s (bound {bound:.2f} s)",
            )
        else:
            target("W7 all complete within its bound", None, "W1 was not measured in this run")
        target(
            "W7 no transaction longer than 50 ms",
            w7["longest_transaction_ms"] <= 50,
            f"longest {w7['longest_transaction_ms']} ms in {w7['transaction_samples']} samples",
        )
        if peer and d("W7"):
            ratio = d("W7")["all_complete_s"] / w7["all_complete_s"]
            target("W7 (for the record) vs DBOS", None, f"{ratio:.2f}x DBOS's speed")
    w8 = k("W8")
    if w8 and "all_complete_s" in w8:
        if peer and d("W8"):
            ratio = d("W8")["all_complete_s"] / w8["all_complete_s"]
            target(
                "W8 1,000 children joined >= 3x faster than DBOS",
                w8["completed"] and ratio >= 3,
                f"{w8['all_complete_s']} s vs {d('W8')['all_complete_s']} s ({ratio:.1f}x)",
            )
        else:
            target("W8 vs DBOS", None, "DBOS was not measured (--peer dbos)")
    for db in ("postgresql", "sqlite"):
        w12 = k("W12", db)
        if w12:
            for page in ("overview", "run_list"):
                ms = w12[f"{page}_ms"]
                target(
                    f"W12 {page.replace('_', ' ')} < 200 ms with {w12['runs']:,} runs ({db})",
                    ms < 200,
                    f"{ms} ms median, {w12[f'{page}_p95_ms']} ms p95 "
                    f"(load average {w12['load_average_1m']} on {w12['cpus']} CPUs)",
                )
    return out


def summary(results: list[dict[str, Any]], judged: list[dict[str, Any]]) -> str:
    keys = {
        "W1": "workflows_per_s",
        "W1-observed": "workflows_per_s",
        "W2": "wall_minus_sleep_s",
        "W3": "all_complete_s",
        "W4": "finished_100k_0_due_ms",
        "W5": "runs_lost",
        "W6": "worker_rss_mb_20000",
        "W7": "all_complete_s",
        "W8": "all_complete_s",
        "W12": "overview_ms",
    }
    lines = [f"{'workload':<9}{'engine':<10}{'db':<12}{'headline':<28}{'peak MB':>8}"]
    for r in results:
        key = keys.get(r["workload"], "")
        if "error" in r:
            value = "ERROR " + r["error"][:60]
        elif key in r:
            value = f"{key}={r[key]}"
        else:
            value = json.dumps(
                {k: v for k, v in r.items() if k not in ("workload", "engine", "db")}
            )[:40]
        lines.append(
            f"{r['workload']:<9}{r['engine']:<10}{r['db']:<12}{value:<28}{r.get('peak_rss_mb', ''):>8}"
        )
    lines.append("")
    for t in judged:
        mark = {True: "MET   ", False: "MISSED", None: "n/a   "}[t["met"]]
        lines.append(f"{mark} {t['target']}: {t['detail']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="sqlite,postgres")
    parser.add_argument("--peer", choices=["dbos"], default=None)
    parser.add_argument("--only", default="W1,W1-observed,W2,W3,W4,W5,W6,W7,W8")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--child", nargs=3, metavar=("ENGINE", "WORKLOAD", "DB"))
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    results = []
    for db in [DBS[x] for x in args.db.split(",")]:
        for workload in args.only.split(","):
            peer = args.peer and workload != "W12" and not workload.endswith("-observed")
            engines = ["kumiflow", "dbos"] if peer else ["kumiflow"]
            for engine in engines:
                result = run_child(engine, workload, db, args.timeout)
                print(json.dumps(result), flush=True)
                results.append(result)
    judged = targets(results, bool(args.peer))
    machine = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
    }
    print(json.dumps({"targets": judged, "machine": machine}), flush=True)
    print(summary(results, judged))
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "latest.json").write_text(
        json.dumps({"results": results, "targets": judged, "machine": machine}, indent=2)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
