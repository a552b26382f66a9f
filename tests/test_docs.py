"""The docs site builds with ``mkdocs build --strict`` (a broken link or anchor fails it), and its generated
reference pages hold everything the code has: every config field, CLI command and option, metric, detector
setting and log event. What to look for is read from the code here, not from the generator, so a generator
that misses something fails."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from daemon.cli import build_parser
from daemon.config import Config
from inference.metrics import METRICS
from tests.deadlines import patient

ROOT = Path(__file__).resolve().parent.parent
#: A log call with a dotted event name as its first argument (the style every module follows).
LOG_CALL = re.compile(
    r"\blog\.(?:debug|info|warning|error|exception|critical)\(\s*\"([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+)\""
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=patient(300),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def page(site: Path, name: str) -> str:
    return (site / "reference" / name / "index.html").read_text(encoding="utf-8")


def models(annotation: Any) -> Iterator[type[BaseModel]]:
    """The models an annotation holds, at any depth (``tuple[RunConfig, ...]``, ``X | None``, ...)."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from models(arg)


def config_fields(model: type[BaseModel]) -> Iterator[str]:
    for name, field in model.model_fields.items():
        yield name
        for inner in models(field.annotation):
            yield from config_fields(inner)


def subcommands(parser: argparse.ArgumentParser, path: str = "evald") -> Iterator[tuple[str, list[str]]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                options = [s for a in sub._actions for s in a.option_strings if s not in {"-h", "--help"}]
                yield f"{path} {name}", options
                yield from subcommands(sub, f"{path} {name}")


def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    assert (site / "index.html").exists()
    for name in ("config", "cli", "metrics", "anomaly", "events"):
        assert (site / "reference" / name / "index.html").exists(), name
    for name in ("benchmarks", "reliability", "quick-start"):
        assert (site / name / "index.html").exists(), name


def test_every_config_field_is_documented(site: Path) -> None:
    html = page(site, "config")
    names = set(config_fields(Config))
    missing = sorted(n for n in names if f"<code>{n}</code>" not in html)
    assert not missing, missing
    assert len(names) > 100


def test_every_cli_command_and_option_is_documented(site: Path) -> None:
    html = page(site, "cli")
    found = list(subcommands(build_parser()))
    assert {"evald run", "evald config check", "evald export tensorboard"} <= {name for name, _ in found}
    for name, options in found:
        assert f'id="{name.replace(" ", "-")}"' in html, name
        for option in options:
            assert option in html, (name, option)


def test_every_metric_is_documented(site: Path) -> None:
    html = page(site, "metrics")
    for name in [*METRICS, "pass@K", "maj@K"]:
        assert f"<code>{name}</code>" in html, name


def test_every_detector_setting_and_known_rules_are_documented(site: Path) -> None:
    html = page(site, "anomaly")
    alerts: type[BaseModel] = Config.model_fields["alerts"].annotation  # type: ignore[assignment]
    settings = alerts().settings()  # type: ignore[attr-defined]
    for field in dataclasses.fields(settings):
        assert f"<code>{field.name}</code>" in html, field.name
    for rule in (
        "robust_z",
        "ewma",
        "cusum",
        "drop_from_best",
        "threshold",
        "non_finite",
        "entropy_collapse",
    ):
        assert f"<code>{rule}</code>" in html, rule


def test_every_log_event_is_documented(site: Path) -> None:
    html = page(site, "events")
    events = {
        match
        for package in ("daemon", "inference", "storage")
        for path in (ROOT / package).rglob("*.py")
        for match in LOG_CALL.findall(path.read_text(encoding="utf-8"))
    }
    assert {"job.started", "job.succeeded", "checkpoint.due", "db.unavailable"} <= events
    missing = sorted(e for e in events if f"<code>{e}</code>" not in html)
    assert not missing, missing
