"""The commands that only read what is stored (``results``, ``samples``, ``history``, ``alerts``, ``compare``,
``retry``) read ``[database] url`` alone (:mod:`daemon.config.database_url`), without the config's models:
the URL they open is the one the whole config validates to, whatever the file and environment say, and a
problem elsewhere in the file is left to ``evald config check`` and the daemon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.cli import main
from daemon.config import load_config
from daemon.config.database_url import read_url
from daemon.errors import ConfigError
from tests.harness import write_config, write_dataset
from tests.test_cli import _stored

REST = """
[[runs]]
name = "toy"
root = "run"

[[tasks]]
name = "arith"
dataset = "arith.jsonl"
prompt_field = "problem"
id_field = "id"
"""


def _config(folder: Path, database: str) -> Path:
    """A valid config whose ``[database]`` table is ``database`` (TOML, or empty for none)."""
    (folder / "run").mkdir(exist_ok=True)
    if not (folder / "arith.jsonl").exists():
        write_dataset(folder / "arith.jsonl", 2)
    path = folder / "evald.toml"
    path.write_text(f"{database}\n{REST}", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("database", "environ", "expected"),
    [
        ("", {}, "sqlite:///{folder}/evald.db"),
        ('[database]\nurl = "sqlite:///data/e.db"', {}, "sqlite:///{folder}/data/e.db"),
        ('[database]\nurl = "sqlite:///../e.db"', {}, "sqlite:///{parent}/e.db"),
        ('[database]\nurl = "sqlite:////abs/e.db"', {}, "sqlite:////abs/e.db"),
        ('[database]\nurl = "sqlite:///:memory:"', {}, "sqlite:///:memory:"),
        ('[database]\nurl = "postgresql://u:p@db/evald"', {}, "postgresql://u:p@db/evald"),
        ("[database]\nstart_timeout_secs = 5", {}, "sqlite:///{folder}/evald.db"),
        (
            '[database]\nurl = "sqlite:///file.db"',
            {"EVALD_DATABASE_URL": "sqlite:///env.db"},
            "sqlite:///{folder}/env.db",
        ),
    ],
)
def test_the_url_read_alone_is_the_one_the_config_validates_to(
    tmp_path: Path, database: str, environ: dict[str, str], expected: str
) -> None:
    path = _config(tmp_path, database)
    url = expected.format(folder=tmp_path, parent=tmp_path.parent)
    assert read_url(path, environ) == url
    assert load_config(path, environ).database.url == url


# Each example validates a whole config: fewer of them, and no deadline a loaded machine could miss.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(st.text(alphabet="abc_.-é ", min_size=1, max_size=6), min_size=1, max_size=3),
    absolute=st.booleans(),
    from_env=st.booleans(),
)
def test_any_sqlite_path_reads_alike_both_ways(
    tmp_path_factory: pytest.TempPathFactory, parts: list[str], absolute: bool, from_env: bool
) -> None:
    folder = tmp_path_factory.mktemp("url")
    url = "sqlite:///" + ("/" if absolute else "") + "/".join(parts)
    database = "" if from_env else f"[database]\nurl = {json.dumps(url)}"
    environ = {"EVALD_DATABASE_URL": url} if from_env else {}
    path = _config(folder, database)
    assert read_url(path, environ) == load_config(path, environ).database.url


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[database]\nurl = 5", "database.url: must be a string (sqlite:///FILE or postgresql://...)"),
        ('database = "sqlite:///e.db"', "database: must be a table ([database])"),
        ("[database\n", "not valid TOML: "),
    ],
)
def test_a_url_that_cannot_be_read_is_named(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "evald.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        read_url(path, {})
    [said] = refused.value.problems
    assert refused.value.source == str(path) and said.startswith(problem)


def test_results_answer_while_another_section_is_broken(
    tmp_path: Path, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task's dataset gone: ``status`` (which reads the runs and tasks) refuses naming it, ``results``
    still reads what is stored; ``config check`` is where the whole file is checked."""
    _stored(sqlite_url).dispose()
    dataset = write_dataset(tmp_path / "arith.jsonl", 2)
    path = str(write_config(tmp_path, sqlite_url, dataset=dataset))
    dataset.unlink()
    assert main(["--config", path, "results", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("toy,step_5,5,")
    assert main(["--config", path, "status"]) == 2
    assert f"tasks[0].dataset: file not found: {dataset}" in capsys.readouterr().err
