from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from inference.generation import Decoding, generate, length_buckets
from inference.grading import grade
from inference.loader import load_model
from inference.spec import InferenceSpec
from inference.toy.problems import (
    DATA_DIR,
    HELD_OUT_FRACTION,
    MAX_OPERAND,
    PROMPT_TEMPLATE,
    SHIPPED,
    Problem,
    held_out_problems,
    training_problems,
    write_shipped,
)
from inference.toy.tokenizer import ALPHABET, build_tokenizer
from inference.toy.trainer import TrainConfig, build_model, parse_args, train
from tests.conftest import SUBPROCESS_ENV, TOY_SAVE_EVERY, TOY_STEPS, ToyRun
from tests.deadlines import patient

TEXT = "23+45=\\boxed{68}\n  Mixed Case, {braces} & $math$!"


def test_tokenizer_is_one_token_per_character_and_round_trips() -> None:
    tokenizer = build_tokenizer()

    ids = tokenizer(TEXT)["input_ids"]

    assert ids[0] == tokenizer.bos_token_id
    assert len(ids) == 1 + len(TEXT)
    assert tokenizer.decode(ids, skip_special_tokens=True) == TEXT
    every_character = "".join(ALPHABET)
    assert (
        tokenizer.decode(tokenizer(every_character)["input_ids"], skip_special_tokens=True) == every_character
    )
    assert tokenizer("é")["input_ids"][1] == tokenizer.unk_token_id


def test_tokenizer_saves_and_loads_with_auto_tokenizer(tmp_path: Path) -> None:
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(tmp_path)

    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)

    assert loaded(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]
    assert loaded.decode(loaded(TEXT)["input_ids"], skip_special_tokens=True) == TEXT
    assert (loaded.pad_token, loaded.eos_token, loaded.padding_side) == ("<pad>", "</s>", "left")


def test_held_out_problems_are_never_trained_on() -> None:
    train_set, held_out = set(training_problems()), set(held_out_problems(1000, seed=3))

    assert not train_set & held_out
    assert len(train_set) + len(held_out) == (MAX_OPERAND + 1) ** 2
    assert len(held_out) == round((MAX_OPERAND + 1) ** 2 * HELD_OUT_FRACTION)
    assert held_out_problems(10, seed=1) == held_out_problems(10, seed=1) != held_out_problems(10, seed=2)


def test_problems_cli_writes_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    command = [sys.executable, "-m", "inference.toy.problems", "--out", str(out), "--n", "25", "--seed", "4"]

    subprocess.run(command, check=True, env=SUBPROCESS_ENV, timeout=patient(60))

    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 25
    assert len({row["problem"] for row in rows}) == 25
    for row in rows:
        a, b = (int(x) for x in row["problem"].split("+"))
        assert row["answer"] == str(a + b)
    assert PROMPT_TEMPLATE.format(prompt=rows[0]["problem"]) == rows[0]["problem"] + "="
    rejected = subprocess.run(
        [*command[:-4], "--n", "0"], capture_output=True, env=SUBPROCESS_ENV, timeout=patient(60)
    )
    assert rejected.returncode == 2


@pytest.mark.parametrize(
    ("problem", "level"),
    [
        (Problem(3, 4), 1),
        (Problem(13, 4), 2),
        (Problem(13, 24), 3),
        (Problem(18, 24), 4),
        (Problem(98, 24), 5),
    ],
)
def test_levels_count_two_digit_operands_and_carries(problem: Problem, level: int) -> None:
    assert problem.level == level


def test_shipped_datasets_are_what_the_generator_writes(tmp_path: Path) -> None:
    written = write_shipped(tmp_path)

    assert sorted(path.name for path in written) == sorted(SHIPPED)
    for path in written:
        assert path.read_bytes() == (DATA_DIR / path.name).read_bytes(), path.name


def test_shipped_math500_file_has_math500s_fields_and_held_out_problems() -> None:
    rows = [
        json.loads(line) for line in (DATA_DIR / "arith500.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    train_set = {problem.text for problem in training_problems()}

    assert len(rows) == 500
    assert {tuple(sorted(row)) for row in rows} == {
        ("answer", "level", "problem", "solution", "subject", "unique_id")
    }
    assert not {row["problem"] for row in rows} & train_set
    assert {row["level"] for row in rows} == {1, 2, 3, 4, 5}
    for row in rows:
        a, b = (int(x) for x in row["problem"].split("+"))
        assert row["answer"] == str(a + b)
        assert grade(row["solution"], row["answer"]).correct


def test_trainer_saves_hf_checkpoints_and_announces_each(toy_run: ToyRun) -> None:
    steps = list(range(TOY_SAVE_EVERY, TOY_STEPS + 1, TOY_SAVE_EVERY))

    assert toy_run.saved == tuple(
        {"event": "trainer.saved", "step": s, "path": str(toy_run.path / f"step_{s}")} for s in steps
    )
    for step in steps:
        files = {p.name for p in (toy_run.path / f"step_{step}").iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
        assert not any(name.endswith((".bin", ".pt", ".pth")) for name in files)
    config = json.loads((toy_run.last_checkpoint / "config.json").read_text(encoding="utf-8"))
    assert config["model_type"] == "llama"
    events = [json.loads(line)["event"] for line in toy_run.stderr.splitlines() if line.startswith("{")]
    assert events[0] == "trainer.started"
    assert events[-1] == "trainer.finished"


def test_trainer_cli_options() -> None:
    config = parse_args(
        [
            *("--out", "r", "--steps", "9", "--save-every", "3", "--seed", "5", "--threads", "2"),
            *(
                "--max-shard-size",
                "300KB",
                "--sleep-between-saves",
                "0.5",
                "--lr",
                "0.01",
                "--batch-size",
                "8",
            ),
        ]
    )

    assert config == TrainConfig(
        out=Path("r"),
        steps=9,
        save_every=3,
        seed=5,
        threads=2,
        max_shard_size="300KB",
        sleep_between_saves=0.5,
        lr=0.01,
        batch_size=8,
        warmup_steps=1,
    )
    with pytest.raises(SystemExit):
        parse_args(["--out", "r", "--steps", "0"])


def test_sharded_save_loads_back(tmp_path: Path) -> None:
    (path,) = train(TrainConfig(out=tmp_path, steps=1, save_every=1, max_shard_size="300KB", batch_size=4))

    index = json.loads((path / "model.safetensors.index.json").read_text(encoding="utf-8"))
    shards = set(index["weight_map"].values())
    assert len(shards) > 1
    assert all((path / shard).is_file() for shard in shards)
    assert not (path / "model.safetensors").exists()
    loaded = load_model(path, InferenceSpec())
    assert loaded.model.config.num_hidden_layers == 2


def test_batched_generation_matches_one_by_one(toy_run: ToyRun) -> None:
    loaded = load_model(toy_run.last_checkpoint, InferenceSpec())
    # Different token lengths, so batches are left-padded and reordered.
    prompts = [PROMPT_TEMPLATE.format(prompt=p) for p in ["1+2", "10+20", "99+99", "5+61", "7+0"]]

    batched = generate(loaded.model, loaded.tokenizer, prompts, Decoding(max_new_tokens=16), batch_size=3)
    alone = [
        generate(loaded.model, loaded.tokenizer, [p], Decoding(max_new_tokens=16), batch_size=1)
        for p in prompts
    ]

    assert batched.generations == tuple(run.generations[0] for run in alone)
    assert len(batched.batch_latencies_s) == 2
    for generation in batched.generations:
        # A few steps of training teach the format: a boxed number, then EOS.
        assert re.fullmatch(r"\\boxed\{\d+\}", generation.text)
        assert generation.tokens == len(generation.text)
        assert not generation.truncated
        assert grade(generation.text, "0").extracted is not None


def test_untrained_model_runs_out_of_tokens(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    build_model(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, InferenceSpec())

    run = generate(
        loaded.model, loaded.tokenizer, ["1+1=", "22+22="], Decoding(max_new_tokens=6), batch_size=2
    )

    assert any(g.truncated for g in run.generations)
    for generation in run.generations:
        # EOS is not counted, so a response is truncated exactly when it used every token.
        assert generation.truncated == (generation.tokens == 6)


def test_length_buckets_group_similar_lengths() -> None:
    assert length_buckets([5, 1, 3, 1, 9], batch_size=2) == [[1, 3], [2, 0], [4]]


@pytest.mark.long
@pytest.mark.slow
def test_default_training_raises_held_out_accuracy(tmp_path: Path) -> None:
    """The demo's promise: accuracy climbs from about 0 to most answers right, in under two minutes."""
    checkpoints = train(TrainConfig(out=tmp_path))
    problems: list[Problem] = held_out_problems(100, seed=1)
    accuracies = []
    # The promise is about where the run starts and where it ends: the checkpoints between are not read.
    for path in (checkpoints[0], checkpoints[-1]):
        loaded = load_model(path, InferenceSpec(threads=1))
        run = generate(
            loaded.model,
            loaded.tokenizer,
            [p.prompt for p in problems],
            Decoding(max_new_tokens=16),
            batch_size=32,
        )
        correct = [grade(g.text, p.answer).correct for g, p in zip(run.generations, problems, strict=True)]
        accuracies.append(sum(correct) / len(correct))

    assert len(checkpoints) == 6
    assert accuracies[0] <= 0.1
    assert accuracies[-1] >= 0.6
    assert accuracies[-1] - accuracies[0] >= 0.5
