"""The shape issue 33 asks of the code, held by the suite: every room of daemon/ has its place in the layers
that `lint-imports` checks (pyproject.toml), and no module grows past about 500 lines without saying why in
its first line. The layers themselves and the absence of import circles are `make lint`'s (import-linter)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("daemon", "inference", "storage")
#: Past this many lines a module must say in its first line why it is one file.
LONG = 500
#: The words that first line uses, so the reason can be found with grep.
LONG_REASON = "one file because"


def _contracts() -> list[dict[str, object]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return list(tomllib.load(f)["tool"]["importlinter"]["contracts"])


def _layered_names() -> set[str]:
    (rooms,) = [c for c in _contracts() if c["type"] == "layers" and "daemon.cli" in str(c["layers"])]
    names: set[str] = set()
    for layer in rooms["layers"]:  # type: ignore[attr-defined]
        for name in str(layer).strip("()").split("|"):
            names.add(name.strip())
    return names


def test_every_room_of_the_daemon_has_a_layer() -> None:
    """A module left loose at daemon/'s top would sit outside the layer contract, free to import anything."""
    layered = _layered_names()
    rooms = {
        f"daemon.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / "daemon").iterdir()
        if (p.is_file() and p.suffix == ".py" and p.stem not in {"__init__", "__main__"})
        or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert rooms - layered == set(), "daemon/ rooms missing from [tool.importlinter]'s layers"
    assert layered - rooms == set(), "layers naming no room of daemon/"


def _first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_says_what_it_is_for_and_long_ones_say_why(package: str) -> None:
    silent: list[str] = []
    long: list[str] = []
    for path in sorted((ROOT / package).rglob("*.py")):
        where = str(path.relative_to(ROOT))
        first = _first_line(path)
        if not first and path.name != "__init__.py":
            silent.append(where)
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > LONG and LONG_REASON not in first:
            long.append(f"{where} ({lines} lines)")
    assert silent == [], "modules whose first line does not say what they are for"
    assert long == [], f"modules over {LONG} lines whose first line does not say '{LONG_REASON} ...'"
