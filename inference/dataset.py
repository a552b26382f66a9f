"""Evaluation datasets: JSONL files, one object per line, read into typed items.

A row needs a prompt (``prompt_field``, or else the first of ``prompt``, ``question``, ``problem``) and a
reference answer (``answer_field``); its id is ``id_field``, else ``unique_id`` where the file's first row
has one (MATH500's ``test/precalculus/807.json``), else its line number. With a
``stratify_field`` every row needs that field too (a string or a number), and it becomes the item's stratum
for :func:`inference.sampling.stratified_subset`. The whole file is checked before anything is evaluated,
and every error names the file and line: ``data.jsonl:17: missing field 'answer'``. Blank lines are
skipped. A job skips bad rows and reports them (:func:`read_dataset`): one bad row never costs the
job; checks before a start reject them (:func:`load_dataset`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.errors import DatasetInvalid
from inference.spec import Problem

PROMPT_FIELDS = ("prompt", "question", "problem")
#: The id a dataset shape carries, taken when ``id_field`` is unset and the file's first row has it: ids
#: that name the problem survive a reordered or filtered file, line numbers do not.
ID_FIELD = "unique_id"
#: Longest id the database keeps (``samples.prompt_id``).
MAX_ID_CHARS = 200


@dataclass(frozen=True)
class Item:
    prompt_id: str
    prompt: str
    reference: str
    #: ``(field, value as text)`` for each stratify field the reader was asked for.
    strata: tuple[tuple[str, str], ...] = ()

    @property
    def stratum(self) -> str | None:
        """The value of the first stratify field; ``None`` when none was asked for."""
        return self.strata[0][1] if self.strata else None

    def stratum_of(self, field: str) -> str:
        return dict(self.strata)[field]


def _describe(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _text(row: dict[str, Any], field: str, where: str, *, numbers: bool) -> str:
    """Field ``field`` as non-empty text; ``numbers`` also takes an int or float (``"answer": 68``)."""
    if field not in row:
        raise DatasetInvalid(f"{where}: missing field {field!r}")
    value = row[field]
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        kinds = "a string or a number" if numbers else "a string"
        raise DatasetInvalid(f"{where}: field {field!r} must be {kinds}, got {_describe(value)}")
    if not value.strip():
        raise DatasetInvalid(f"{where}: empty field {field!r}")
    return value


def _stratum(row: dict[str, Any], field: str, where: str) -> str:
    # The setting is named too: the task's subset needs this field, not the dataset format.
    if field not in row:
        raise DatasetInvalid(f"{where}: missing field {field!r} (stratify_field)")
    return _text(row, field, where, numbers=True)


def _prompt_field(row: dict[str, Any], configured: str | None, where: str) -> str:
    if configured is not None:
        return configured
    for field in PROMPT_FIELDS:
        if field in row:
            return field
    names = ", ".join(repr(f) for f in PROMPT_FIELDS)
    raise DatasetInvalid(f"{where}: no prompt field (looked for {names}; set prompt_field to choose one)")


def _parse_line(raw: bytes, where: str) -> dict[str, Any] | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetInvalid(f"{where}: not UTF-8 (byte {exc.start + 1})") from exc
    if not text.strip():
        return None
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetInvalid(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from exc
    if not isinstance(row, dict):
        raise DatasetInvalid(f"{where}: expected a JSON object, got {_describe(row)}")
    return row


@dataclass(frozen=True)
class Dataset:
    items: tuple[Item, ...]
    #: Rows left out, each with its ``FILE:LINE`` and what is wrong.
    problems: tuple[Problem, ...] = ()


def _lines(path: Path) -> list[bytes]:
    try:
        return path.read_bytes().splitlines()
    except OSError as exc:
        raise DatasetInvalid(f"{path}: cannot read: {exc.strerror or exc}") from exc


def _no_rows(path: Path, problems: list[Problem]) -> DatasetInvalid:
    if not problems:
        return DatasetInvalid(f"{path}: no rows")
    shown = "; ".join(f"{p.where}: {p.message}" for p in problems[:3])
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return DatasetInvalid(f"{path}: no usable rows, all {len(problems)} are bad: {shown}{more}")


def read_dataset(
    path: Path,
    *,
    prompt_field: str | None = None,
    answer_field: str | None = "answer",
    id_field: str | None = None,
    limit: int | None = None,
    stratify_fields: Sequence[str] = (),
    strict: bool = False,
) -> Dataset:
    """Every good row of ``path`` (the first ``limit`` of them; all when ``None``), and every bad row before
    the last one taken, named by file and line. A bad row costs only itself; a file that cannot be read,
    or has no good row, is :class:`DatasetInvalid` (``strict``: the caller decides). With
    ``answer_field`` None rows need no answer (held-out text for likelihood) and the reference is empty;
    each of ``stratify_fields`` must be in every row.
    """
    items: list[Item] = []
    problems: list[Problem] = []
    first_seen: dict[str, int] = {}
    for number, raw in enumerate(_lines(path), start=1):
        if limit is not None and len(items) == limit:
            break
        where = f"{path}:{number}"
        try:
            row = _parse_line(raw, where)
            if row is None:
                continue
            if id_field is None and not first_seen and not problems and ID_FIELD in row:
                id_field = ID_FIELD  # the file's first row decides for every row
            prompt = _text(row, _prompt_field(row, prompt_field, where), where, numbers=False)
            reference = "" if answer_field is None else _text(row, answer_field, where, numbers=True)
            prompt_id = str(number) if id_field is None else _text(row, id_field, where, numbers=True)
            if len(prompt_id) > MAX_ID_CHARS:
                raise DatasetInvalid(f"{where}: id longer than {MAX_ID_CHARS} characters ({len(prompt_id)})")
            if prompt_id in first_seen:
                raise DatasetInvalid(
                    f"{where}: duplicate id {prompt_id!r} (first on line {first_seen[prompt_id]})"
                )
            strata = tuple((field, _stratum(row, field, where)) for field in dict.fromkeys(stratify_fields))
        except DatasetInvalid as exc:
            problems.append(
                Problem(where=where, message=exc.message.removeprefix(f"{where}: "), prompt_id=None)
            )
            continue
        first_seen[prompt_id] = number
        items.append(Item(prompt_id=prompt_id, prompt=prompt, reference=reference, strata=strata))

    dataset = Dataset(items=tuple(items), problems=tuple(problems))
    if not items and not strict:
        raise _no_rows(path, problems)
    return dataset


def load_dataset(
    path: Path,
    *,
    prompt_field: str | None = None,
    answer_field: str = "answer",
    id_field: str | None = None,
    limit: int | None = None,
    stratify_field: str | None = None,
) -> tuple[Item, ...]:
    """Every row of ``path`` checked, strictly: the first bad row is :class:`DatasetInvalid`. For checks
    before a start (``evald config check``); a job reads with :func:`read_dataset` and skips bad rows."""
    dataset = read_dataset(
        path,
        prompt_field=prompt_field,
        answer_field=answer_field,
        id_field=id_field,
        stratify_fields=() if stratify_field is None else (stratify_field,),
        strict=True,
    )
    if dataset.problems:
        first = dataset.problems[0]
        raise DatasetInvalid(f"{first.where}: {first.message}")
    if not dataset.items:
        raise _no_rows(path, [])
    return dataset.items if limit is None else dataset.items[:limit]
