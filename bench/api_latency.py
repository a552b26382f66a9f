"""API latency: ``evald serve`` over loopback HTTP against the same query run in-process with SQLAlchemy.

A database of 100 runs × 1,000 checkpoints × 20 metrics (2 M result rows, one task), on SQLite and on
PostgreSQL, bulk-loaded (executemany on SQLite, COPY on PostgreSQL). ``evald serve`` runs as its own
process on that database (read-only engine); this process times each request end to end (connect, query,
JSON, transfer). The baseline is the same storage/queries function called directly on a session here.
Queries (random run and metric per request):

- ``one metric of one run``: ``GET /api/v1/results?run=R&metric=M`` (1,000 rows) vs ``queries.result_rows``;
- ``latest of every run``: ``GET /api/v1/results/latest`` (2,000 rows) vs ``queries.latest_results``;
- ``series of one run`` (what the dashboard loads): ``GET /api/v1/runs/R/series?metric=M``.

Target: p95 < 100 ms. With ``--browser``, also the dashboard's first load for one run of 1,000 checkpoints
(20 charts, 20,000 points) in headless Chromium: navigation start to the first chart drawn (the first frame
after its line is in the DOM, marked by the page) and to all of them; also as Playwright sees them.

    python -m bench.api_latency [--backend sqlite|postgres|both] [--requests 200] [--browser]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy import insert
from sqlalchemy.engine import make_url

from storage import migrations, queries
from storage.database import Database
from storage.models import Checkpoint, EvalJob, Result, ResultSeries, Run
from tests.web_pages import CHROMIUM, CHROMIUM_ARGS

RUNS, CHECKPOINTS, METRICS = 100, 1000, 20
TASK = "math"
CHUNK = 50_000
ADMIN_URL = os.environ.get("EVALD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def run_name(i: int) -> str:
    return f"run_{i:03d}"


def metric_name(i: int) -> str:
    return f"metric_{i:02d}"


def _rows(now: datetime) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(table, rows) chunks; ids are given so the three levels join without reading back."""
    rng = random.Random(0)
    yield (
        "runs",
        [{"id": r + 1, "name": run_name(r), "root": f"/runs/{r}", "created_at": now} for r in range(RUNS)],
    )
    checkpoints, jobs = [], []
    for r in range(RUNS):
        for c in range(CHECKPOINTS):
            cid = r * CHECKPOINTS + c + 1
            step = (c + 1) * 10
            checkpoints.append(
                {
                    "id": cid,
                    "run_id": r + 1,
                    "path": f"/runs/{r}/global_step_{step}",
                    "name": f"global_step_{step}",
                    "step": step,
                    "epoch": None,
                    "layout": "hf",
                    "state": "ready",
                    "reason": None,
                    "discovered_at": now,
                    "updated_at": now,
                }
            )
            jobs.append(
                {
                    "id": cid,
                    "checkpoint_id": cid,
                    "task": TASK,
                    "stage": "full",
                    "state": "succeeded",
                    "priority": 0,
                    "step": step,
                    "attempts": 1,
                    "created_at": now,
                    "finished_at": now,
                    "duration_s": 10.0,
                }
            )
    yield "checkpoints", checkpoints
    yield "eval_jobs", jobs
    # What complete_job writes beside each job's results (bulk loading goes around it).
    yield "result_series", [{"run_id": r + 1, "task": TASK, "stage": "full"} for r in range(RUNS)]
    chunk: list[dict[str, Any]] = []
    rid = 0
    for job in range(1, RUNS * CHECKPOINTS + 1):
        for m in range(METRICS):
            rid += 1
            value = min(1.0, max(0.0, 0.5 + 0.3 * math.sin(job / 50 + m) + rng.gauss(0, 0.02)))
            chunk.append(
                {
                    "id": rid,
                    "job_id": job,
                    "metric": metric_name(m),
                    "value": value,
                    "n": 500,
                    "stderr": 0.02,
                    "created_at": now,
                }
            )
        if len(chunk) >= CHUNK:
            yield "results", chunk
            chunk = []
    if chunk:
        yield "results", chunk


TABLES = {
    "runs": Run,
    "checkpoints": Checkpoint,
    "eval_jobs": EvalJob,
    "result_series": ResultSeries,
    "results": Result,
}


def fill(database: Database) -> float:
    """Load the rows; returns seconds taken."""
    started = time.perf_counter()
    now = datetime.now(UTC)
    if database.dialect == "postgresql":
        _fill_postgres(database, now)
    else:
        for table, rows in _rows(now):
            with database.session() as s:
                s.execute(insert(TABLES[table]), rows)
    return time.perf_counter() - started


def _fill_postgres(database: Database, now: datetime) -> None:
    url = make_url(database.url).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False)) as conn:
        for table, rows in _rows(now):
            columns = list(rows[0])
            with conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row([row[c] for c in columns])
        with conn.cursor() as cur:
            for table in TABLES:
                if table != "result_series":  # keyed by (run, task, stage), no id sequence
                    sequence = f"pg_get_serial_sequence('{table}', 'id')"
                    cur.execute(f"SELECT setval({sequence}, (SELECT max(id) FROM {table}))")
                cur.execute(f"ANALYZE {table}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@contextmanager
def serving(folder: Path, url: str, port: int) -> Iterator[str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "d.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    config = folder / "evald.toml"
    config.write_text(
        f'[database]\nurl = "{url}"\n[[runs]]\nname = "{run_name(0)}"\nroot = "{folder}"\n'
        f'[[tasks]]\nname = "{TASK}"\ndataset = "d.jsonl"\n'
        '[daemon]\nlog_format = "json"\nlog_level = "warning"\n'
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "daemon", "--config", str(config), "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/api/v1", timeout=1).status_code == 200:
                    break
            except httpx.TransportError as exc:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"evald serve did not start: {process.stderr.read() if process.stderr else ''!r}"
                    ) from exc
                time.sleep(0.2)
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def measure(
    label: str, url: str, folder: Path, port: int, requests: int, *, filled: bool = False
) -> dict[str, Any]:
    database = Database(url)
    migrations.upgrade(database)
    load_s = 0.0
    if not filled:
        print(f"[{label}] loading {RUNS} runs × {CHECKPOINTS} checkpoints × {METRICS} metrics …", flush=True)
        load_s = fill(database)
        print(f"[{label}] loaded {RUNS * CHECKPOINTS * METRICS:,} result rows in {load_s:.0f} s", flush=True)
    reader = Database(url, read_only=True)
    rng = random.Random(1)
    picks = [
        (run_name(rng.randrange(RUNS)), metric_name(rng.randrange(METRICS))) for _ in range(requests + 20)
    ]
    out: dict[str, Any] = {"load_s": load_s}
    with serving(folder, url, port) as base, httpx.Client(base_url=base, timeout=30) as client:
        cases: list[tuple[str, Callable[[int], Any], Callable[[int], Any]]] = [
            (
                "one metric of one run",
                lambda i: _ok(
                    client.get("/api/v1/results", params={"run": picks[i][0], "metric": picks[i][1]}),
                    CHECKPOINTS,
                ),
                lambda i: _direct(
                    reader,
                    lambda s: queries.result_rows(
                        s, run=picks[i][0], metric=picks[i][1], limit=CHECKPOINTS + 1
                    ),
                    CHECKPOINTS,
                ),
            ),
            (
                "latest of every run",
                lambda i: _ok(client.get("/api/v1/results/latest", params={"limit": 10000}), RUNS * METRICS),
                lambda i: _direct(reader, queries.latest_results, RUNS * METRICS),
            ),
            (
                "series of one run (dashboard)",
                lambda i: client.get(
                    f"/api/v1/runs/{picks[i][0]}/series", params={"metric": picks[i][1]}
                ).raise_for_status(),
                lambda i: _direct(
                    reader, lambda s: queries.result_rows(s, run=picks[i][0], metric=picks[i][1]), CHECKPOINTS
                ),
            ),
        ]
        for name, http, direct in cases:
            http_ms, direct_ms = interleaved(http, direct, requests)
            out[name] = (http_ms, direct_ms)
            h50, h95 = statistics.median(http_ms), percentile(http_ms, 0.95)
            d50, d95 = statistics.median(direct_ms), percentile(direct_ms, 0.95)
            print(
                f"[{label}] {name}: HTTP p50 {h50:.1f} ms p95 {h95:.1f} ms"
                f" | SQLAlchemy p50 {d50:.1f} ms p95 {d95:.1f} ms"
                f" | ratio p50 {h50 / d50:.2f} p95 {h95 / d95:.2f}",
                flush=True,
            )
    reader.dispose()
    database.dispose()
    return out


def interleaved(
    http: Callable[[int], Any], direct: Callable[[int], Any], requests: int, warmup: int = 10
) -> tuple[list[float], list[float]]:
    """Both ways on the same pick, one after the other, the first of the two alternating: each sees the
    same page cache (the database is larger than what a cold pick finds in memory)."""
    for i in range(warmup):
        http(i)
        direct(i)
    http_ms: list[float] = []
    direct_ms: list[float] = []
    for i in range(warmup, warmup + requests):
        for fn, out in ((http, http_ms), (direct, direct_ms))[:: 1 if i % 2 else -1]:
            started = time.perf_counter()
            fn(i)
            out.append((time.perf_counter() - started) * 1000)
    return http_ms, direct_ms


def _ok(response: httpx.Response, rows: int) -> None:
    response.raise_for_status()
    got = len(response.json()["items"])
    if got != rows:
        raise RuntimeError(f"{response.url}: {got} rows, expected {rows}")


def _direct(database: Database, query: Callable[[Any], list[Any]], rows: int) -> None:
    with database.session() as s:
        got = len(query(s))
    if got != rows:
        raise RuntimeError(f"direct query: {got} rows, expected {rows}")


#: Set before the page's own script runs: the time the first chart's line, and then every chart's, was in
#: the DOM and a frame had been drawn after it (performance.now(), from navigation start).
MARK_DRAWN = """
window.__drawn = {};
new MutationObserver(() => {
  const lines = document.querySelectorAll('.chart polyline.line').length;
  for (const [name, wanted] of [['first', 1], ['every', %d]]) {
    if (lines >= wanted && !(name in window.__drawn)) {
      window.__drawn[name] = null;
      requestAnimationFrame(() => { window.__drawn[name] = performance.now(); });
    }
  }
}).observe(document, { childList: true, subtree: true });
"""


def first_chart(base: str, loads: int) -> dict[str, list[float]]:
    """Milliseconds from navigation start to the first chart drawn, and to all of them (one run): as the
    page saw it (``first``, ``every``: a frame drawn after the line was in the DOM) and as this process
    saw it through Playwright (``first_seen``, ``every_seen``: its polling and a round trip later)."""
    from playwright.sync_api import sync_playwright

    times: dict[str, list[float]] = {"first": [], "every": [], "first_seen": [], "every_seen": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        for _ in range(loads):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.add_init_script(MARK_DRAWN % METRICS)
            page.goto(f"{base}/#runs={run_name(7)}&smooth=none")
            page.wait_for_selector(".chart polyline.line", timeout=60_000)
            times["first_seen"].append(float(page.evaluate("performance.now()")))
            page.wait_for_function(
                "n => document.querySelectorAll('.chart polyline.line').length === n",
                arg=METRICS,
                timeout=60_000,
            )
            times["every_seen"].append(float(page.evaluate("performance.now()")))
            page.wait_for_function("() => window.__drawn.every != null", timeout=60_000)
            drawn = page.evaluate("window.__drawn")
            times["first"].append(float(drawn["first"]))
            times["every"].append(float(drawn["every"]))
            points = page.eval_on_selector_all(
                ".chart polyline.line", "ls => ls.map(l => Number(l.dataset.points))"
            )
            if points != [CHECKPOINTS] * METRICS:
                raise RuntimeError(f"points drawn per chart: {points}, expected {CHECKPOINTS} in each")
            page.close()
        browser.close()
    return times


def main() -> None:
    global RUNS, CHECKPOINTS, METRICS
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--browser", action="store_true", help="also time the dashboard's first load")
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--sqlite-db", type=Path, help="reuse a SQLite file filled by an earlier run")
    parser.add_argument("--postgres-url", help="reuse a PostgreSQL database filled by an earlier run")
    parser.add_argument("--runs", type=int, default=RUNS, help="a smaller shape for a quick check")
    parser.add_argument("--checkpoints", type=int, default=CHECKPOINTS)
    parser.add_argument("--metrics", type=int, default=METRICS)
    args = parser.parse_args()
    RUNS, CHECKPOINTS, METRICS = args.runs, args.checkpoints, args.metrics
    port = 18000 + os.getpid() % 1000
    with tempfile.TemporaryDirectory(prefix="evald-api-bench-") as tmp:
        folder = Path(tmp)
        if args.backend in ("sqlite", "both"):
            # --sqlite-db: a database this script filled before (the load takes minutes), reused as it is.
            url = f"sqlite:///{args.sqlite_db or folder / 'bench.db'}"
            measure("sqlite", url, folder / "sqlite", port, args.requests, filled=args.sqlite_db is not None)
            if args.browser:
                with serving(folder / "sqlite", url, port + 1) as base:
                    times = first_chart(base, args.loads)
                print(
                    f"[sqlite] dashboard load (1 run, {CHECKPOINTS} checkpoints, {METRICS} charts,"
                    f" {args.loads} loads), median (max) ms: "
                    + "; ".join(f"{k} {statistics.median(v):.0f} ({max(v):.0f})" for k, v in times.items()),
                    flush=True,
                )
        if args.backend in ("postgres", "both") and args.postgres_url:
            measure("postgres", args.postgres_url, folder / "postgres", port + 2, args.requests, filled=True)
        elif args.backend in ("postgres", "both"):
            name = f"evald_bench_{os.getpid()}"
            admin = psycopg.connect(ADMIN_URL, autocommit=True)
            admin.execute(f'CREATE DATABASE "{name}"')
            try:
                url = (
                    make_url(ADMIN_URL)
                    .set(drivername="postgresql+psycopg", database=name)
                    .render_as_string(hide_password=False)
                )
                measure("postgres", url, folder / "postgres", port + 2, args.requests)
            finally:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                admin.close()


if __name__ == "__main__":
    main()
