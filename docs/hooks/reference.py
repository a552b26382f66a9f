"""The reference pages, generated from the code each time the site is built (a mkdocs hook).

Nothing generated is committed: ``on_files`` adds the pages to the build, so the config fields, CLI
options, metrics, anomaly rules and log events a reader sees are the ones the code has now. The hook
imports only stable public names (``daemon.config.Config``, ``daemon.cli.build_parser``,
``inference.metrics``) and finds the rest by reading the source with ``ast``, so packages moving about
inside ``daemon/`` do not break the build.

BENCHMARKS.md and RELIABILITY.md stay at the repository's root, where the bench and reliability tools
write them; they are added to the site as they are.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import importlib
import inspect
import json
import os
import re
import textwrap
import types
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[2]
#: The packages whose source is scanned for log events and rules: the product, not its tests or tools.
PACKAGES = ("daemon", "inference", "storage")
#: Files kept at the repository's root (tools write them there) and shown on the site as they are.
ROOT_PAGES = {"benchmarks.md": "BENCHMARKS.md", "reliability.md": "RELIABILITY.md"}
LEVELS = ("debug", "info", "warning", "warn", "error", "exception", "critical")
EVENT_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
GENERATED = (
    "<!-- Generated from the code by docs/hooks/reference.py at build time: edit the code, not this. -->"
)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for uri, text in pages().items():
        files.append(File.generated(config, uri, content=text))
    for uri, name in ROOT_PAGES.items():
        files.append(File.generated(config, uri, content=(ROOT / name).read_text(encoding="utf-8")))
    return files


def pages() -> dict[str, str]:
    """Each generated page's path under docs/ → its markdown."""
    return {
        "reference/config.md": config_page(),
        "reference/cli.md": cli_page(),
        "reference/metrics.md": metrics_page(),
        "reference/anomaly.md": anomaly_page(),
        "reference/events.md": events_page(),
    }


# --- text helpers ------------------------------------------------------------------------------------------

_ROLE = re.compile(r":(?:class|data|func|meth|attr|mod|obj|exc):`~?([^`]+)`")


def rst_to_md(text: str) -> str:
    """Docstrings and ``#:`` comments are written in reST; the pages are markdown."""
    text = _ROLE.sub(r"`\1`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def paragraphs(doc: str | None) -> str:
    return rst_to_md(inspect.cleandoc(doc)) if doc else ""


def first_paragraph(doc: str | None) -> str:
    return paragraphs(doc).split("\n\n", 1)[0].replace("\n", " ")


def cell(text: str) -> str:
    """One table cell: on one line, and a ``|`` outside a code span does not end it."""
    parts = re.split(r"(`[^`]*`)", text.replace("\n", " "))
    # Outside code spans ``|`` would end the cell and ``<run>`` would be read as an HTML tag (``OUT/<run>/``
    # showed as ``OUT//``).
    escapes = {"|": "&#124;", "<": "&lt;", ">": "&gt;"}
    return "".join(p if p.startswith("`") else "".join(escapes.get(c, c) for c in p) for p in parts).strip()


def code(text: str) -> str:
    ticks = "``" if "`" in text else "`"
    pad = " " if ticks == "``" else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def table(header: tuple[str, ...], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# --- source comments ---------------------------------------------------------------------------------------


def attribute_docs(cls: type) -> dict[str, str]:
    """Each attribute's ``#:`` comment (the lines right above it) or docstring (the string right after it),
    for the class and its bases: the models document their fields that way, not with ``description=``."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ in {"builtins", "typing"} or klass.__module__.startswith("pydantic"):
            continue
        try:
            lines, _ = inspect.getsourcelines(klass)
        except (OSError, TypeError):
            continue
        source = textwrap.dedent("".join(lines))
        body = ast.parse(source).body[0]
        if not isinstance(body, ast.ClassDef):
            continue
        text = source.splitlines()
        statements = body.body
        for i, node in enumerate(statements):
            if not isinstance(node, ast.AnnAssign | ast.Assign):
                continue
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if not names:
                continue
            comment: list[str] = []
            row = node.lineno - 2
            while row >= 0 and text[row].strip().startswith("#:"):
                comment.insert(0, text[row].strip()[2:].strip())
                row -= 1
            after = statements[i + 1] if i + 1 < len(statements) else None
            if (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                comment = [inspect.cleandoc(after.value.value)]
            if comment:
                docs[names[0]] = rst_to_md(" ".join(comment))
    return docs


# --- config ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Section:
    """One TOML table of the config: its header (``[runs.adaptive]``) and the model that validates it."""

    header: str
    model: type[BaseModel]
    anchor: str


def _model_of(annotation: Any) -> tuple[type[BaseModel], str] | None:
    """The model a field holds, and how: ``table``, ``array`` (``[[x]]``) or ``map`` (``[x.NAME]``)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _model_of(args[0])
    if origin in (Union, types.UnionType):
        found = [m for m in (_model_of(a) for a in args if a is not type(None)) if m is not None]
        return found[0] if len(found) == 1 else None
    if origin is tuple and args and _is_model(args[0]):
        return args[0], "array"
    if origin in (dict, Mapping) and len(args) == 2 and _is_model(args[1]):
        return args[1], "map"
    if _is_model(annotation):
        return annotation, "table"
    return None


def _is_model(value: Any) -> bool:
    return inspect.isclass(value) and issubclass(value, BaseModel)


def sections(model: type[BaseModel], path: str = "") -> Iterator[tuple[str, Section]]:
    """Every table of the config, depth first, keyed by its dotted path."""
    for name, field in model.model_fields.items():
        held = _model_of(field.annotation)
        if held is None:
            continue
        inner, how = held
        dotted = f"{path}.{name}" if path else name
        if how == "array":
            header = f"[[{dotted}]]"
        elif how == "map":
            dotted = f"{dotted}.NAME"
            header = f"[{dotted}]"
        else:
            header = f"[{dotted}]"
        yield (
            dotted,
            Section(header, inner, "config-" + re.sub(r"[^a-z0-9]+", "-", dotted.lower()).strip("-")),
        )
        yield from sections(inner, dotted)


def type_name(annotation: Any, links: Mapping[type, Section]) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "unset"
    if origin is Annotated:
        written = [m.form for m in args[1:] if isinstance(getattr(m, "form", None), str)]
        return written[0] if written else type_name(args[0], links)
    if origin is Literal:
        return (
            "one of " + ", ".join(code(json.dumps(a)) for a in args)
            if len(args) > 1
            else code(json.dumps(args[0]))
        )
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a, links) for a in args if a is not type(None))
    if origin is tuple:
        return f"list of {type_name(args[0], links)}" if args else "list"
    if origin in (dict, Mapping):
        return f"table of {type_name(args[1], links)}" if len(args) == 2 else "table"
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(code(json.dumps(m.value)) for m in annotation)
    if annotation in links:
        section = links[annotation]
        return f"table: [`{section.header}`](#{section.anchor})"
    simple = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}
    if annotation in simple:
        return simple[annotation]
    return getattr(annotation, "__name__", str(annotation))


def constraints(field: FieldInfo) -> str:
    found: list[str] = []
    symbols = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    low = high = pattern = None
    for item in field.metadata:
        for attr, symbol in symbols.items():
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{symbol} {value}")
        low = getattr(item, "min_length", None) or low
        high = getattr(item, "max_length", None) or high
        pattern = getattr(item, "pattern", None) or pattern
    if high is not None:
        found.append(f"{low or 0} to {high} long")
    elif low is not None:
        found.append(f"at least {low} long")
    if pattern is not None:
        found.append(f"matches {code(str(pattern))}")
    return ", ".join(found)


def toml_value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "its defaults"
    if isinstance(value, enum.Enum):
        return code(json.dumps(value.value))
    if isinstance(value, bool):
        return code("true" if value else "false")
    if isinstance(value, str | Path):
        return code(json.dumps(str(value)))
    if isinstance(value, tuple | list):
        return code(json.dumps([v.value if isinstance(v, enum.Enum) else v for v in value], default=str))
    if isinstance(value, dict):
        return code(json.dumps(value, default=str)) if value else code("{}")
    return code(repr(value))


def default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        factory: Callable[[], Any] = field.default_factory  # type: ignore[assignment]
        return toml_value(factory())
    if field.default is PydanticUndefined:
        return "**required**"
    return toml_value(field.default)


def config_rows(model: type[BaseModel], links: Mapping[type, Section]) -> list[tuple[str, str, str, str]]:
    docs = attribute_docs(model)
    rows = []
    for name, field in model.model_fields.items():
        kind = type_name(field.annotation, links)
        limits = constraints(field)
        doc = field.description or docs.get(name, "")
        held = _model_of(field.annotation)
        if not doc and held is not None:
            doc = first_paragraph(held[0].__dict__.get("__doc__"))
        rows.append((code(name), f"{kind}, {limits}" if limits else kind, default(field), doc))
    return rows


def config_page() -> str:
    config_module = importlib.import_module("daemon.config")
    model: type[BaseModel] = config_module.Config
    found = dict(sections(model))
    links = {s.model: s for s in found.values()}
    sections_env = (
        ", ".join(
            f"`[{name}]`" for name in (module_strings("ENV_SECTIONS") or module_strings("_ENV_SECTIONS"))
        )
        or "the sections"
    )
    out = [
        GENERATED,
        "# Config reference",
        "",
        "Every table and field of the TOML config file, read from the models that validate it. A field not "
        "listed here is an error; every problem is reported with its path in the file "
        "(`tasks[1].dataset: file not found: ...`), all of them at once, by `evald config check FILE` and "
        "at the daemon's start and reload. Relative paths are relative to the config file.",
        "",
        f"Any scalar field of {sections_env} can come from the environment as `EVALD_<SECTION>_<FIELD>`, "
        "e.g. `EVALD_DATABASE_URL=postgresql://evald:secret@db/evald`: keep secrets there (systemd's "
        "`EnvironmentFile=`) rather than in the file.",
        "",
        "## Top level {#config-top-level}",
        "",
        table(("field", "type", "default", "what"), config_rows(model, links)),
    ]
    for section in found.values():
        out += ["", f"## `{section.header}` {{#{section.anchor}}}", ""]
        doc = section.model.__dict__.get("__doc__")
        if doc:
            out += [paragraphs(doc), ""]
        out.append(table(("field", "type", "default", "what"), config_rows(section.model, links)))
    return "\n".join(out) + "\n"


# --- CLI ---------------------------------------------------------------------------------------------------


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("evald",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """Every command and subcommand, depth first, with its one-line help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, helps.get(name) or sub.description or ""
                yield from commands(sub, (*path, name))


def _argument(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return " | ".join(str(c) for c in action.choices)
    if action.metavar is not None:
        return str(action.metavar)
    return action.dest.upper() if action.option_strings else action.dest


def option_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str, str]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        names = ", ".join(action.option_strings) or action.dest
        shown = action.default not in (None, False, argparse.SUPPRESS) and action.nargs != 0
        given = code(repr(action.default)) if shown else ""
        if action.required and action.option_strings:
            given = "**required**"
        repeat = " (repeatable)" if isinstance(action, argparse._AppendAction) else ""
        rows.append(
            (
                code(names),
                code(_argument(action)) if _argument(action) else "",
                given,
                (action.help or "") + repeat,
            )
        )
    return rows


def cli_page() -> str:
    build_parser: Callable[[], argparse.ArgumentParser] = importlib.import_module("daemon.cli").build_parser
    # argparse wraps usage to the terminal's width: a fixed one keeps the page the same wherever it is built.
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        parser = build_parser()
        out = [
            GENERATED,
            "# CLI reference",
            "",
            "Every command and option of `evald`, read from its argument parser. `--config` goes before the "
            "command (`evald --config evald.toml status`) and defaults to `$EVALD_CONFIG`, then "
            "`./evald.toml`. Bad input ends with one line per problem on stderr and a non-zero exit (2 for "
            "the config, 1 for everything else).",
            "",
            "## evald {#evald}",
            "",
            parser.description or "",
            "",
            "```text",
            parser.format_usage().strip(),
            "```",
            "",
            table(("option", "argument", "default", "what"), option_rows(parser)),
        ]
        listing = [(" ".join(path), helptext) for path, _, helptext in commands(parser)]
        out += ["", "| command | what |", "|---|---|"]
        out += [f"| [`{name}`](#{_cli_anchor(name)}) | {cell(helptext)} |" for name, helptext in listing]
        for path, sub, helptext in commands(parser):
            name = " ".join(path)
            out += ["", f"## {name} {{#{_cli_anchor(name)}}}", "", helptext, "", "```text"]
            out += [sub.format_usage().strip(), "```"]
            rows = option_rows(sub)
            if rows:
                out += ["", table(("option", "argument", "default", "what"), rows)]
        return "\n".join(out) + "\n"
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _cli_anchor(name: str) -> str:
    return name.replace(" ", "-")


# --- metrics -----------------------------------------------------------------------------------------------


def _direction(higher: bool | None) -> str:
    return {True: "higher", False: "lower", None: "none"}[higher]


def metrics_page() -> str:
    metrics = importlib.import_module("inference.metrics")
    rows = []
    for name, m in sorted(metrics.METRICS.items()):
        rows.append((code(name), m.description, _direction(m.higher_is_better), ", ".join(sorted(m.kinds))))
    # The parametrised families: K comes from the name, so the registry holds no instance of them.
    for family in ("pass", "maj"):
        m = metrics.metric(f"{family}@1")
        text = f"{m.description}; K from 1 to the task's `n_samples`"
        rows.append((code(f"{family}@K"), text, _direction(m.higher_is_better), ", ".join(sorted(m.kinds))))
    defaults = [(code(kind), ", ".join(code(n) for n in names) or "every metric lm-eval reports")
                for kind, names in metrics.DEFAULT_METRICS.items()]  # fmt: skip
    out = [
        GENERATED,
        "# Metrics reference",
        "",
        paragraphs(metrics.__doc__).split("\n\nAdd a metric", 1)[0],
        "",
        '`direction` is which way is better, what "new best" and "regression" mean to the detectors and '
        "the dashboard (`[alerts] directions` overrides it); `kinds` are the task kinds a metric applies to. "
        "How each metric's standard error is computed is in [Metrics and standard errors]"
        "(../concepts/metrics.md).",
        "",
        "## Every metric",
        "",
        table(("metric", "what", "direction", "kinds"), rows),
        "",
        "## Defaults by task kind",
        "",
        "A task that lists no `metrics` gets these.",
        "",
        table(("kind", "metrics"), defaults),
        "",
    ]
    return "\n".join(out)


# --- anomaly rules -----------------------------------------------------------------------------------------


def _python_files(package: str) -> Iterator[Path]:
    yield from sorted((ROOT / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _anomaly_package() -> Path:
    """The folder of the module that defines ``Finding``, the detectors' result: found by reading, so the
    page follows the package wherever it moves."""
    for path in _python_files("daemon"):
        if "class Finding" not in path.read_text(encoding="utf-8"):
            continue
        tree = _parsed(path)
        if any(isinstance(n, ast.ClassDef) and n.name == "Finding" for n in tree.body):
            return path.parent
    raise RuntimeError("no module under daemon/ defines class Finding")


def _severity(node: ast.expr | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.IfExp):
        return f"{_severity(node.body)} or {_severity(node.orelse)}, by size"
    return "varies"


@dataclasses.dataclass
class Rule:
    name: str
    severity: str
    doc: str
    module: str


def anomaly_rules() -> list[Rule]:
    """Every rule a detector names in a ``Finding(rule=...)``, or as the first argument of a helper that
    builds one. Its description is the docstring of the function named after it: a rule without one fails
    the build (its module's docstring, shown instead, described the module)."""
    rules: dict[str, Rule] = {}
    for path in sorted(_anomaly_package().glob("*.py")):
        tree = _parsed(path)
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        named = {f.name: first_paragraph(ast.get_docstring(f)) for f in functions}
        # A helper that builds the Finding may fix its severity itself (shift's ``_finding``).
        fixed = {f.name: s for f in functions for s in [_built_severity(f)] if s is not None}
        parameters = {f.name: [a.arg for a in f.args.args] for f in functions if _builds_finding(f)}
        for function in functions:
            for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
                callee = call.func.id if isinstance(call.func, ast.Name) else ""
                if callee != "Finding" and callee not in parameters:
                    continue
                keywords = {k.arg: k.value for k in call.keywords}
                name = keywords.get("rule") or (call.args[0] if call.args else None)
                if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                    continue
                given = keywords.get("severity")
                takes = parameters.get(callee, [])
                if given is None and "severity" in takes and takes.index("severity") < len(call.args):
                    given = call.args[takes.index("severity")]
                severity = _severity(given) if given is not None else fixed.get(callee, "varies")
                doc = named.get(name.value)
                if not doc:
                    raise ValueError(
                        f"anomaly rule {name.value!r} ({path.name}) has no function {name.value}() with a "
                        "docstring: the reference describes each rule by it"
                    )
                rules.setdefault(name.value, Rule(name.value, severity, doc, _module_name(path)))
    return sorted(rules.values(), key=lambda r: r.name)


def _builds_finding(function: ast.FunctionDef) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Finding"
        for n in ast.walk(function)
    )


def _built_severity(function: ast.FunctionDef) -> str | None:
    for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
        if isinstance(call.func, ast.Name) and call.func.id == "Finding":
            for keyword in call.keywords:
                if keyword.arg == "severity" and not isinstance(keyword.value, ast.Name):
                    return _severity(keyword.value)
    return None


def module_strings(name: str) -> list[str]:
    """The strings of a module-level constant called ``name`` (a tuple or set of names), wherever in the
    product's source it is defined: private names are read, not imported, so they may move."""
    for package in PACKAGES:
        for path in _python_files(package):
            text = path.read_text(encoding="utf-8")
            if name not in text:
                continue
            for node in ast.parse(text, filename=str(path)).body:
                targets: list[ast.expr]
                if isinstance(node, ast.AnnAssign) and node.value is not None:
                    targets, value = [node.target], node.value
                elif isinstance(node, ast.Assign):
                    targets, value = node.targets, node.value
                else:
                    continue
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return [
                        n.value
                        for n in ast.walk(value)
                        if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    ]
    return []


def anomaly_page() -> str:
    package = _anomaly_package()
    module = importlib.import_module(_module_name(package / "__init__.py"))
    settings = module.Settings
    docs = attribute_docs(settings)
    setting_rows = [
        (code(f.name), toml_value(f.default), docs.get(f.name, "")) for f in dataclasses.fields(settings)
    ]
    rule_rows = [(code(r.name), r.severity, r.doc, code(r.module)) for r in anomaly_rules()]
    events = ", ".join(code(r) for r in sorted(module_strings("OPERATIONAL_RULES")))
    out = [
        GENERATED,
        "# Anomaly rules reference",
        "",
        paragraphs(module.__doc__),
        "",
        "How the rules work together, and what an alert does next, is in "
        "[Anomalies and alerts](../concepts/alerts.md).",
        "",
        "## Rules over metric series",
        "",
        table(("rule", "severity", "what", "module"), rule_rows),
        "",
        "## Rules over the daemon's own events",
        "",
        f"Raised without a metric, from what happened to a job: {events}.",
        "",
        "## Detector settings {#detector-settings}",
        "",
        "The defaults; `[alerts] detectors = { z_threshold = 5.0, ... }` sets any of them.",
        "",
        table(("setting", "default", "what"), setting_rows),
        "",
    ]
    return "\n".join(out)


# --- log events --------------------------------------------------------------------------------------------


def log_events() -> dict[str, dict[str, set[str]]]:
    """Event name → {"levels": ..., "modules": ...}: every ``log.<level>("name.dotted", ...)`` call on a
    structlog logger in the product's source; every call whose event is a variable given dotted names in
    that module (``event = "job.retrying" if retry else "job.failed"``); and every dotted name handed to a
    function that logs its ``event`` parameter (``errors.failed("daemon.pass_failed", exc)``)."""
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: {"levels": set(), "modules": set()})

    def note(name: str, level: str, path: Path) -> None:
        found[name]["levels"].add({"warn": "warning"}.get(level, level))
        found[name]["modules"].add(_module_name(path))

    trees = {
        path: ast.parse(text, filename=str(path))
        for package in PACKAGES
        for path in _python_files(package)
        for text in [path.read_text(encoding="utf-8")]
        if "structlog" in text or "event" in text
    }
    forwarders = _event_forwarders(trees.values())
    for path, tree in trees.items():
        named = _event_variables(tree)
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr in LEVELS and call.args:
                first = call.args[0]
                names = named.get(first.id, set()) if isinstance(first, ast.Name) else {_event(first)}
                for name in names - {None}:
                    note(str(name), func.attr, path)
            elif _callee(call) in forwarders:
                index, levels = forwarders[_callee(call)]
                given = {k.arg: k.value for k in call.keywords}
                event = _event(given.get("event") or (call.args[index] if index < len(call.args) else None))
                level = given.get("level")
                chosen = {str(level.value)} if isinstance(level, ast.Constant) else levels or {"varies"}
                for each in chosen if event is not None else ():
                    note(str(event), each, path)
    for path, tree in trees.items():
        # A forwarder's own default event (``event: str = "folder.ignored"``), at the levels it is called at.
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            pairs: list[tuple[ast.arg, ast.expr | None]] = [
                *zip(reversed(function.args.args), reversed(function.args.defaults), strict=False),
                *zip(function.args.kwonlyargs, function.args.kw_defaults, strict=True),
            ]
            for arg, value in pairs:
                default = _event(value)
                if arg.arg == "event" and default is not None:
                    for at in _called_levels(trees.values(), function.name) or {"varies"}:
                        note(default, at, path)
    return dict(found)


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _event(node: ast.AST | None) -> str | None:
    """The dotted event name ``node`` is a literal of, if it is one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and EVENT_NAME.match(node.value):
        return node.value
    return None


def _event_forwarders(trees: Iterable[ast.Module]) -> dict[str, tuple[int, set[str]]]:
    """Function name → (the position of its ``event`` argument in a call, the levels it logs it at), for
    every function that passes its ``event`` parameter on to a log call."""
    forwarders: dict[str, tuple[int, set[str]]] = {}
    for tree in trees:
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            names = [a.arg for a in function.args.args]
            if "event" not in names and "event" not in [a.arg for a in function.args.kwonlyargs]:
                continue
            levels: set[str] = set()
            forwarded = False
            chosen = _chosen_log_methods(function)
            for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
                first = call.args[0] if call.args else None
                if isinstance(first, ast.Name) and first.id == "event":
                    forwarded = True
                    if isinstance(call.func, ast.Attribute) and call.func.attr in LEVELS:
                        levels.add(call.func.attr)
                    elif isinstance(call.func, ast.Name):
                        levels |= chosen.get(call.func.id, set())
            if forwarded:
                bound = 1 if names and names[0] in {"self", "cls"} else 0
                index = names.index("event") - bound if "event" in names else 10**6
                forwarders[function.name] = (index, levels)
    return forwarders


def _chosen_log_methods(function: ast.FunctionDef) -> dict[str, set[str]]:
    """Variable → the log levels it may be bound to in ``function`` (``log_method = log.info if ready else
    log.warning``), so that a call through it is found at those levels."""
    chosen: dict[str, set[str]] = defaultdict(set)
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            chosen[node.targets[0].id] |= {
                n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute) and n.attr in LEVELS
            }
    return chosen


def _called_levels(trees: Iterable[ast.Module], name: str) -> set[str]:
    """The ``level=`` constants the calls to ``name`` pass."""
    return {
        str(k.value.value)
        for tree in trees
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and _callee(call) == name
        for k in call.keywords
        if k.arg == "level" and isinstance(k.value, ast.Constant)
    }


def _event_variables(tree: ast.Module) -> dict[str, set[str]]:
    """Variable → the dotted event names assigned to it anywhere in the module."""
    named: dict[str, set[str]] = defaultdict(set)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            named[node.targets[0].id] |= {
                e for v in ast.walk(node.value) for e in [_event(v)] if e is not None
            }
    return named


def events_page() -> str:
    events = log_events()
    order = {level: i for i, level in enumerate(LEVELS)}
    groups: dict[str, list[str]] = defaultdict(list)
    for name in sorted(events):
        groups[name.split(".", 1)[0]].append(name)
    out = [
        GENERATED,
        "# Log events reference",
        "",
        "evald logs structlog events, one JSON object a line (a terminal gets them coloured): `event` is "
        "one of the stable names below, with `level`, `timestamp` and the event's own keys. Libraries' "
        "records (psycopg, SQLAlchemy's pool, Python's `warnings`) and tracebacks Python prints itself are "
        "JSON lines too, with a `logger` field and the traceback in `exception`. `exception` below is an "
        "error logged with its traceback.",
        "",
        f"{len(events)} events, found in the source by `docs/hooks/reference.py`.",
    ]
    for prefix, names in groups.items():
        rows = [
            (
                code(name),
                ", ".join(sorted(events[name]["levels"], key=lambda level: order.get(level, len(order)))),
                ", ".join(code(m) for m in sorted(events[name]["modules"])),
            )
            for name in names
        ]
        out += ["", f"## {prefix}", "", table(("event", "level", "logged by"), rows)]
    return "\n".join(out) + "\n"
