from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from inference.dataset import Item, load_dataset
from inference.errors import DatasetInvalid
from inference.sampling import allocate, stratified_subset
from inference.spec import InferenceSpec, JobSpec, SubsetSpec, TaskSpec
from inference.task import select_items
from inference.toy.problems import PROMPT_TEMPLATE, held_out_problems
from tests.conftest import ToyRun
from tests.deadlines import patient
from tests.test_worker import run_worker

#: Items named by stratum and position, in the strata's sizes: ``a0 … a49, b0 … b29, c0 … c19``.
SIZES = {"a": 50, "b": 30, "c": 20}


def labelled(sizes: dict[str, int]) -> list[str]:
    """Strata interleaved, so that keeping the original order is not the same as grouping by stratum."""
    items = [f"{name}{index}" for name, count in sizes.items() for index in range(count)]
    random.Random(7).shuffle(items)
    return items


def first_letter(item: str) -> str:
    return item[0]


def counts(subset: list[str]) -> dict[str, int]:
    return dict(sorted(Counter(first_letter(item) for item in subset).items()))


def test_proportional_counts() -> None:
    subset = stratified_subset(labelled(SIZES), 10, seed=0, stratum=first_letter)

    assert counts(subset) == {"a": 5, "b": 3, "c": 2}


def test_a_tiny_stratum_still_gets_one() -> None:
    subset = stratified_subset(labelled({"a": 90, "b": 9, "c": 1}), 10, seed=0, stratum=first_letter)

    assert counts(subset) == {"a": 8, "b": 1, "c": 1}


@pytest.mark.parametrize(
    ("sizes", "size", "expected"),
    [
        ({"a": 5, "b": 5}, 3, {"a": 2, "b": 1}),  # equal remainders: the smaller name wins
        ({"b": 5, "a": 5}, 3, {"a": 2, "b": 1}),  # whatever order the strata come in
        ({"a": 50, "b": 30, "c": 20}, 2, {"a": 1, "b": 1, "c": 0}),  # fewer items than strata
        ({"a": 40, "b": 40, "c": 10, "d": 10}, 4, {"a": 1, "b": 1, "c": 1, "d": 1}),
        ({"a": 3, "b": 1}, 4, {"a": 3, "b": 1}),
    ],
)
def test_allocation(sizes: dict[str, int], size: int, expected: dict[str, int]) -> None:
    assert allocate(sizes, size) == expected


def test_allocation_properties() -> None:
    rng = random.Random(0)
    for _ in range(500):
        sizes = {f"s{index}": rng.randint(1, 40) for index in range(rng.randint(1, 8))}
        size = rng.randint(0, sum(sizes.values()))

        quotas = allocate(sizes, size)

        assert sum(quotas.values()) == size
        assert all(0 <= quotas[name] <= sizes[name] for name in sizes)
        if size >= len(sizes):
            assert min(quotas.values()) >= 1


def test_same_subset_on_every_call() -> None:
    items = labelled(SIZES)

    first = stratified_subset(items, 17, seed=5, stratum=first_letter)

    assert stratified_subset(list(items), 17, seed=5, stratum=first_letter) == first
    assert len(first) == len(set(first)) == 17


SUBSET_IN_A_PROCESS = (
    "import json\n"
    "from inference.sampling import stratified_subset\n"
    "from tests.test_sampling import SIZES, first_letter, labelled\n"
    "print(json.dumps([stratified_subset(labelled(SIZES), 17, seed=5, stratum=first_letter),"
    " stratified_subset(labelled(SIZES), 17, seed=5)]))\n"
)


@pytest.mark.parametrize("hash_seed", ["1", "2"])
def test_same_subset_in_another_process(hash_seed: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SUBSET_IN_A_PROCESS],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
        cwd=Path(__file__).parent.parent,
        timeout=patient(60),
        check=True,
    )

    assert json.loads(done.stdout) == [
        stratified_subset(labelled(SIZES), 17, seed=5, stratum=first_letter),
        stratified_subset(labelled(SIZES), 17, seed=5),
    ]


def test_different_seeds_give_different_subsets() -> None:
    items = labelled(SIZES)

    subsets = {tuple(stratified_subset(items, 10, seed=seed, stratum=first_letter)) for seed in range(5)}

    assert len(subsets) == 5
    assert all(counts(list(subset)) == {"a": 5, "b": 3, "c": 2} for subset in subsets)


def test_original_order_is_kept() -> None:
    items = labelled(SIZES)

    subset = stratified_subset(items, 20, seed=3, stratum=first_letter)

    assert subset == [item for item in items if item in set(subset)]


def test_a_larger_subset_keeps_the_smaller_one() -> None:
    items = labelled(SIZES)

    small = stratified_subset(items, 10, seed=3, stratum=first_letter)
    large = stratified_subset(items, 20, seed=3, stratum=first_letter)

    assert set(small) <= set(large)


@pytest.mark.parametrize("size", [100, 101])
def test_size_at_least_the_items_returns_all(size: int) -> None:
    items = labelled(SIZES)

    assert stratified_subset(items, size, seed=1, stratum=first_letter) == items
    assert stratified_subset(items, size, seed=1) == items


def test_without_strata_a_plain_seeded_sample() -> None:
    items = list(range(100))

    subset = stratified_subset(items, 10, seed=4)

    assert subset == sorted(subset)
    assert len(set(subset)) == 10
    assert stratified_subset(items, 10, seed=4) == subset
    assert stratified_subset(items, 10, seed=5) != subset


# --- the dataset's stratum field ---


def write(path: Path, *objects: object) -> Path:
    path.write_text("".join(json.dumps(obj) + "\n" for obj in objects), encoding="utf-8")
    return path


def test_stratum_is_read_as_text(tmp_path: Path) -> None:
    path = write(
        tmp_path / "d.jsonl",
        {"prompt": "1+1", "answer": "2", "level": "easy"},
        {"prompt": "2+2", "answer": "4", "level": 3},
    )

    assert [item.stratum for item in load_dataset(path, stratify_field="level")] == ["easy", "3"]
    assert [item.stratum for item in load_dataset(path)] == [None, None]


def test_stratify_field_missing_names_file_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path / "d.jsonl",
        {"prompt": "1+1", "answer": "2", "level": "easy"},
        {"prompt": "2+2", "answer": "4"},
    )

    with pytest.raises(DatasetInvalid) as caught:
        load_dataset(path, stratify_field="level")

    assert caught.value.message == f"{path}:2: missing field 'level' (stratify_field)"


def test_stratify_field_of_another_type(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", {"prompt": "1+1", "answer": "2", "level": None})

    with pytest.raises(DatasetInvalid) as caught:
        load_dataset(path, stratify_field="level")

    assert caught.value.message == f"{path}:1: field 'level' must be a string or a number, got null"


def test_select_items_takes_the_task_subset() -> None:
    items = [Item(str(i), f"{i}+1", str(i + 1), strata=(("level", str(i % 2)),)) for i in range(10)]
    task = TaskSpec(name="t", dataset=Path("d.jsonl"), subset=SubsetSpec(size=4, stratify_field="level"))

    chosen = select_items(task, items)

    assert len(chosen) == 4
    assert Counter(item.stratum for item in chosen) == {"0": 2, "1": 2}
    assert select_items(task.model_copy(update={"subset": None}), items) == tuple(items)


# --- a real worker on a quick subset ---


def write_levelled_dataset(path: Path) -> Path:
    """30 held-out toy problems with a numeric ``level``: 15 of level 1, 10 of level 2, 5 of level 3."""
    levels = (1, 1, 1, 2, 2, 3)
    lines = (
        json.dumps(
            {"id": f"p{index}", "problem": problem.text, "answer": problem.answer, "level": levels[index % 6]}
        )
        for index, problem in enumerate(held_out_problems(30, seed=2))
    )
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_worker_evaluates_a_quick_subset(toy_run: ToyRun, tmp_path: Path) -> None:
    dataset = write_levelled_dataset(tmp_path / "levelled.jsonl")
    subset = SubsetSpec(size=6, seed=9, stratify_field="level")
    spec = JobSpec(
        job_id=12,
        checkpoint_path=toy_run.last_checkpoint,
        result_path=tmp_path / "result.json",
        task=TaskSpec(
            name="toy-quick",
            dataset=dataset,
            prompt_template=PROMPT_TEMPLATE,
            id_field="id",
            batch_size=8,
            subset=subset,
            metrics=("accuracy",),
        ),
        inference=InferenceSpec(threads=1),
    )
    done, result = run_worker(spec, tmp_path)
    assert done.returncode == 0, done.stderr
    (accuracy,) = result.metrics
    assert (accuracy.name, accuracy.n) == ("accuracy", 6)
    items = load_dataset(dataset, id_field="id", stratify_field="level")
    expected = stratified_subset(items, 6, seed=9, stratum=lambda item: item.stratum or "")
    assert [sample.prompt_id for sample in result.samples] == [item.prompt_id for item in expected]
    assert Counter(item.stratum for item in expected) == {"1": 3, "2": 2, "3": 1}
    assert [sample.index for sample in result.samples] == list(range(6))
