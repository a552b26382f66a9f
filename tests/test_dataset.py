from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.dataset import Item, load_dataset, read_dataset
from inference.errors import DatasetInvalid


def write(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def rows(*objects: object) -> list[str]:
    return [json.dumps(obj) for obj in objects]


def test_reads_rows_with_line_numbers_as_ids(tmp_path: Path) -> None:
    path = write(
        tmp_path / "d.jsonl", *rows({"problem": "1+1", "answer": "2"}, {"problem": "2+2", "answer": 4})
    )

    items = load_dataset(path)

    assert items == (Item("1", "1+1", "2"), Item("2", "2+2", "4"))


def test_prompt_field_defaults_to_first_of_prompt_question_problem(tmp_path: Path) -> None:
    path = write(
        tmp_path / "d.jsonl",
        *rows(
            {"question": "q", "problem": "p", "answer": "1"},
            {"problem": "p", "prompt": "x", "answer": "1"},
        ),
    )

    assert [item.prompt for item in load_dataset(path)] == ["q", "x"]


def test_configured_fields(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", *rows({"text": "t", "prompt": "no", "gold": "\\frac{1}{2}", "uid": 7}))

    (item,) = load_dataset(path, prompt_field="text", answer_field="gold", id_field="uid")

    assert item == Item(prompt_id="7", prompt="t", reference="\\frac{1}{2}")


def test_blank_lines_are_skipped_and_keep_numbering(tmp_path: Path) -> None:
    path = write(
        tmp_path / "d.jsonl",
        "",
        *rows({"prompt": "a", "answer": "1"}),
        "   ",
        *rows({"prompt": "b", "answer": "2"}),
    )

    assert [item.prompt_id for item in load_dataset(path)] == ["2", "4"]


def test_limit_takes_the_first_rows_but_checks_all(tmp_path: Path) -> None:
    good = rows(*({"prompt": str(i), "answer": "1"} for i in range(5)))
    path = write(tmp_path / "d.jsonl", *good)
    assert [item.prompt for item in load_dataset(path, limit=2)] == ["0", "1"]

    write(path, *good, "{broken")
    with pytest.raises(DatasetInvalid, match=r"d\.jsonl:6: invalid JSON"):
        load_dataset(path, limit=2)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "a", "answer": ', r"invalid JSON"),
        ('["prompt", "answer"]', r"expected a JSON object, got list"),
        ('{"prompt": "a"}', r"missing field 'answer'"),
        ('{"prompt": "  ", "answer": "1"}', r"empty field 'prompt'"),
        ('{"prompt": 12, "answer": "1"}', r"field 'prompt' must be a string, got int"),
        ('{"prompt": "a", "answer": null}', r"field 'answer' must be a string or a number, got null"),
        ('{"prompt": "a", "answer": true}', r"field 'answer' must be a string or a number, got bool"),
        ('{"text": "a", "answer": "1"}', r"no prompt field \(looked for 'prompt', 'question', 'problem'"),
    ],
)
def test_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path / "data.jsonl", *rows({"prompt": "ok", "answer": "1"}), line)

    with pytest.raises(DatasetInvalid, match=rf"^{tmp_path}/data\.jsonl:2: {message}"):
        load_dataset(path)


def test_configured_field_missing(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", *rows({"prompt": "a", "answer": "1"}))

    with pytest.raises(DatasetInvalid, match=r"d\.jsonl:1: missing field 'question'"):
        load_dataset(path, prompt_field="question")
    with pytest.raises(DatasetInvalid, match=r"d\.jsonl:1: missing field 'id'"):
        load_dataset(path, id_field="id")


def test_duplicate_ids(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", *rows(*({"id": "x", "prompt": "a", "answer": "1"} for _ in range(2))))

    with pytest.raises(DatasetInvalid, match=r"d\.jsonl:2: duplicate id 'x' \(first on line 1\)"):
        load_dataset(path, id_field="id")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "\xff", "answer": "1"}\n')

    with pytest.raises(DatasetInvalid, match=r"d\.jsonl:2: not UTF-8"):
        load_dataset(path)


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(content, encoding="utf-8")

    with pytest.raises(DatasetInvalid, match=r"d\.jsonl: no rows"):
        load_dataset(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetInvalid, match=r"nope\.jsonl: cannot read"):
        load_dataset(tmp_path / "nope.jsonl")


def test_bad_rows_are_reported_and_the_rest_kept(tmp_path: Path) -> None:
    path = write(
        tmp_path / "d.jsonl",
        *rows({"id": "a", "prompt": "1+1", "answer": "2"}, {"id": "x" * 201, "prompt": "p", "answer": "1"}),
        '{"id": "b", "prompt": ""}',
        *rows({"id": "a", "prompt": "again", "answer": "3"}, {"id": "c", "prompt": "2+2", "answer": 4}),
    )

    dataset = read_dataset(path, id_field="id")

    assert [item.prompt_id for item in dataset.items] == ["a", "c"]
    assert [(p.where, p.message) for p in dataset.problems] == [
        (f"{path}:2", "id longer than 200 characters (201)"),
        (f"{path}:3", "empty field 'prompt'"),
        (f"{path}:4", "duplicate id 'a' (first on line 1)"),
    ]
    # A limit stops reading once it has its rows: later bad rows are not the job's.
    assert read_dataset(path, id_field="id", limit=1).problems == ()


def test_a_math500_row_is_known_by_its_unique_id(tmp_path: Path) -> None:
    """MATH500's rows carry ``unique_id``: with no id_field set it is the id (line numbers were stored, and
    a reordered or filtered file matched samples to the wrong problems)."""
    path = tmp_path / "math500.jsonl"
    rows = [
        {"problem": "1+1", "answer": "2", "unique_id": "test/algebra/1.json"},
        {"problem": "2+2", "answer": "4", "unique_id": "test/algebra/7.json"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [i.prompt_id for i in load_dataset(path)] == ["test/algebra/1.json", "test/algebra/7.json"]
    # A row without it, once the first row had it, is a bad row named by its line.
    path.write_text(path.read_text() + json.dumps({"problem": "3+3", "answer": "6"}) + "\n")
    assert [(p.where, p.message) for p in read_dataset(path).problems] == [
        (f"{path}:3", "missing field 'unique_id'")
    ]
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"problem": "1+1", "answer": "2"}) + "\n")
    assert [i.prompt_id for i in load_dataset(plain)] == ["1"]
