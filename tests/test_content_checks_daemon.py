"""Issue 41 against a real daemon: six bad folders numbered above two good checkpoints, present before
``evald run`` starts (backlog newest first), on SQLite and PostgreSQL.

The six are the inputs that each cost a worker run (or three) before: ``config.json`` with NaN, a key
twice in it, ``vocab_size`` 2^31, a sparse 1 TB safetensors file with consistent offsets, a
``tokenizer.json`` nested 100,000 deep, tensor shapes that contradict ``config.json``. The scan refuses
each by name at its first look, with no job, so the good checkpoints are the first ones evaluated. A
seventh folder passes the scan (its tokenizer is strict JSON that only the tokenizers library refuses): it
costs one worker run, failed ``checkpoint_invalid`` at its first attempt, not a crash retried.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from storage.database import Database
from tests.checkpoints import copy_checkpoint
from tests.conftest import TOY_SAVE_EVERY, ToyRun
from tests.harness import checkpoints, jobs, running_daemon, upgraded, wait_for, write_config, write_dataset

pytestmark = pytest.mark.slow

GOOD = (TOY_SAVE_EVERY, 2 * TOY_SAVE_EVERY)
#: The folder that passes the scan and fails at load.
AT_LOAD = 107


def _config(change: dict[str, object]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config.update(change)
        (folder / "config.json").write_text(json.dumps(config))  # NaN is written as NaN

    return edit


def _duplicate_key(folder: Path) -> None:
    text = (folder / "config.json").read_text()
    hidden = json.loads(text)["hidden_size"]
    (folder / "config.json").write_text(text.replace("{", f'{{"hidden_size": {hidden}, ', 1))


def _sparse_terabyte(folder: Path) -> None:
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    end = max(t["data_offsets"][1] for n, t in header.items() if n != "__metadata__")
    header["extra.weight"] = {"dtype": "U8", "shape": [2**40], "data_offsets": [end, end + 2**40]}
    raw = json.dumps(header).encode()
    with weights.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw + data[8 + length :])
        handle.truncate(8 + len(raw) + end + 2**40)  # a hole: nothing of the terabyte is written


def _deep_tokenizer(folder: Path) -> None:
    (folder / "tokenizer.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)


def _unloadable_tokenizer(folder: Path) -> None:
    (folder / "tokenizer.json").write_text('{"version": "1.0", "added_tokens": [], "model": 5}')


def _bad_folders(root: Path, trained: Path) -> dict[str, str]:
    """Six bad folders above the good ones; returns name → what its reason must contain."""
    vocab = json.loads((trained / "config.json").read_text())["vocab_size"]
    bad: dict[int, tuple[Callable[[Path], None], str]] = {
        101: (_config({"rms_norm_eps": float("nan")}), "config.json holds NaN"),
        102: (_duplicate_key, "config.json holds the key 'hidden_size' twice"),
        103: (_config({"vocab_size": 2**31}), "vocab_size is 2147483648, outside the plausible"),
        104: (_sparse_terabyte, "weights implausible for config.json"),
        105: (_deep_tokenizer, "tokenizer.json holds JSON nested too deep to parse"),
        106: (_config({"vocab_size": vocab + 1}), f"config.json gives [{vocab + 1}, "),
    }
    expected = {}
    for step, (change, reason) in bad.items():
        folder = copy_checkpoint(trained, root / f"step_{step}")
        change(folder)
        expected[folder.name] = reason
    return expected


def _ended(database: Database) -> dict[int | None, str] | None:
    found = {j.step: j.state for j in jobs(database)}
    wanted = {*GOOD, AT_LOAD}
    done = set(found) == wanted and all(state in ("succeeded", "failed") for state in found.values())
    return found if done else None


def test_bad_content_is_refused_by_the_scan_and_the_good_checkpoints_go_first(
    database_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(database_url)
    dataset = write_dataset(tmp_path / "arith.jsonl", 6)
    # invalid_after_secs far away: nothing here may wait for it to be named.
    config = write_config(tmp_path, database_url, dataset=dataset, quiet=0.5, invalid_after=3600.0)
    root = tmp_path / "run"
    for step in GOOD:
        copy_checkpoint(toy_run.path / f"step_{step}", root / f"step_{step}")
    expected = _bad_folders(root, toy_run.last_checkpoint)
    copy_checkpoint(toy_run.last_checkpoint, root / f"step_{AT_LOAD}", _unloadable_tokenizer)

    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        ended = wait_for(lambda: _ended(database), 240, "the good jobs and the load failure", daemon.process)
        rows = {c.name: c for c in checkpoints(database)}
        assert daemon.stop() == 0

    assert ended == {GOOD[0]: "succeeded", GOOD[1]: "succeeded", AT_LOAD: "failed"}
    for name, reason in expected.items():
        assert rows[name].state == "invalid", (name, rows[name])
        assert reason in (rows[name].reason or ""), (name, rows[name].reason)
    (failed,) = [j for j in jobs(database) if j.step == AT_LOAD]
    assert (failed.error_kind, failed.attempts) == ("checkpoint_invalid", 1), failed
    assert "cannot load the tokenizer" in (failed.error or "")
    database.dispose()
