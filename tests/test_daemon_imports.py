"""What ``evald run`` imports from its start to ``daemon.ready`` and its stop, on the embedded default (a
SQLite file at the current schema, the local executor, the CPU, no webhook or tracker): the schema's
revision read without alembic, the datasets read without the worker's generation and judging, and none
of the worker's, trackers', remote executors' or web server's libraries. Counted in ``sys.modules`` of the
daemon's process after SIGTERM stopped it, not timed (``bench/daemon_start.py`` times it; BENCHMARKS.md
has its figures)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.deadlines import wait_process
from tests.harness import upgraded, wait_for, write_config, write_dataset

#: Runs ``daemon.cli.main`` with the arguments after the output file (``run`` returns after SIGTERM), then
#: writes the modules loaded.
DRIVER = """\
import json, sys
from daemon.cli import main
out, argv = sys.argv[1], sys.argv[2:]
code = main(argv)
with open(out, "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""

#: What a daemon never imports: the worker's libraries (torch lives in the worker processes), the trackers'
#: and the remote executors' clients, the web server, plotting; on a database at the current schema,
#: alembic and the migration files; on SQLite, PostgreSQL's dialect and driver.
NEVER = (
    "torch",
    "transformers",
    "deepspeed",
    "accelerate",
    "safetensors",
    "lm_eval",
    "numpy",
    "mlflow",
    "wandb",
    "ray",
    "boto3",
    "botocore",
    "httpx",
    "starlette",
    "uvicorn",
    "matplotlib",
    "alembic",
    "mako",
    "sqlalchemy.dialects.postgresql",
    "psycopg",
    "psycopg_pool",
)
#: The worker's run of a task, which the daemon's check of its datasets (``inference.rows``) does not need.
WORKER_RUN = (
    "inference.task",
    "inference.worker",
    "inference.generation",
    "inference.replica",
    "inference.rewards",
    "inference.code.judge",
    "inference.code.sandbox",
)
#: How many modules the daemon may load, a fresh interpreter's ~70 included: measured, plus a margin for a
#: library's patch release; raise it only with the reason. Measured 2026-12-06: 767 (790 before
#: ``inference.rows``).
CEILING = 785


def daemon_modules(tmp: Path, config: Path) -> set[str]:
    out, log = tmp / "modules.json", tmp / "daemon.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(out), "--config", str(config), "run"],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: b'"daemon.ready"' in log.read_bytes() or None, 60, "daemon.ready", process)
        process.send_signal(signal.SIGTERM)
        assert wait_process(process, 60) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    found = json.loads(out.read_text(encoding="utf-8"))
    assert found["code"] == 0
    return set(found["modules"])


def under(modules: set[str], *roots: str) -> list[str]:
    """The modules that are one of ``roots`` or inside one."""
    return sorted(m for m in modules if any(m == r or m.startswith(f"{r}.") for r in roots))


def test_a_daemon_at_the_current_schema_imports_neither_alembic_nor_the_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'evald.db'}"
    upgraded(url).dispose()
    config = write_config(tmp_path, url, dataset=write_dataset(tmp_path / "arith.jsonl", 5))
    modules = daemon_modules(tmp_path, config)
    assert under(modules, *NEVER) == []
    assert under(modules, *WORKER_RUN) == []
    # The revision is one SELECT (storage.schema); the dataset is read by inference.rows.
    assert {"storage.schema", "inference.rows"} <= modules
    # Nor the surfaces that are other commands: the web server, the exports, the other handlers.
    assert under(modules, "daemon.web", "daemon.export", "daemon.demo") == []
    assert under(modules, "daemon.cli") == [
        "daemon.cli",
        "daemon.cli.base",
        "daemon.cli.datasets",
        "daemon.cli.lazy_logging",
        "daemon.cli.parser",
        "daemon.cli.run",
    ]
    assert len(modules) <= CEILING, len(modules)
