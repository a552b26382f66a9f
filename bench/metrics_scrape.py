"""Prometheus scrape cost: ``GET /metrics``'s collector against the same queries run directly.

The database of ``bench.api_latency`` (100 runs × 1,000 checkpoints × 20 metrics: 2 M result rows, every
job succeeded with a duration), on SQLite and PostgreSQL, opened read-only as ``evald serve`` opens it.
Per scrape the collector runs five aggregate queries in one transaction and encodes the families in the
text exposition format; the baseline is those five ``storage`` query functions called directly in one
session here, so the ratio is what the collector and the encoding add. Prometheus' default
``scrape_timeout`` is 10 s.

    python -m bench.metrics_scrape [--backend sqlite|postgres|both] [--scrapes 7] [--runs 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client.exposition import generate_latest
from sqlalchemy.engine import make_url

from bench import api_latency
from daemon.web.metrics import DURATION_BUCKETS, registry
from storage import alerting, migrations, queries
from storage.database import Database


def _direct(database: Database) -> None:
    with database.session() as session:
        queries.latest_results(session)
        queries.run_rows(session)
        queries.job_state_counts(session)
        alerting.firing_counts(session)
        queries.job_durations(session, DURATION_BUCKETS)


def _times(fn: Callable[[], Any], count: int) -> list[float]:
    fn()  # warm the caches once, as a running service has them
    out = []
    for _ in range(count):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def measure(label: str, url: str, scrapes: int) -> None:
    database = Database(url)
    try:
        migrations.upgrade(database)
        filled = api_latency.fill(database)
    finally:
        database.dispose()
    rows = api_latency.RUNS * api_latency.CHECKPOINTS * api_latency.METRICS
    print(f"[{label}] filled {rows:,} result rows in {filled:.0f} s", flush=True)
    reader = Database(url, read_only=True)
    try:
        found = registry(reader)
        body = generate_latest(found)
        direct = _times(lambda: _direct(reader), scrapes)
        scrape = _times(lambda: generate_latest(found), scrapes)
    finally:
        reader.dispose()
    ratio = statistics.median(scrape) / statistics.median(direct)
    lines = body.count(b"\n")
    print(
        f"[{label}] scrape: median {statistics.median(scrape):.3f} s, max {max(scrape):.3f} s "
        f"({lines} lines, {len(body) / 1024:.0f} KiB); the five queries directly: median "
        f"{statistics.median(direct):.3f} s; scrape/direct {ratio:.2f}x over {scrapes} scrapes",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--scrapes", type=int, default=7)
    parser.add_argument(
        "--runs", type=int, default=api_latency.RUNS, help="a smaller shape for a quick check"
    )
    parser.add_argument("--checkpoints", type=int, default=api_latency.CHECKPOINTS)
    parser.add_argument("--metrics", type=int, default=api_latency.METRICS)
    args = parser.parse_args()
    api_latency.RUNS, api_latency.CHECKPOINTS, api_latency.METRICS = args.runs, args.checkpoints, args.metrics
    with tempfile.TemporaryDirectory(prefix="evald-scrape-bench-") as tmp:
        if args.backend in ("sqlite", "both"):
            measure("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}", args.scrapes)
        if args.backend in ("postgres", "both"):
            name = f"evald_scrape_bench_{os.getpid()}"
            admin = psycopg.connect(api_latency.ADMIN_URL, autocommit=True)
            admin.execute(f'CREATE DATABASE "{name}"')
            try:
                url = (
                    make_url(api_latency.ADMIN_URL)
                    .set(drivername="postgresql+psycopg", database=name)
                    .render_as_string(hide_password=False)
                )
                measure("postgres", url, args.scrapes)
            finally:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                admin.close()


if __name__ == "__main__":
    main()
