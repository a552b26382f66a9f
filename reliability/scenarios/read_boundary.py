"""The read boundary beside good checkpoints: the inputs that stopped, stalled or fooled the daemon.

Into the watched run go, before the daemon starts and again while it runs: a checkpoint holding a folder
nested 3,000 deep (it stopped the daemon at start and killed every watch), ``config.json`` with ``NaN``,
with a key twice, with ``vocab_size`` 2^31, a sparse 1 TB ``model.safetensors`` whose offsets agree with
its size, a ``tokenizer.json`` nested 100,000 deep, weights whose shapes contradict ``config.json``, a
checkpoint of many small files (200,000; 25,000 in ``--short``), ``model.safetensors`` that is a directory,
a dangling link, empty, or shorter than its header says, a plain file ``step_N``, and a folder name of 249
characters. Beside them good checkpoints arrive one by one, and a DeepSpeed-style save_dir (``ds2/``: the
model's ``config.json`` and ``latest`` beside its tag folders) gains a tag while the daemon runs.

Counted: every good checkpoint (each save_dir tag too) evaluated once (``lost``, ``duplicated``) within
``ON_TIME_SECS`` of being written (``late``), with the delay's p95 in the notes; each bad item refused
(``invalid`` or ignored, never a job: ``unrefused``) and named by exactly one log line per daemon start
(``misnamed``); no daemon exit nobody asked for (``crashes``); the daemon's peak resident memory in the
notes, sampled through the run.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import struct
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psutil
from sqlalchemy import select

from reliability import checkpoints
from reliability.figures import Expected, Figures
from reliability.scenarios.base import Options
from reliability.scenarios.poison_items import daemon_logs, delays
from reliability.workspace import TASK, RunSpec, Workspace, wait_for, workspace, write_dataset
from storage.models import Checkpoint, CheckpointState, EvalJob, IgnoredFolder
from tests import deep_trees

#: A good checkpoint is evaluated on time if its result is stored within this long of its last write.
ON_TIME_SECS = 240.0
TERABYTE = 1 << 40


def _config(edit: Callable[[str], str]) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        path = folder / "config.json"
        path.write_text(edit(path.read_text()))

    return make


def _json_field(key: str, value: str) -> Callable[[str], str]:
    """``config.json`` with ``key`` set to ``value`` as written (``NaN`` is no JSON, so text is edited)."""

    def edit(text: str) -> str:
        body = json.loads(text)
        body[key] = "@@"
        return json.dumps(body).replace('"@@"', value)

    return edit


def _twice(text: str) -> str:
    return text.replace("{", '{"model_type": "gpt2", ', 1)


def _sparse_terabyte(folder: Path) -> None:
    """A header whose one tensor ends exactly at the file's end: 1 TB, sparse (no disk used)."""
    count = (TERABYTE - 4096) // 4
    tensor = {"dtype": "F32", "shape": [count], "data_offsets": [0, count * 4]}
    header = json.dumps({"model.embed_tokens.weight": tensor})
    header += " " * (-len(header) % 8)
    path = folder / "model.safetensors"
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header.encode())
        handle.truncate(8 + len(header) + count * 4)


def _wrong_shapes(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] = config["hidden_size"] * 2
    (folder / "config.json").write_text(json.dumps(config))


def _weights(make: Callable[[Path], object]) -> Callable[[Path], None]:
    def replace(folder: Path) -> None:
        (folder / "model.safetensors").unlink()
        make(folder / "model.safetensors")

    return replace


def _short_weights(path: Path) -> None:
    data = (checkpoints.toy_checkpoint() / "model.safetensors").read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _many_files(count: int) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        spill = folder / "spill"
        spill.mkdir()
        for index in range(count):
            (spill / f"{index}.txt").touch()

    return make


def _deep(folder: Path) -> None:
    deep_trees.make(folder / "nest", 3000)


def bad_folders(many: int) -> dict[str, Callable[[Path], None]]:
    """Suffix → what makes a copy of the toy checkpoint bad."""
    return {
        "deep_tree": _deep,
        "nan": _config(_json_field("rms_norm_eps", "NaN")),
        "twice": _config(_twice),
        "vocab": _config(_json_field("vocab_size", str(2**31))),
        "terabyte": _sparse_terabyte,
        "tokenizer": lambda f: (f / "tokenizer.json").write_text("[" * 100_000),
        "shapes": _wrong_shapes,
        "many_files": _many_files(many),
        "weights_dir": _weights(lambda p: p.mkdir()),
        "dangling": _weights(lambda p: p.symlink_to(p.parent / "gone.safetensors")),
        "empty": _weights(lambda p: p.write_bytes(b"")),
        "short": _weights(_short_weights),
    }


def write_bad(root: Path, staging: Path, base: int, many: int) -> list[str]:
    """Each bad folder made whole in ``staging`` and renamed in (the daemon never sees it good), the plain
    file and the long name; the names written."""
    names = []
    staging.mkdir(parents=True, exist_ok=True)
    for offset, (_, make) in enumerate(bad_folders(many).items()):
        name = f"step_{base + offset}"
        made = staging / name
        shutil.copytree(checkpoints.toy_checkpoint(), made)
        make(made)
        made.rename(root / name)
        names.append(name)
    stray = f"step_{base + 50}"
    (root / stray).write_bytes(b"PK\x03\x04")
    long_name = f"step_{base + 60}" + "x" * 240
    shutil.copytree(checkpoints.toy_checkpoint(), root / long_name)
    return [*names, stray, long_name]


def write_save_dir_tag(root: Path, step: int) -> str:
    """A tag folder into ``ds2/`` (made with the model's config.json beside it), then ``latest`` moved on."""
    save_dir = root / "ds2"
    save_dir.mkdir(exist_ok=True)
    shutil.copy(checkpoints.toy_checkpoint() / "config.json", save_dir / "config.json")
    shutil.copytree(checkpoints.toy_checkpoint(), save_dir / f"step_{step}")
    (save_dir / "latest").write_text(f"step_{step}")
    return f"ds2/step_{step}"


class _Memory:
    """The daemon's peak resident memory, sampled on a thread of its own (each start's process)."""

    def __init__(self, ws: Workspace) -> None:
        self._ws, self.peak, self.ready = ws, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> _Memory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def now(self) -> int:
        """The daemon's resident memory now (0 when it is not running)."""
        supervisor = self._ws.supervisor
        pid = supervisor.pid if supervisor is not None else None
        try:
            return psutil.Process(pid).memory_info().rss if pid is not None else 0
        except psutil.Error:
            return 0

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self.now())


def run(options: Options) -> Figures:
    figures = Figures("the read boundary beside good checkpoints")
    with workspace("read-boundary", options.workdir) as ws:
        root = ws.folder / "runs" / "toy"
        try:
            _run(options, ws, root, figures)
        finally:
            for nest in root.glob("*/nest"):
                deep_trees.remove(nest)  # deeper than shutil.rmtree's recursion when the workspace goes
        return figures


def _run(options: Options, ws: Workspace, root: Path, figures: Figures) -> None:
    good = options.pick(short=2, full=5)
    many = options.pick(short=25_000, full=200_000)
    root.mkdir(parents=True)
    ws.write_config([RunSpec("toy", root)], dataset=write_dataset(ws.folder / "arith.jsonl", 4))
    ws.upgrade()
    bad = write_bad(root, ws.folder / "staging", 7000, many)  # there before the start-up scan
    written: dict[str, datetime] = {write_save_dir_tag(root, 5000): datetime.now(UTC)}
    try:
        with _Memory(ws) as memory:
            ws.start_daemon()
            memory.ready = memory.now()  # the start-up scan has met the first bad items by then
            for step in range(1, good + 1):
                if step == 2:
                    bad += write_bad(root, ws.folder / "staging", 7100, many)
                    written[write_save_dir_tag(root, 5001)] = datetime.now(UTC)
                checkpoints.write(root, step)
                written[f"step_{step}"] = datetime.now(UTC)
                time.sleep(2.0)
            wait_for(lambda: ws.jobs_settled(len(written)), 900, "every good checkpoint's job")
        figures.notes.append(
            f"daemon RSS {memory.ready / 2**20:.0f} MB at daemon.ready, {memory.peak / 2**20:.0f} MB at peak"
        )
    except (TimeoutError, AssertionError) as exc:
        figures.notes.append(str(exc))
    figures.written = len(written)
    expected = Expected(due=frozenset(f"toy/{name}" for name in written), tasks=(TASK,))
    ws.finish(figures, expected)
    count_bad(figures, ws, bad, written)


def _said(log: Path) -> list[str]:
    """The warning and error lines of one daemon start's JSON log."""
    lines = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("level") in ("warning", "error"):
            lines.append(line)
    return lines


def count_bad(figures: Figures, ws: Workspace, bad: list[str], written: dict[str, datetime]) -> None:
    """Refused and named once each; the good checkpoints' delays."""
    database = ws.database()
    try:
        with database.session() as session:
            rows = session.execute(select(Checkpoint.id, Checkpoint.name, Checkpoint.state)).all()
            ignored = set(session.scalars(select(IgnoredFolder.name)).all())
            jobs = session.execute(
                select(EvalJob.checkpoint_id, EvalJob.task, EvalJob.state, EvalJob.finished_at)
            ).all()
    finally:
        database.dispose()
    names = {checkpoint_id: name for checkpoint_id, name, _ in rows}
    by_start = [_said(p) for p in daemon_logs(ws)]
    figures.poison = len(bad)
    said = []
    for name in bad:
        states = [state for _, row_name, state in rows if row_name == name]
        has_job = any(names.get(j.checkpoint_id) == name for j in jobs)
        invalid = bool(states) and all(s == CheckpointState.INVALID for s in states)
        refused = not has_job and (name in ignored or invalid)
        pattern = re.compile(re.escape(name) + r"(?![0-9x])")
        per_start = [sum(1 for line in lines if pattern.search(line)) for lines in by_start]
        if not refused:
            figures.poison_unrefused += 1
        if sum(per_start) == 0 or max(per_start) > 1:
            figures.poison_misnamed += 1
            said.append(f"{name[:20]} named {'+'.join(map(str, per_start))}")
    figures.notes.append(f"bad items: {len(bad)} tried" + (f"; {'; '.join(said)}" if said else ""))
    waits = list(delays(written, jobs, names).values())
    late = [w for w in waits if w > ON_TIME_SECS]
    figures.late += len(late)
    if waits:
        p95 = statistics.quantiles(waits, n=20, method="inclusive")[-1] if len(waits) > 1 else waits[0]
        figures.notes.append(f"good checkpoints' delay write→result: p95 {p95:.0f} s, max {max(waits):.0f} s")
