"""Reads of the checkpoint tree never block and never blow up (issue 31): a FIFO, a socket or a device
where a layout reads a file, 5 GB of ``config.json``, JSON nested 100,000 deep. Each is refused from what
it is, promptly, as the folder's ``invalid`` verdict naming the file, on real files beside a good
checkpoint that stays complete."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from inference import layouts
from inference.errors import CheckpointInvalid, FileRefused
from inference.layouts import LayoutSettings, Readiness, Verdict, files, take_snapshot
from inference.layouts.base import MAX_TREE_DEPTH, MAX_TREE_ENTRIES, TreeRefused
from inference.layouts.hf import CONFIG_FILE, INDEX_FILE, SINGLE_FILE, as_safetensors
from tests import deep_trees
from tests.checkpoints import copy_checkpoint, save_tiny_llama

T = TypeVar("T")
DEEP = "[" * 100_000
#: A blocked read would never return: anything slower than this is a read that waited for a writer.
PROMPT_S = 5.0


def promptly(call: Callable[[], T]) -> T:
    """``call()``'s result, failing (not hanging) the test when it blocks; exceptions pass through."""
    outcome: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            error.append(exc)

    # A daemon thread: one blocked on a FIFO for good must not keep the test process alive.
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(PROMPT_S)
    assert not thread.is_alive(), f"still blocked after {PROMPT_S} s"
    if error:
        raise error[0]
    return outcome[0]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("good") / "step_10")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a unix socket's path must fit in 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="evald-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def replaced(source: Path, target: Path, name: str, make: Callable[[Path], object]) -> Path:
    """A copy of checkpoint ``source`` at ``target`` with file ``name`` made anew by ``make``."""
    copy_checkpoint(source, target)
    (target / name).unlink(missing_ok=True)
    make(target / name)
    return target


def refused(reason: str) -> Verdict:
    """A refusal: invalid at once, whatever the quiet period (a final verdict)."""
    return Verdict(Readiness.INVALID, reason, final=True)


def judged(directory: Path, layout: str = "hf", settings: LayoutSettings | None = None) -> Verdict:
    """The verdict the daemon's discovery gets, failing the test if it blocks."""
    return promptly(lambda: layouts.inspect(directory, take_snapshot(directory), layout, settings))


def listening_socket(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    return server


# The helper itself, on each kind of file.


def test_a_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / CONFIG_FILE)
    with pytest.raises(FileRefused) as caught:
        promptly(lambda: files.read_text(tmp_path / CONFIG_FILE))
    assert str(caught.value) == f"{tmp_path / CONFIG_FILE} is a FIFO, not a regular file"
    # A CheckpointInvalid, so a worker that meets one reports a bad checkpoint, not a crash.
    assert isinstance(caught.value, CheckpointInvalid)


def test_a_socket_a_device_and_a_directory_are_refused(tmp_path: Path, short_dir: Path) -> None:
    refused = pytest.raises(FileRefused, match=r"latest is a socket, not a regular file")
    with listening_socket(short_dir / "latest"), refused:
        promptly(lambda: files.read_text(short_dir / "latest", limit=files.MAX_TAG_BYTES))
    # /dev/zero would never end and /dev/tty may wait for a keyboard: a link to one is followed.
    (tmp_path / "trainer_state.json").symlink_to("/dev/zero")
    with pytest.raises(FileRefused, match=r"trainer_state.json is a character device, not a regular file"):
        promptly(lambda: files.read_text(tmp_path / "trainer_state.json"))
    (tmp_path / INDEX_FILE).mkdir()
    with pytest.raises(FileRefused, match=r"is a directory, not a regular file"):
        files.read_bytes(tmp_path / INDEX_FILE, limit=100)
    assert files.read_text(tmp_path / "absent.json") is None


def test_a_huge_file_is_refused_from_its_size_unread(tmp_path: Path) -> None:
    path = tmp_path / CONFIG_FILE
    with path.open("wb") as handle:
        handle.truncate(5 * 1024**3)  # sparse: 5 GB that cost no disk, and would cost 5 GB of memory
    started = time.perf_counter()
    with pytest.raises(FileRefused, match=rf"config.json is {5 * 1024**3} bytes, more than the 67108864"):
        files.read_text(path)
    assert time.perf_counter() - started < 1.0


def test_deep_json_is_refused_by_name_and_shallow_json_parses() -> None:
    for deep in (DEEP, "[" * 100_000 + "]" * 100_000, '{"a":' * 100_000):
        with pytest.raises(FileRefused) as caught:
            files.parse_json(deep, CONFIG_FILE)
        assert str(caught.value) == "config.json holds JSON nested too deep to parse"
    assert files.parse_json('["[[[[[[", "{{{{", "\\"[[["]', CONFIG_FILE) == ["[[[[[[", "{{{{", '"[[[']
    deepest = files.MAX_JSON_DEPTH
    assert files.parse_json("[" * deepest + "]" * deepest, CONFIG_FILE) is not None
    # Deeper than the bound but not than the parser's recursion: refused by the bound, with it named.
    for deeper in ("[" * (deepest + 1) + "]" * (deepest + 1), '{"a":' * 500 + "1" + "}" * 500):
        with pytest.raises(FileRefused) as caught:
            files.parse_json(deeper, CONFIG_FILE)
        assert str(caught.value) == f"config.json {files.TOO_DEEP} (more than {deepest} levels)"
    with pytest.raises(json.JSONDecodeError):
        files.parse_json('{"half": ', CONFIG_FILE)  # half-written: the caller decides, not refused


# Each layout, on a folder beside a good one.


def test_a_good_checkpoint_is_still_complete(good: Path) -> None:
    assert judged(good) == Verdict.complete()


@pytest.mark.parametrize(
    ("name", "what"),
    [(SINGLE_FILE, "a FIFO"), (CONFIG_FILE, "a FIFO"), ("tokenizer.json", "a FIFO")],
)
def test_a_fifo_in_a_checkpoint_makes_it_invalid_by_name(
    good: Path, tmp_path: Path, name: str, what: str
) -> None:
    folder = replaced(good, tmp_path / "step_20", name, os.mkfifo)
    assert judged(folder) == refused(f"{name} is {what}, not a regular file")
    # The layout's own read refuses it too (the loader and `evald eval` call it directly).
    if name != "tokenizer.json":
        verdict = promptly(lambda: layouts.hf.inspect(folder, take_snapshot(folder)))
        assert verdict == refused(f"{name} is {what}, not a regular file")
    assert judged(good) == Verdict.complete()


def test_a_socket_or_device_in_a_checkpoint_makes_it_invalid_by_name(good: Path, short_dir: Path) -> None:
    folder = copy_checkpoint(good, short_dir / "step_30")
    (folder / SINGLE_FILE).unlink()
    with listening_socket(folder / SINGLE_FILE):
        assert judged(folder) == refused(f"{SINGLE_FILE} is a socket, not a regular file")
    (folder / SINGLE_FILE).unlink()
    (folder / SINGLE_FILE).symlink_to("/dev/zero")
    assert judged(folder) == refused(f"{SINGLE_FILE} is a character device, not a regular file")


def test_deep_json_in_config_index_and_header_makes_it_invalid_by_name(good: Path, tmp_path: Path) -> None:
    config = replaced(good, tmp_path / "step_40", CONFIG_FILE, lambda p: p.write_text(DEEP))
    assert judged(config) == refused(f"config.json {files.TOO_DEEP}")
    index = replaced(good, tmp_path / "step_50", INDEX_FILE, lambda p: p.write_text(DEEP))
    assert judged(index) == refused(f"{INDEX_FILE} {files.TOO_DEEP}")

    def deep_header(path: Path) -> None:
        header = ("[" * 100_000).encode()
        path.write_bytes(struct.pack("<Q", len(header)) + header)

    header = replaced(good, tmp_path / "step_60", SINGLE_FILE, deep_header)
    # The header was read whole (all its declared bytes are there): what it holds is final.
    assert judged(header) == refused(f"{SINGLE_FILE}: header {files.TOO_DEEP}")
    assert judged(good) == Verdict.complete()


def test_a_huge_config_makes_it_invalid_by_name(good: Path, tmp_path: Path) -> None:
    def huge(path: Path) -> None:
        with path.open("wb") as handle:
            handle.truncate(5 * 1024**3)

    folder = replaced(good, tmp_path / "step_70", CONFIG_FILE, huge)
    verdict = judged(folder)
    assert verdict.readiness is Readiness.INVALID
    assert verdict.reason.startswith(f"config.json is {5 * 1024**3} bytes, more than the")


def test_trainer_state_deepspeed_latest_verl_tracker_and_dcp_metadata(good: Path, tmp_path: Path) -> None:
    # hf_trainer: trainer_state.json nested too deep (it is read first, the Trainer writes it last).
    trainer = copy_checkpoint(good, tmp_path / "trainer" / "checkpoint-10")
    (trainer / "trainer_state.json").write_text(DEEP)
    assert judged(trainer, "hf_trainer") == refused(f"trainer_state.json {files.TOO_DEEP}")
    # DeepSpeed: `latest` beside the tag folder is a FIFO, named by its path (it lies outside the folder).
    save_dir = tmp_path / "ds"
    (save_dir / "global_step10").mkdir(parents=True)
    (save_dir / "global_step10" / "mp_rank_00_model_states.pt").write_bytes(b"PK")
    os.mkfifo(save_dir / "latest")
    tag = save_dir / "global_step10"
    assert judged(tag, "deepspeed") == refused(f"{save_dir / 'latest'} is a FIFO, not a regular file")
    # A save_dir whose `latest` is a FIFO: recognised, refused by name, its step from its name.
    ds = layouts.get("deepspeed")
    assert promptly(lambda: ds.recognise(save_dir, take_snapshot(save_dir)))
    assert judged(save_dir, "deepspeed") == refused("latest is a FIFO, not a regular file")
    # verl: latest_checkpointed_iteration.txt is a FIFO.
    verl_root = tmp_path / "verl"
    step = copy_checkpoint(good, verl_root / "global_step_10" / "actor" / "huggingface").parents[1]
    os.mkfifo(verl_root / "latest_checkpointed_iteration.txt")
    verdict = judged(step, "verl")
    assert verdict.readiness is Readiness.INVALID
    assert verdict.reason.endswith("latest_checkpointed_iteration.txt is a FIFO, not a regular file")
    # DCP: `.metadata` is a FIFO; the layout's own read refuses it (the snapshot check comes first).
    dcp = tmp_path / "dcp" / "step_10"
    dcp.mkdir(parents=True)
    os.mkfifo(dcp / ".metadata")
    refusal = refused(".metadata is a FIFO, not a regular file")
    assert promptly(lambda: layouts.get("dcp").inspect(dcp, take_snapshot(dcp), LayoutSettings())) == refusal
    assert judged(dcp, "dcp") == refusal


def test_the_worker_refuses_a_deep_index_as_an_invalid_checkpoint(good: Path, tmp_path: Path) -> None:
    folder = replaced(good, tmp_path / "step_80", INDEX_FILE, lambda p: p.write_text(DEEP))
    with pytest.raises(CheckpointInvalid) as caught:
        as_safetensors(folder, tmp_path / "scratch")
    assert str(caught.value) == (f"{folder}: {INDEX_FILE} {files.TOO_DEEP}")


# The listing's bounds: a folder no trainer writes is refused from its listing, which stops there.


def test_a_folder_nested_thousands_deep_is_refused_by_its_listing(good: Path, tmp_path: Path) -> None:
    folder = copy_checkpoint(good, tmp_path / "step_11")
    deep_trees.make(folder / "junk", 3000)
    try:
        with pytest.raises(TreeRefused, match=f"nests folders more than {MAX_TREE_DEPTH} deep"):
            promptly(lambda: take_snapshot(folder))
    finally:
        deep_trees.remove(folder / "junk")
    # Nested as deep as a layout may, it is listed.
    deep_trees.make(folder / "junk", MAX_TREE_DEPTH - 2)  # junk itself is one level
    assert take_snapshot(folder).names() == take_snapshot(good).names()


def test_a_folder_of_more_entries_than_any_layout_writes_is_refused(good: Path, tmp_path: Path) -> None:
    folder = copy_checkpoint(good, tmp_path / "step_12")
    spill = folder / "spill"
    spill.mkdir()
    existing = sum(1 for _ in folder.rglob("*"))
    deep_trees.crowd(spill, MAX_TREE_ENTRIES - existing)
    assert len(take_snapshot(folder).files) == MAX_TREE_ENTRIES - 1  # every entry but the folder ``spill``
    (spill / "one-more").touch()
    with pytest.raises(TreeRefused, match=f"holds more than {MAX_TREE_ENTRIES:,} files and folders"):
        take_snapshot(folder)
