"""The read boundary's content checks as a property (issue 41): hypothesis builds checkpoint folders from
the ingredients of ``tests/test_content_checks.py`` (JSON with NaN, keys twice, deep nesting; safetensors
headers with random dtypes, shapes, offsets and file sizes; config sizes and shapes that contradict each
other; directories and dangling links where the weights must be), consistent or with one fault. The
verdict never raises, is ``complete`` exactly for the consistent folders, and is final wherever no write
can mend the fault. Any text at all in a JSON file of a good checkpoint never makes the verdict raise.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference import layouts
from inference.layouts import LayoutSettings, Readiness, Verdict, files, take_snapshot, validation
from inference.layouts.hf import CONFIG_FILE, INDEX_FILE, SINGLE_FILE
from tests.checkpoints import save_tiny_llama


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("good") / "step_10")


def judged(folder: Path) -> Verdict:
    return layouts.inspect(folder, take_snapshot(folder), "hf", LayoutSettings())


# The property: folders built from the ingredients above, consistent or with one fault.

DTYPES = sorted(validation.DTYPE_BITS)
FAULTS = (
    "config-nan",
    "config-duplicate",
    "config-deep",
    "vocab-huge",
    "embedding-rows",
    "dtype",
    "span",
    "gap",
    "overlap",
    "header-duplicate",
    "short",
    "long",
    "sparse-huge",
    "tokenizer-deep",
    "tokenizer-nan",
    "tokenizer-half",
    "directory",
    "dangling",
)


@st.composite
def tensors(draw: st.DrawFn, vocab: int, hidden: int) -> list[tuple[str, str, list[int]]]:
    """The embedding, right for the config, and a few tensors of random dtypes and shapes."""
    found = [("model.embed_tokens.weight", draw(st.sampled_from(["F32", "BF16", "F16"])), [vocab, hidden])]
    for index in range(draw(st.integers(0, 4))):
        dtype = draw(st.sampled_from(DTYPES))
        shape = draw(st.lists(st.integers(0, 6), max_size=3))
        if validation.DTYPE_BITS[dtype] % 8:
            shape = [*shape, 8]  # sub-byte dtypes: a whole number of bytes
        found.append((f"model.layers.{index}.weight", dtype, shape))
    return found


def _header(entries: list[tuple[str, str, list[int]]]) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    items, position = [], 0
    for name, dtype, shape in entries:
        size = validation.DTYPE_BITS[dtype] * _product(shape) // 8
        items.append((name, {"dtype": dtype, "shape": shape, "data_offsets": [position, position + size]}))
        position += size
    return items, position


def _product(shape: list[int]) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


def _object(items: list[tuple[str, Any]]) -> str:
    """A JSON object from pairs, keys repeated if they are (``json.dumps`` of a dict cannot)."""
    return "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in items) + "}"


@st.composite
def folders(draw: st.DrawFn) -> tuple[dict[str, bytes | None], str | None]:
    """A checkpoint folder's files (name → bytes; ``None``: a special entry named by the fault) and the
    fault put into it (``None``: consistent)."""
    fault = draw(st.one_of(st.none(), st.sampled_from(FAULTS)))
    vocab, hidden, layers = draw(st.integers(1, 64)), draw(st.integers(1, 16)), draw(st.integers(1, 4))
    config: list[tuple[str, Any]] = [
        ("architectures", ["LlamaForCausalLM"]),
        ("vocab_size", vocab),
        ("hidden_size", hidden),
        ("num_hidden_layers", layers),
        ("rms_norm_eps", 1e-6),
    ]
    entries = draw(tensors(vocab, hidden))
    if fault == "vocab-huge":
        config[1] = ("vocab_size", draw(st.integers(2**24 + 1, 2**62)))
    if fault == "embedding-rows":
        entries[0] = (entries[0][0], entries[0][1], [vocab + draw(st.integers(1, 5)), hidden])
    if fault == "dtype":
        entries[0] = (
            entries[0][0],
            draw(st.text(min_size=1, max_size=6).filter(lambda d: d not in DTYPES)),
            [1],
        )
    if fault == "sparse-huge":
        entries.append(("extra.weight", "U8", [draw(st.integers(2**29, 2**42))]))
    items, end = _header([(n, d if d in DTYPES else "U8", s) for n, d, s in entries])
    if fault == "dtype":
        items[0][1]["dtype"] = entries[0][1]
    if fault == "span":
        begin, last = items[-1][1]["data_offsets"]
        end = last + draw(st.integers(1, 9))
        items[-1][1]["data_offsets"] = [begin, end]
    if fault == "gap":
        items[-1][1]["data_offsets"] = [o + draw(st.integers(1, 64)) for o in items[-1][1]["data_offsets"]]
        end = items[-1][1]["data_offsets"][1]
    if fault == "overlap":
        extra = {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}
        items.append(("overlapping.weight", extra))
        end = max(end, 2)
    if fault == "header-duplicate":
        items.append(items[0])
    config_json = _object(config)
    if fault == "config-nan":
        config_json = config_json.replace(
            "1e-06", draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999"]))
        )
    if fault == "config-duplicate":
        config_json = config_json[:-1] + f', "hidden_size": {hidden}}}'
    if fault == "config-deep":
        depth = draw(st.integers(files.MAX_JSON_DEPTH + 1, 5000))
        config_json = config_json[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    raw = _object(items).encode()
    size = 8 + len(raw) + end
    if fault == "short":
        size = draw(st.integers(0, size - 1))  # empty, inside the header length, the header or the data
    if fault == "long":
        size += draw(st.integers(1, 4096))
    weights: bytes | None = struct.pack("<Q", len(raw)) + raw
    tokenizer = json.dumps({"version": "1.0", "model": {"vocab": {"a": 0}}})
    if fault == "tokenizer-deep":
        depth = draw(st.integers(files.MAX_JSON_DEPTH + 1, 100_000))
        tokenizer = '{"a": ' * depth + "1" + "}" * depth
    if fault == "tokenizer-nan":
        tokenizer = '{"version": "1.0", "dropout": NaN}'
    if fault == "tokenizer-half":
        tokenizer = tokenizer[: draw(st.integers(0, len(tokenizer) - 1))]
    contents: dict[str, bytes | None] = {
        CONFIG_FILE: config_json.encode(),
        SINGLE_FILE: None if fault in ("directory", "dangling") else weights,
        "tokenizer.json": tokenizer.encode(),
        "#size": str(size).encode(),
    }
    return contents, fault


def _write(folder: Path, contents: dict[str, bytes | None], fault: str | None) -> None:
    folder.mkdir()
    size = int(contents["#size"] or b"0")
    for name, data in contents.items():
        if name.startswith("#"):
            continue
        path = folder / name
        if data is None:
            if fault == "directory":
                path.mkdir()
            else:
                path.symlink_to("nowhere")
            continue
        if name != SINGLE_FILE:
            path.write_bytes(data)
            continue
        path.write_bytes(data[:size])
        with path.open("r+b") as handle:
            handle.truncate(size)  # the tensor data sparse: zeros read back, nothing written


@given(folders())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_verdict_is_complete_exactly_for_consistent_folders(
    drawn: tuple[dict[str, bytes | None], str | None],
) -> None:
    contents, fault = drawn
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "step_5"
        _write(folder, contents, fault)
        verdict = judged(folder)  # never raises: any exception fails the property
        if fault is None:
            assert verdict == Verdict.complete(), verdict
        else:
            assert verdict.readiness is not Readiness.COMPLETE, (fault, verdict)
            if fault not in ("short", "long", "tokenizer-half"):
                # Nothing a file can still grow out of: named at the first look.
                assert verdict.final, (fault, verdict)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=30,
)


def _non_finite(value: Any) -> bool:
    """Whether parsed JSON holds NaN or an infinity anywhere (iteratively: ``value`` may nest deep)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if (isinstance(item, float) and item != item) or item in (float("inf"), float("-inf")):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _lenient(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


@given(
    name=st.sampled_from([CONFIG_FILE, INDEX_FILE, "tokenizer.json", "tokenizer_config.json"]),
    text=st.one_of(
        json_values.map(json.dumps),
        st.text(max_size=64),
        st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
    ),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_text_in_a_json_file_never_raises_and_nan_is_never_complete(
    good: Path, name: str, text: str
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = shutil.copytree(good, Path(scratch) / "step_3")
        (folder / name).write_text(text, encoding="utf-8")
        verdict = judged(folder)  # never raises: any exception fails the property
        if _non_finite(_lenient(text)):
            assert verdict.readiness is not Readiness.COMPLETE, verdict


def test_the_sparse_file_of_the_generator_reads_back_as_its_size(tmp_path: Path) -> None:
    """The generator's weights are sparse: the size a header declares is on disk without being written."""
    path = tmp_path / "x"
    path.write_bytes(b"abc")
    with path.open("r+b") as handle:
        handle.truncate(2**32)
    assert path.stat().st_size == 2**32 and path.stat().st_blocks * 512 < 2**20
