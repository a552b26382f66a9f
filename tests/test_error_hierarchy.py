"""One hierarchy: every exception class defined in daemon/, inference/ and storage/ derives from
:class:`evald.errors.EvaldError` (so ``except EvaldError`` and the CLI's one-line report catch it), found by
walking the packages' source rather than from a list, and each is drawn in an ``errors.py`` docstring, whose
drawings name no class that is not there. Only :data:`OUTSIDE` may stay out, each with its reason.

Classes are found by reading the source (``ast``): a class is an exception when one of its bases is a
built-in exception, another exception class of these packages (through their imports and re-exports), or a
library's class whose name says it is one (``…Error``, ``…Exception``): importing every module to ask
Python would cost the libraries of every module (torch, transformers, Ray) for one test. The modules that
define exceptions are then imported, and Python itself checked: what it calls an exception there is what
the reading found, and each derives from ``EvaldError``."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from daemon.errors import EvaldError as ReExported
from evald.errors import EvaldError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("daemon", "evald", "inference", "storage")

#: Exception classes allowed outside the hierarchy, ``module.Class`` → why.
OUTSIDE = {
    "daemon.running.executors.ray_driver.Ended": (
        "runs on the Ray cluster as the job's entrypoint script, importing nothing but ray and the standard "
        "library; a control-flow signal the driver turns into exit.json, never raised in the daemon"
    ),
}

#: A library's base class taken for an exception by its name (its module is not imported to ask).
EXCEPTION_NAME = re.compile(r"\w*(Error|Exception|Warning|Exit|Interrupt)$")


@dataclass
class Module:
    name: str
    #: A name bound at the module's top level by an import → the dotted name it refers to.
    imports: dict[str, str] = field(default_factory=dict)
    #: A class defined at the top level → its bases, as dotted names (unresolved ones as written).
    classes: dict[str, list[str]] = field(default_factory=dict)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _read(path: Path) -> Module:
    module = Module(_module_name(path))
    package = module.name if path.name == "__init__.py" else module.name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                # ``import a.b as c`` binds c to a.b; ``import a.b`` binds a.
                bound = alias.name if alias.asname else alias.name.split(".")[0]
                module.imports[alias.asname or bound] = bound
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                module.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            module.classes[node.name] = [_dotted(base, module) for base in node.bases]
    return module


def _dotted(base: ast.expr, module: Module) -> str:
    """A base class's dotted name as the module's imports and classes bind it (``Generic[T]``: its
    ``Generic``)."""
    if isinstance(base, ast.Subscript):
        base = base.value
    written = ast.unparse(base)
    head, _, rest = written.partition(".")
    if head in module.classes:
        target = f"{module.name}.{head}"
    elif head in module.imports:
        target = module.imports[head]
    elif hasattr(builtins, head):
        target = f"builtins.{head}"
    else:
        target = head
    return f"{target}.{rest}" if rest else target


@cache
def modules() -> dict[str, Module]:
    found = [_read(path) for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    return {module.name: module for module in found}


def _resolved(name: str, seen: frozenset[str] = frozenset()) -> str:
    """``name`` followed through re-exports (``daemon.errors.EvaldError`` → ``evald.errors.EvaldError``)."""
    owner, _, attribute = name.rpartition(".")
    module = modules().get(owner)
    if module is None or attribute in module.classes or name in seen:
        return name
    target = module.imports.get(attribute)
    return name if target is None else _resolved(target, seen | {name})


def _ancestors(name: str) -> Iterator[str]:
    """``name`` and every class it derives from, as far as the source tells."""
    name = _resolved(name)
    yield name
    owner, _, attribute = name.rpartition(".")
    module = modules().get(owner)
    if module is not None and attribute in module.classes:
        for base in module.classes[attribute]:
            yield from _ancestors(base)


def _is_exception(name: str) -> bool:
    for ancestor in _ancestors(name):
        owner, _, attribute = ancestor.rpartition(".")
        if owner == "builtins":
            found = getattr(builtins, attribute, None)
            if isinstance(found, type) and issubclass(found, BaseException):
                return True
        elif owner.split(".")[0] not in PACKAGES and EXCEPTION_NAME.fullmatch(attribute):
            return True
    return False


@cache
def exception_classes() -> tuple[str, ...]:
    """``module.Class`` of every exception class the packages define at a module's top level."""
    return tuple(
        sorted(
            f"{module.name}.{name}"
            for module in modules().values()
            for name in module.classes
            if _is_exception(f"{module.name}.{name}")
        )
    )


def _class(qualified: str) -> type:
    owner, _, name = qualified.rpartition(".")
    found = getattr(importlib.import_module(owner), name)
    assert isinstance(found, type), qualified
    return found


def test_the_walk_finds_the_errors_of_every_package_and_nothing_else() -> None:
    """The reading's own check: known exceptions of each package, and known classes that are not."""
    found = set(exception_classes())
    assert {
        "evald.errors.EvaldError",
        "daemon.errors.ConfigError",
        "daemon.delivery.errors.SinkGone",
        "daemon.watching.objects.ObjectChanged",
        "inference.errors.InferenceError",
        "inference.layouts.base.TreeRefused",
        "inference.rewards.RewardFailed",
        "storage.errors.StorageError",
        "storage.queries.samples.SamplesUnavailable",
        "daemon.running.executors.ray_driver.Ended",
    } <= found
    assert not found & {"inference.spec.JobSpec", "storage.models.Run", "daemon.running.attempt.Attempt"}


def test_the_reading_agrees_with_python_where_the_errors_are_defined() -> None:
    """Every module that defines an exception (by the reading) imported: the classes Python calls
    exceptions there are exactly the ones the reading found."""
    read = {name for name in exception_classes() if name not in OUTSIDE}
    owners = {name.rpartition(".")[0] for name in read}
    live = set()
    for owner in owners:
        imported = importlib.import_module(owner)
        for name, value in vars(imported).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == owner:
                live.add(f"{owner}.{name}")
    assert live == read


@pytest.mark.parametrize("name", [n for n in exception_classes() if n not in OUTSIDE])
def test_every_exception_class_is_an_evald_error(name: str) -> None:
    assert issubclass(_class(name), EvaldError), f"{name} is outside the hierarchy: derive it from EvaldError"


def test_the_classes_left_out_are_there_and_out_for_their_reason() -> None:
    assert set(OUTSIDE) <= set(exception_classes()), "OUTSIDE names a class that is gone: drop it"
    for name, why in OUTSIDE.items():
        assert why.strip(), name
        assert not any(a.endswith(".EvaldError") for a in _ancestors(name)), f"{name} is in: drop it"
    # The Ray driver is copied to the cluster on its own: it imports nothing of evald.
    driver = modules()["daemon.running.executors.ray_driver"]
    assert not [t for t in driver.imports.values() if t.split(".")[0] in PACKAGES]


def test_the_daemon_re_exports_the_one_root() -> None:
    assert ReExported is EvaldError


# --- the drawings ---------------------------------------------------------------------------------------

#: A line of a drawing: the class, then the module it lives in where it is not its parent's (or, at the
#: top, the errors.py module's).
DRAWN = re.compile(r"[├└]── (\w+)\s*(?:((?:daemon|evald|inference|storage)(?:\.\w+)+):)?")


def drawn(errors_module: str) -> list[tuple[str, str]]:
    """(module, class) for each class ``errors_module``'s docstring draws; an indented class lives in its
    parent's module unless the line names another."""
    doc = importlib.import_module(errors_module).__doc__ or ""
    found: list[tuple[str, str]] = []
    #: The module of the class drawn last at each depth (the column of its ├ or └).
    at_depth: dict[int, str] = {}
    for line in doc.splitlines():
        match = DRAWN.search(line)
        if match is None:
            continue
        depth = match.start()
        parents = [module for column, module in at_depth.items() if column < depth]
        module = match.group(2) or (parents[-1] if parents else errors_module)
        at_depth = {column: m for column, m in at_depth.items() if column < depth} | {depth: module}
        found.append((module, match.group(1)))
    return found


def errors_modules() -> list[str]:
    return sorted(name for name in modules() if name.rpartition(".")[2] == "errors")


def every_drawn() -> list[tuple[str, str]]:
    return [pair for module in errors_modules() for pair in drawn(module)]


def test_each_package_has_an_errors_module_with_a_drawing() -> None:
    assert {m.split(".")[0] for m in errors_modules()} == set(PACKAGES)
    for module in errors_modules():
        assert drawn(module), f"{module}'s docstring draws no hierarchy"


def test_the_drawing_follows_the_tree() -> None:
    """The parser's own check: a nested class without a module of its own lives in its parent's."""
    assert ("daemon.running.executors.ray_client", "JobExists") in drawn("daemon.errors")
    assert ("daemon.watching.objects", "ObjectGone") in drawn("daemon.errors")
    assert ("daemon.delivery.sinks.mlflow_attach", "AttachFileError") in drawn("daemon.delivery.errors")
    assert ("inference.layouts.base", "TreeRefused") in drawn("inference.errors")
    assert ("inference.errors", "DatasetInvalid") in drawn("inference.errors")


@pytest.mark.parametrize(("module", "name"), every_drawn())
def test_every_drawn_error_is_there_and_an_evald_error(module: str, name: str) -> None:
    assert issubclass(_class(f"{module}.{name}"), EvaldError), f"{module}.{name}"


def test_every_exception_class_is_drawn() -> None:
    """A newcomer finds every error in an errors.py drawing: none is defined without being drawn."""
    drawings = {f"{module}.{name}" for module, name in every_drawn()}
    missing = set(exception_classes()) - drawings - set(OUTSIDE) - {"evald.errors.EvaldError"}
    assert missing == set(), "exception classes no errors.py docstring draws"


# --- other bases kept where callers catch them ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("daemon.running.executors.base.ExecutorError", RuntimeError),
        ("daemon.running.executors.base.ExecutorUnavailable", RuntimeError),
        ("daemon.running.executors.slurm_output.SlurmError", RuntimeError),
        ("daemon.errors.SmoothingError", ValueError),
    ],
)
def test_errors_callers_catch_by_another_base_keep_it(name: str, base: type) -> None:
    """Callers of the executors catch RuntimeError (ray_client's conversion of Ray's errors among them),
    and a smoothing spec's parser ValueError: joining the hierarchy does not take them out of it."""
    assert issubclass(_class(name), base)


def test_the_cli_reports_a_worker_and_a_database_error_as_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """InferenceError and StorageError reach the CLI's one ``except EvaldError``: one line, exit 1."""
    from daemon.cli import main
    from inference.errors import TaskInvalid
    from storage.errors import SchemaOutdated

    for error in (TaskInvalid("task 'x': bad\ntemplate"), SchemaOutdated("at 0001: run `evald db upgrade`")):

        def fail(_: object, error: Exception = error) -> int:
            raise error

        monkeypatch.setattr("daemon.cli.status.cmd_status", fail)
        assert main(["status"]) == 1
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line == f"evald: error: {' '.join(str(error).split())}"
