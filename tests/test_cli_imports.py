"""Imports follow the command: ``evald --help`` imports argparse and the parser alone, ``evald results`` and
``evald status`` what reading the database needs and never alembic (the schema revision is read from the
database, :mod:`storage.schema`), the worker's libraries, or logging when nothing logs (structlog with rich
and pygments); ``results`` reads the database URL without the config's pydantic models. Counted in
``sys.modules`` of a fresh interpreter after the command ran, not timed (``bench/cli_latency.py`` times
them; BENCHMARKS.md has its figures)."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy.orm import Session

from daemon.cli.parser import Handler, build_parser
from storage import queries, tables
from storage.models import Base, CheckpointState, JobState
from storage.queries.claims import ClaimedJob
from tests.harness import evald, upgraded, write_config, write_dataset

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
#: What a command that logs nothing never imports: logging's libraries (structlog brings rich, pygments and
#: asyncio), and the resource probe (psutil) where no threshold is set.
NO_LOGGING = ("structlog", "rich", "pygments", "psutil")
#: ``--help`` and a usage error: none of the above, nor the database, the config's models or logging.
NEVER_FOR_HELP = (*NEVER_TO_READ, *NO_LOGGING, "sqlalchemy", "pydantic", "daemon.config")
#: The config's models: ``results`` reads ``[database] url`` alone (daemon.config.database_url).
CONFIG_MODELS = (
    "pydantic",
    "daemon.config.model",
    "daemon.config.loader",
    "daemon.config.database",
    "daemon.config.runs",
    "daemon.config.tasks",
    "inference",
)

#: How many modules each command may load, a fresh interpreter's ~70 included: measured, plus a margin
#: for a library's patch release. A command that starts importing what it does not need (a view's
#: config models, logging, the ORM of another command) crosses it; raise it only with the reason.
#: Measured 2026-12-06: ``--help`` 128, ``results`` 348, ``status`` 506 (before issue 43's second round:
#: 128, 638, 657).
CEILING = {"help": 140, "results": 380, "status": 545}
#: ``results`` reads with SQLAlchemy's core (storage.tables): neither the ORM nor the models.
NO_ORM = ("sqlalchemy.orm", "storage.models")


def loaded(tmp_path: Path, *argv: str) -> tuple[int, set[str]]:
    out = tmp_path / "modules.json"
    subprocess.run([sys.executable, "-c", DRIVER, str(out), *argv], check=True, capture_output=True)
    found = json.loads(out.read_text(encoding="utf-8"))
    return found["code"], set(found["modules"])


def under(modules: set[str], *roots: str) -> list[str]:
    """The modules that are one of ``roots`` or inside one."""
    return sorted(m for m in modules if any(m == r or m.startswith(f"{r}.") for r in roots))


def _claimed_job(s: Session, root: Path) -> ClaimedJob:
    """Run ``toy``'s ``step_5`` recorded ready under ``root``, its ``arith`` job claimed by ``h:1``."""
    run_id = queries.ensure_run(s, "toy", str(root / "run"))
    checkpoint = queries.record_checkpoint(
        s,
        run_id=run_id,
        path=str(root / "run" / "step_5"),
        name="step_5",
        step=5,
        epoch=None,
        layout="hf",
        state=CheckpointState.READY,
    )
    queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=5, tasks=["arith"])
    job = queries.claim_next_job(s, "h:1")
    assert job is not None
    return job


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database at the current schema with one evaluated checkpoint, and its config."""
    tmp = tmp_path_factory.mktemp("cli-imports")
    url = f"sqlite:///{tmp / 'evald.db'}"
    database = upgraded(url)
    try:
        with database.session() as s:
            job = _claimed_job(s, tmp)
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
    assert len(modules) <= CEILING["help"], len(modules)


def test_results_reads_the_revision_without_alembic(tmp_path: Path, config: Path) -> None:
    code, modules = loaded(tmp_path, "--config", str(config), "results", "--run", "toy")
    assert code == 0
    assert under(modules, *NEVER_TO_READ, *NEVER_ON_SQLITE, *NO_LOGGING, *CONFIG_MODELS, *NO_ORM) == []
    assert "storage.schema" in modules and "storage.migrations" not in modules
    # Nor the daemon's loop, its workers or the other commands.
    assert under(modules, "daemon.service", "daemon.running", "daemon.watching", "daemon.web") == []
    assert under(modules, "daemon.cli") == [
        "daemon.cli",
        "daemon.cli.base",
        "daemon.cli.lazy_logging",
        "daemon.cli.parser",
        "daemon.cli.results",
    ]
    # Of the views, the results table alone; of the statements, the results' and what they name.
    assert under(modules, "daemon.analysis.report") == [
        "daemon.analysis.report",
        "daemon.analysis.report.cells",
        "daemon.analysis.report.result_rows",
    ]
    assert under(modules, "storage.queries") == [
        "storage.queries",
        "storage.queries.filters",
        "storage.queries.results",
    ]
    assert len(modules) <= CEILING["results"], len(modules)


def test_status_reads_the_revision_without_alembic(tmp_path: Path, config: Path) -> None:
    code, modules = loaded(tmp_path, "--config", str(config), "status")
    assert code == 0
    assert under(modules, *NEVER_TO_READ, *NEVER_ON_SQLITE, *NO_LOGGING) == []
    # With no resource threshold set and the local executor, neither the daemon's loop nor its executors:
    # no probe to build, no Slurm queue to read. (The scheduling policy that the runs' status shares with
    # the planner reads daemon.watching's run model, without discovery.)
    assert under(modules, "daemon.service", "daemon.running", "daemon.web") == []
    assert under(modules, "daemon.watching") == [
        "daemon.watching",
        "daemon.watching.refusals",
        "daemon.watching.runs",
    ]
    assert len(modules) <= CEILING["status"], len(modules)


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


#: The packages whose names are imported from their modules when first asked for.
LAZY_PACKAGES = ("daemon.analysis.report", "daemon.config", "daemon.watching", "storage.queries")


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_a_lazy_package_gives_every_name_it_lists(name: str) -> None:
    """Its ``__all__``, its table of homes and its type-checking imports name the same things, and each
    name is the object its module defines (a name moved without its entry fails here, not in a user's
    command)."""
    package = importlib.import_module(name)
    homes: dict[str, str] = package._HOMES
    assert sorted(package.__all__) == sorted(homes)
    for attribute, home in homes.items():
        module: ModuleType = importlib.import_module(f"{name}.{home}")
        assert getattr(package, attribute) is getattr(module, attribute), attribute
        assert attribute in dir(package)
    tree = ast.parse(Path(package.__file__ or "").read_text(encoding="utf-8"))
    [block] = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    typed = {
        alias.name: (node.module or "").removeprefix(f"{name}.")
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == homes
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = package.no_such_name


def test_a_command_that_logs_configures_logging_when_it_imports_it(tmp_path: Path) -> None:
    """``evald retry`` logs ``job.retry_queued``: structlog, imported by the command's module, is configured
    as it is imported (daemon.cli.lazy_logging), so the event is a JSON line on stderr and stdout holds
    the command's table alone (structlog's default would have printed it to stdout)."""
    url = f"sqlite:///{tmp_path / 'evald.db'}"
    database = upgraded(url)
    try:
        with database.session() as s:
            job = _claimed_job(s, tmp_path)
            queries.fail_job(s, job_id=job.id, owner="h:1", kind="crash", error="boom", duration_s=1.0)
            assert queries.job_state(s, job.id) == JobState.FAILED
    finally:
        database.dispose()
    config = write_config(tmp_path, url, dataset=write_dataset(tmp_path / "arith.jsonl", 5))
    done = evald("--config", str(config), "retry", str(job.id))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("1 job(s) queued again")
    assert "retry_queued" not in done.stdout
    [event] = [json.loads(line) for line in done.stderr.splitlines()]
    assert event["event"] == "job.retry_queued" and event["job_id"] == job.id and event["level"] == "info"


@pytest.mark.parametrize("table", sorted(tables.TABLES))
def test_the_core_tables_name_the_models_columns(table: str) -> None:
    """Each column the ORM-free reads name (storage.tables) is the model's column of that name, read with
    the same type (MetricFloat's NaN, UTCDateTime's zone), so both ways of reading give the same values."""
    model = Base.metadata.tables[table]
    for light in tables.TABLES[table].columns:
        assert light.name in model.columns, f"{table}.{light.name}"
        theirs = model.columns[light.name].type
        if light.name == "state":
            # The models' states are enums kept as strings; read as strings, each equals its StrEnum.
            assert theirs.python_type is str or issubclass(theirs.python_type, str)
        else:
            assert type(light.type) is type(theirs), f"{table}.{light.name}: {light.type!r} {theirs!r}"
