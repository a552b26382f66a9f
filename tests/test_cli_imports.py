"""Imports follow the command: ``evald --help`` imports argparse and the parser alone, ``evald results`` and
``evald status`` what reading the database needs and never alembic (the schema revision is read from the
database, :mod:`storage.schema`) nor the worker's libraries. Counted in ``sys.modules`` of a fresh
interpreter after the command ran, not timed (``bench/cli_latency.py`` times them)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.cli.parser import Handler, build_parser
from storage import queries
from storage.models import CheckpointState
from tests.harness import upgraded, write_config, write_dataset

#: Runs ``daemon.cli.main`` with the arguments after the output file, then writes the modules loaded.
DRIVER = """\
import json, sys
from daemon.cli import main
out, argv = sys.argv[1], sys.argv[2:]
try:
    code = main(argv)
except SystemExit as exc:
    code = exc.code
with open(out, "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""

#: What no command that only reads the database needs: migrations, the worker, plotting, the web server,
#: and the daemon's own loop.
NEVER_TO_READ = (
    "alembic",
    "mako",
    "torch",
    "transformers",
    "deepspeed",
    "numpy",
    "matplotlib",
    "starlette",
    "uvicorn",
)
#: On a SQLite database: PostgreSQL's dialect and driver.
NEVER_ON_SQLITE = ("sqlalchemy.dialects.postgresql", "psycopg", "psycopg_pool")
#: ``--help`` and a usage error: none of the above, nor the database, the config's models or logging.
NEVER_FOR_HELP = (
    *NEVER_TO_READ,
    "pygments",
    "sqlalchemy",
    "pydantic",
    "structlog",
    "psutil",
    "daemon.config",
)


def loaded(tmp_path: Path, *argv: str) -> tuple[int, set[str]]:
    out = tmp_path / "modules.json"
    subprocess.run([sys.executable, "-c", DRIVER, str(out), *argv], check=True, capture_output=True)
    found = json.loads(out.read_text(encoding="utf-8"))
    return found["code"], set(found["modules"])


def under(modules: set[str], *roots: str) -> list[str]:
    """The modules that are one of ``roots`` or inside one."""
    return sorted(m for m in modules if any(m == r or m.startswith(f"{r}.") for r in roots))


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database at the current schema with one evaluated checkpoint, and its config."""
    tmp = tmp_path_factory.mktemp("cli-imports")
    url = f"sqlite:///{tmp / 'evald.db'}"
    database = upgraded(url)
    try:
        with database.session() as s:
            run_id = queries.ensure_run(s, "toy", str(tmp / "run"))
            checkpoint = queries.record_checkpoint(
                s,
                run_id=run_id,
                path=str(tmp / "run" / "step_5"),
                name="step_5",
                step=5,
                epoch=None,
                layout="hf",
                state=CheckpointState.READY,
            )
            queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=5, tasks=["arith"])
            job = queries.claim_next_job(s, "h:1")
            assert job is not None
            metrics = [queries.MetricRow("accuracy", 0.5, 4, 0.25)]
            queries.complete_job(
                s, job_id=job.id, owner="h:1", duration_s=1.0, load_s=0.1, metrics=metrics, samples=[]
            )
    finally:
        database.dispose()
    return write_config(tmp, url, dataset=write_dataset(tmp / "arith.jsonl", 5))


@pytest.mark.parametrize("argv", [["--help"], ["results", "--help"], ["no-such-command"]])
def test_help_and_a_usage_error_import_the_parser_alone(tmp_path: Path, argv: list[str]) -> None:
    code, modules = loaded(tmp_path, *argv)
    assert code == (2 if argv == ["no-such-command"] else 0)
    assert under(modules, *NEVER_FOR_HELP) == []
    # The parser names the handlers; no command's module is imported to build it.
    assert under(modules, "daemon.cli") == ["daemon.cli", "daemon.cli.parser"]


def test_results_reads_the_revision_without_alembic(tmp_path: Path, config: Path) -> None:
    code, modules = loaded(tmp_path, "--config", str(config), "results", "--run", "toy")
    assert code == 0
    assert under(modules, *NEVER_TO_READ, *NEVER_ON_SQLITE) == []
    assert "storage.schema" in modules and "storage.migrations" not in modules
    # Nor the daemon's loop, its workers or the other commands.
    assert under(modules, "daemon.service", "daemon.running", "daemon.watching", "daemon.web") == []
    assert under(modules, "daemon.cli") == [
        "daemon.cli",
        "daemon.cli.base",
        "daemon.cli.parser",
        "daemon.cli.results",
    ]


def test_status_reads_the_revision_without_alembic(tmp_path: Path, config: Path) -> None:
    code, modules = loaded(tmp_path, "--config", str(config), "status")
    assert code == 0
    assert under(modules, *NEVER_TO_READ, *NEVER_ON_SQLITE) == []
    # With no resource threshold set and the local executor, neither the daemon's loop nor its executors:
    # no probe to build, no Slurm queue to read. (The scheduling policy that the runs' status shares with
    # the planner reads daemon.watching's run model.)
    assert under(modules, "daemon.service", "daemon.running", "daemon.web") == []


def handlers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, Handler]]:
    """Every command's handler, with the command's words (``export tensorboard``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                handler = sub.get_default("handler")
                if handler is not None:
                    yield name, handler
                yield from ((f"{name} {inner}", h) for inner, h in handlers(sub))


def test_every_command_names_a_handler_that_exists() -> None:
    """The parser imports no handler, so a misspelt one would show only when its command runs."""
    found = dict(handlers(build_parser()))
    assert {"run", "results", "status", "export tensorboard", "db upgrade", "config check"} <= set(found)
    for command, handler in found.items():
        assert isinstance(handler, Handler), command
        assert callable(handler.resolve()), command
