"""Config: validated once, every bad field named with its path, env overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config import Config, config_path, load_config
from daemon.errors import ConfigError

GOOD = """
[database]
url = "sqlite:///evald.db"

[[runs]]
name = "grpo-7b"
root = "runs/grpo"

[[tasks]]
name = "math"
dataset = "data/math.jsonl"
prompt_template = "Q: {prompt}\\nA:"
max_new_tokens = 64
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "math.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    path = tmp_path / "evald.toml"
    path.write_text(text)
    return path


def test_good_config_resolves_paths_beside_the_file(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, GOOD), environ={})
    assert isinstance(config, Config)
    assert config.database.url == f"sqlite:///{tmp_path / 'evald.db'}"
    assert config.runs[0].root == tmp_path / "runs" / "grpo"
    assert config.tasks[0].dataset == tmp_path / "data" / "math.jsonl"
    assert config.tasks_for(config.runs[0])[0].name == "math"
    assert config.daemon.state_dir == tmp_path / "state"


def test_every_bad_field_is_named_with_its_path(tmp_path: Path) -> None:
    bad = (
        GOOD
        + """
[[tasks]]
name = "aime"
dataset = "data/missing.jsonl"
max_new_tokens = 0
prompt_template = "{question}"

[scheduling]
quiet_secs = -1
quite = 3
"""
    )
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, bad), environ={})
    problems = info.value.problems
    assert f"tasks[1].dataset: file not found: {tmp_path / 'data' / 'missing.jsonl'}" in problems
    assert any(p.startswith("tasks[1].max_new_tokens: ") for p in problems)
    assert any(p.startswith("tasks[1].prompt_template: must be a format string") for p in problems)
    assert any(p.startswith("scheduling.quiet_secs: ") for p in problems)
    assert "scheduling.quite: unknown field" in problems
    assert len(problems) == 5


def test_cross_references_are_checked(tmp_path: Path) -> None:
    bad = GOOD.replace('root = "runs/grpo"', 'root = "runs/grpo"\ntasks = ["math", "gsm8k"]') + GOOD.split(
        "[[tasks]]"
    )[1].join(["[[tasks]]", ""])
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, bad), environ={})
    assert "tasks: duplicate name math" in info.value.problems
    assert "runs[0].tasks[1]: unknown task 'gsm8k' (defined: math)" in info.value.problems


def test_missing_sections_and_toml_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, "[database]\nurl = 'sqlite:///x.db'\n"), environ={})
    assert info.value.problems == ["runs: required field is missing", "tasks: required field is missing"]
    with pytest.raises(ConfigError, match=r"not valid TOML: .*line 2"):
        load_config(_write(tmp_path, "[database]\nurl = \n"), environ={})
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.toml", environ={})


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    env = {"EVALD_DATABASE_URL": "postgresql://evald@db.internal/evald", "EVALD_SCHEDULING_QUIET_SECS": "2.5"}
    config = load_config(path, environ=env)
    assert config.database.url == "postgresql://evald@db.internal/evald"
    assert config.scheduling.quiet_secs == 2.5
    with pytest.raises(ConfigError, match=r"scheduling\.quiet_secs"):
        load_config(path, environ={"EVALD_SCHEDULING_QUIET_SECS": "soon"})


def test_config_path_precedence() -> None:
    assert config_path("a.toml", {"EVALD_CONFIG": "b.toml"}) == Path("a.toml")
    assert config_path(None, {"EVALD_CONFIG": "b.toml"}) == Path("b.toml")
    assert config_path(None, {}) == Path("evald.toml")
