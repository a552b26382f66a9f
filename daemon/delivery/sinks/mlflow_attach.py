"""Finding the trainer's MLflow run: the places a trainer leaves its run id, and the tracking server's search.

Candidates, in the order the sink tries them (each checked to exist on the tracker's server):

1. ``run_ids`` in the tracker's config;
2. ``<run root>/mlflow_run_id``: a file the trainer writes, holding the id alone or a line
   ``MLFLOW_RUN_ID=<id>`` (what HF's callback and ``mlflow.start_run`` take to resume a run);
3. a local store under the run root: ``mlflow.db`` (MLflow 3's default ``sqlite:///mlflow.db``) or
   ``mlruns/`` (the older file store): its newest active run;
4. the tracking server's search in the tracker's ``experiment``: the newest active run named
   ``trainer_run_name`` and holding ``trainer_tags`` where either is configured, else the newest whose
   ``output_dir`` parameter is the run root (HF Trainer's ``MLflowCallback`` logs every training
   argument, ``output_dir`` among them).

The disk reads are plain functions over a folder; nothing here writes to the trainer's files.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Mapping
from pathlib import Path

from daemon.delivery.errors import DeliveryError

#: The file a trainer writes its MLflow run id into, at the run root.
RUN_ID_FILE = "mlflow_run_id"
#: A local MLflow SQLite store's file name (``mlflow``'s default tracking URI ``sqlite:///mlflow.db``).
LOCAL_DB = "mlflow.db"
#: The training argument HF Trainer logs (as an MLflow param) that names the checkpoints' folder.
OUTPUT_DIR_PARAM = "output_dir"

_RUN_ID = re.compile(r"^[0-9a-fA-F]{32}$")


class AttachFileError(DeliveryError):
    """A run id file that is there but does not hold a run id: the message names the file and the fix."""


def run_id_from_file(root: Path) -> str | None:
    """The run id in ``root/mlflow_run_id``: the id alone, or ``MLFLOW_RUN_ID=<id>`` (blank lines and
    ``#`` comments skipped); None where the file is not there."""
    path = root / RUN_ID_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AttachFileError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "=" in line:
            key, _, value = line.partition("=")
            if key.strip().removeprefix("export ").strip() != "MLFLOW_RUN_ID":
                continue
            line = value.strip().strip("'\"")
        if _RUN_ID.match(line):
            return line.lower()
        break
    raise AttachFileError(
        f"{path}: no MLflow run id in it (write the 32-hex-digit id alone, or a line MLFLOW_RUN_ID=<id>)"
    )


def run_id_from_sqlite(root: Path) -> str | None:
    """The newest active run in ``root/mlflow.db``, read only (the trainer's store is never changed, nor
    migrated); None where there is no such file or no run in it."""
    path = root / LOCAL_DB
    if not path.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            row = db.execute(
                "SELECT run_uuid FROM runs WHERE lifecycle_stage = 'active' ORDER BY start_time DESC LIMIT 1"
            ).fetchone()
    except sqlite3.Error as exc:
        raise AttachFileError(f"{path}: not a readable MLflow store ({exc})") from exc
    return None if row is None else str(row[0])


def run_id_from_mlruns(root: Path) -> str | None:
    """The newest run id a trainer's local MLflow file store left under ``root/mlruns``."""
    newest: tuple[float, str] | None = None
    for meta in root.glob("mlruns/*/*/meta.yaml"):
        try:
            text = meta.read_text(encoding="utf-8")
            mtime = meta.stat().st_mtime
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("run_id:"):
                run_id = line.split(":", 1)[1].strip().strip("'\"")
                if run_id and (newest is None or mtime > newest[0]):
                    newest = (mtime, run_id)
    return None if newest is None else newest[1]


def on_disk(root: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """(where, run id) for each place under ``root`` that names a run, in the order they are trusted, and
    what could not be read (each naming the file and the fix): one bad file does not hide the others."""
    found: list[tuple[str, str]] = []
    problems: list[str] = []
    for where, read in (
        (root / RUN_ID_FILE, run_id_from_file),
        (root / LOCAL_DB, run_id_from_sqlite),
        (root / "mlruns", run_id_from_mlruns),
    ):
        try:
            run_id = read(root)
        except AttachFileError as exc:
            problems.append(str(exc))
            continue
        if run_id is not None:
            found.append((str(where), run_id))
    return found, problems


def _quoted(value: str) -> str:
    """``value`` as a string in MLflow's search syntax."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def search_filter(*, run: str, root: str, run_name: str | None, tags: Mapping[str, str]) -> tuple[str, str]:
    """(MLflow filter string, the same for the log) finding the trainer's run of evald run ``run``."""
    if run_name is None and not tags:
        return f"params.`{OUTPUT_DIR_PARAM}` = {_quoted(root)}", f"param {OUTPUT_DIR_PARAM} = {root}"
    clauses = []
    if run_name is not None:
        clauses.append(f"attributes.run_name = {_quoted(run_name.replace('{run}', run))}")
    clauses += [f"tags.`{key}` = {_quoted(value)}" for key, value in sorted(tags.items())]
    return " and ".join(clauses), " and ".join(clauses)
