"""What the scanner refuses from a checkpoint's content before a worker run is spent on it (issue 41).

Each named input sits beside a good checkpoint, which must stay complete. The inputs a file cannot grow
out of (JSON that is not strict, headers that contradict themselves or ``config.json``, a directory or a
dangling link where the weights must be) are final: refused at the first look. A weights file shorter
than its header says is refused once the folder is quiet, not after ``invalid_after_secs``. The same
ingredients, combined by a property-based generator, are in ``tests/test_content_checks_property.py``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from daemon.watching.readiness import Decision, decide
from inference import layouts
from inference.layouts import LayoutSettings, Readiness, Verdict, files, take_snapshot
from inference.layouts.hf import CONFIG_FILE, INDEX_FILE, SINGLE_FILE
from tests.checkpoints import copy_checkpoint, save_tiny_llama


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = save_tiny_llama(tmp_path_factory.mktemp("good") / "step_10")
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"vocab": {"a": 0}}}))
    return folder


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("sharded") / "step_20", shard_size="10KB")


def judged(folder: Path, layout: str = "hf") -> Verdict:
    return layouts.inspect(folder, take_snapshot(folder), layout, LayoutSettings())


def refused(reason: str) -> Verdict:
    return Verdict(Readiness.INVALID, reason, final=True)


def variant(good: Path, tmp_path: Path, name: str, change: Callable[[Path], object]) -> Path:
    folder = copy_checkpoint(good, tmp_path / name)
    change(folder)
    return folder


def config_text(folder: Path, edit: Callable[[str], str]) -> None:
    path = folder / CONFIG_FILE
    path.write_text(edit(path.read_text()))


def config_value(key: str, value: object) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        config = json.loads((folder / CONFIG_FILE).read_text())
        config[key] = value
        (folder / CONFIG_FILE).write_text(json.dumps(config))

    return change


def header_of(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header: dict[str, Any] = json.loads(data[8 : 8 + length])
    return header


def with_header(path: Path, header: dict[str, Any], data_size: int | None = None) -> None:
    """Rewrite safetensors file ``path`` with ``header``, keeping its tensor bytes (or, with
    ``data_size``, a sparse data section of that size: nothing is written but the header)."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    raw = json.dumps(header).encode()
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        if data_size is None:
            handle.write(data[8 + length :])
        else:
            handle.truncate(8 + len(raw) + data_size)


def test_the_good_checkpoints_are_complete(good: Path, sharded: Path) -> None:
    assert judged(good) == Verdict.complete()
    assert judged(sharded) == Verdict.complete()


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda t: t.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN'), "holds NaN"),
        (lambda t: t.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": -Infinity'), "holds -Infinity"),
        (lambda t: t.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e400'), "holds the number '1e400'"),
        (lambda t: t.replace("{", '{"hidden_size": 16, ', 1), "holds the key 'hidden_size' twice"),
        (lambda t: t.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": ' + "9" * 5000), "cannot be read"),
        (lambda t: t.replace("{", '{"deep": ' + "[" * 65 + "]" * 65 + ", ", 1), "(more than 64 levels)"),
        (lambda t: t.replace("{", '{"deep": ' + "[" * 100_000 + "]" * 100_000 + ", ", 1), files.TOO_DEEP),
    ],
    ids=["nan", "infinity", "overflow", "duplicate-key", "huge-integer", "deep", "very-deep"],
)
def test_config_json_that_is_not_strict_json_is_refused_at_once(
    good: Path, tmp_path: Path, edit: Callable[[str], str], reason: str
) -> None:
    assert '"rms_norm_eps": 1e-06' in (good / CONFIG_FILE).read_text()
    folder = variant(good, tmp_path, "step_11", lambda f: config_text(f, edit))
    verdict = judged(folder)
    assert verdict.final and verdict.readiness is Readiness.INVALID, verdict
    assert verdict.reason.startswith(f"{CONFIG_FILE} ") and reason in verdict.reason, verdict
    assert judged(good) == Verdict.complete()


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("vocab_size", 2**31, "vocab_size is 2147483648, outside the plausible 1..16777216"),
        ("hidden_size", 0, "hidden_size is 0, outside the plausible 1..1048576"),
        ("num_hidden_layers", 2.5, "num_hidden_layers is 2.5, not a whole number"),
        ("num_local_experts", -1, "num_local_experts is -1, outside the plausible 0..65536"),
    ],
)
def test_config_sizes_no_model_has_are_refused_at_once(
    good: Path, tmp_path: Path, key: str, value: object, reason: str
) -> None:
    folder = variant(good, tmp_path, "step_12", config_value(key, value))
    assert judged(folder) == refused(f"{CONFIG_FILE}: {reason}")
    assert judged(good) == Verdict.complete()


def test_tensor_shapes_that_contradict_config_json_are_refused_at_once(good: Path, tmp_path: Path) -> None:
    folder = variant(good, tmp_path, "step_13", config_value("vocab_size", 65))
    assert judged(folder) == refused(
        f"{SINGLE_FILE}: tensor 'lm_head.weight' is [64, 16], config.json gives [65, 16]"
    )
    wider = variant(good, tmp_path, "step_14", config_value("hidden_size", 32))
    verdict = judged(wider)
    assert verdict.final and "config.json gives [64, 32]" in verdict.reason, verdict
    # A config that gives the embedding its own width (OPT's word_embed_proj_dim): rows only.
    projected = variant(good, tmp_path, "step_15", config_value("word_embed_proj_dim", 8))
    assert judged(projected) == Verdict.complete()


def test_a_sparse_terabyte_with_consistent_offsets_is_refused_from_its_header(
    good: Path, tmp_path: Path
) -> None:
    def sparse(folder: Path) -> None:
        weights = folder / SINGLE_FILE
        header = header_of(weights)
        end = max(t["data_offsets"][1] for n, t in header.items() if n != "__metadata__")
        header["extra.weight"] = {"dtype": "U8", "shape": [2**40], "data_offsets": [end, end + 2**40]}
        with_header(weights, header, data_size=end + 2**40)

    folder = variant(good, tmp_path, "step_16", sparse)
    assert (folder / SINGLE_FILE).stat().st_size > 2**40  # and all of it holes: nothing was written
    verdict = judged(folder)
    assert verdict.final and verdict.reason.startswith("weights implausible for config.json"), verdict
    assert judged(good) == Verdict.complete()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"a":' * 100_000 + "1" + "}" * 100_000, f"tokenizer.json {files.TOO_DEEP}"),
        (
            '{"version": "1.0", "dropout": NaN}',
            "tokenizer.json holds NaN, which strict JSON has no place for",
        ),
        ('{"model": {"vocab": {"a": 0, "a": 1}}}', "tokenizer.json holds the key 'a' twice in one object"),
    ],
    ids=["deep", "nan", "duplicate-key"],
)
def test_a_tokenizer_the_worker_cannot_read_is_refused_at_once(
    good: Path, tmp_path: Path, text: str, reason: str
) -> None:
    folder = variant(good, tmp_path, "step_17", lambda f: (f / "tokenizer.json").write_text(text))
    assert judged(folder) == refused(reason)
    # Half-written: the trainer saves the tokenizer after the weights.
    (folder / "tokenizer.json").write_text('{"version": "1.0", "mod')
    assert judged(folder).readiness is Readiness.INCOMPLETE
    assert judged(good) == Verdict.complete()


def _header_change(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def rewrite(folder: Path) -> None:
        header = header_of(folder / SINGLE_FILE)
        change(header)
        with_header(folder / SINGLE_FILE, header)

    return rewrite


def _first(header: dict[str, Any]) -> dict[str, Any]:
    name = min((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])
    entry: dict[str, Any] = header[name]
    return entry


def _shift(header: dict[str, Any]) -> None:
    _first(header)["data_offsets"] = [o + 4 for o in _first(header)["data_offsets"]]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda h: _first(h).update(dtype="F128"), "which safetensors does not know"),
        (lambda h: _first(h).update(shape=[3, -1]), "not a list of whole numbers"),
        (lambda h: _first(h).update(shape=[1]), "but its data_offsets span"),
        (_shift, "leaves a gap before it"),
        (lambda h: h.update(__metadata__={"format": 1}), "__metadata__ is not a map of strings to strings"),
    ],
    ids=["dtype", "negative-dimension", "span", "gap", "metadata"],
)
def test_a_header_that_contradicts_itself_is_refused_at_once(
    good: Path, tmp_path: Path, change: Callable[[dict[str, Any]], None], reason: str
) -> None:
    folder = variant(good, tmp_path, "step_18", _header_change(change))
    verdict = judged(folder)
    assert verdict.final and verdict.reason.startswith(f"{SINGLE_FILE}: ") and reason in verdict.reason
    assert judged(good) == Verdict.complete()


def _dangling(folder: Path) -> None:
    (folder / SINGLE_FILE).unlink()
    (folder / SINGLE_FILE).symlink_to("gone.safetensors")


def _directory(folder: Path) -> None:
    (folder / SINGLE_FILE).unlink()
    (folder / SINGLE_FILE).mkdir()
    (folder / SINGLE_FILE / "x").write_text("x")


def test_a_directory_or_a_dangling_link_where_the_weights_must_be_is_refused_at_once(
    good: Path, sharded: Path, tmp_path: Path
) -> None:
    directory = variant(good, tmp_path, "step_19", _directory)
    assert judged(directory) == refused(f"{SINGLE_FILE} is a directory, not a regular file")
    dangling = variant(good, tmp_path, "step_21", _dangling)
    assert judged(dangling) == refused(
        f"{SINGLE_FILE} is a symlink to 'gone.safetensors', which does not exist"
    )
    shard = sorted(json.loads((sharded / INDEX_FILE).read_text())["weight_map"].values())[0]

    def shard_gone(folder: Path) -> None:
        (folder / shard).unlink()
        (folder / shard).symlink_to("elsewhere")

    assert judged(variant(sharded, tmp_path, "step_22", shard_gone)) == refused(
        f"{shard} is a symlink to 'elsewhere', which does not exist"
    )
    # Missing only (not yet written): still incomplete.
    missing = variant(sharded, tmp_path, "step_23", lambda f: (f / shard).unlink())
    assert judged(missing).readiness is Readiness.INCOMPLETE
    assert judged(good) == Verdict.complete()


@pytest.mark.parametrize("size", [0, 5, 100, -1], ids=["empty", "no-header-length", "cut-header", "cut-data"])
def test_a_short_weights_file_is_named_once_quiet(good: Path, tmp_path: Path, size: int) -> None:
    data = (good / SINGLE_FILE).read_bytes()
    cut = data[:size] if size >= 0 else data[:-1]
    folder = variant(good, tmp_path, "step_24", lambda f: (f / SINGLE_FILE).write_bytes(cut))
    verdict = judged(folder)
    assert verdict.readiness is Readiness.INVALID and not verdict.final, verdict
    assert verdict.reason.startswith(f"{SINGLE_FILE}: ")
    timing = {"quiet_secs": 5.0, "invalid_after_secs": 300.0, "marker": None, "marker_present": False}
    assert decide(verdict, quiet_for=4.0, **timing).decision is Decision.WAIT  # type: ignore[arg-type]
    assert decide(verdict, quiet_for=5.0, **timing).decision is Decision.INVALID  # type: ignore[arg-type]


def test_nan_in_trainer_state_log_history_is_a_good_checkpoint(good: Path, tmp_path: Path) -> None:
    """A diverging run logs NaN losses; its checkpoint is exactly one to evaluate, not to refuse."""

    def trainer(folder: Path) -> None:
        state = '{"global_step": 10, "log_history": [{"loss": NaN, "grad_norm": Infinity}]}'
        (folder / "trainer_state.json").write_text(state)

    folder = variant(good, tmp_path, "checkpoint-10", trainer)
    assert judged(folder, "hf_trainer") == Verdict.complete()
    (folder / "trainer_state.json").write_text('{"global_step": 10, "global_step": 11}')
    assert judged(folder, "hf_trainer") == refused(
        "trainer_state.json holds the key 'global_step' twice in one object"
    )


def test_a_duplicate_key_in_the_index_is_refused_at_once(sharded: Path, tmp_path: Path) -> None:
    def duplicate(folder: Path) -> None:
        text = (folder / INDEX_FILE).read_text()
        (folder / INDEX_FILE).write_text(
            text.replace('"weight_map": {', '"weight_map": {"lm_head.weight": "x", ', 1)
        )

    folder = variant(sharded, tmp_path, "step_25", duplicate)
    assert judged(folder) == refused(f"{INDEX_FILE} holds the key 'lm_head.weight' twice in one object")
