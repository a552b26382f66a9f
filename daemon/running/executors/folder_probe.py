"""The job folder probe's other folders: besides ``job_dir``, those the compute nodes must see too (an s3
run's ``[runs.s3] cache_dir``, whose downloaded copies the workers load).

A probe's folder (``<job_dir>/.probe-<id>``) holds the ``token`` its job reads back; each other folder
(made where missing) gets the same token in ``<folder>/.probe-<id>.token``, listed with what the folder
is in the probe's ``also.json``. The job writes ``seen``: ``<token> <host>``, then one line for each
listed file, what it read there (empty where it could not). Whatever the answer, the listed files are
removed (:func:`remove`; the Slurm clean-up does it too for a probe nobody read).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

from daemon.running.executors.base import SharedFolder

MANIFEST = "also.json"


def make(job_dir: Path, also: Sequence[SharedFolder]) -> tuple[Path, list[Path]]:
    """A new probe's folder under ``job_dir`` with its ``token``, the token placed in each folder of
    ``also`` too (:func:`place`); the folder and those files. An :class:`OSError` leaves nothing."""
    folder = job_dir / f".probe-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    token = uuid.uuid4().hex
    try:
        (folder / "token").write_text(token, encoding="utf-8")
        files = place(folder, token, also)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder, files


def token_file(probe: Path, folder: Path) -> Path:
    """Where the probe whose folder is ``probe`` writes its token in ``folder``."""
    return folder / f"{probe.name}.token"


def place(probe: Path, token: str, also: Sequence[SharedFolder]) -> list[Path]:
    """Write ``token`` into each folder of ``also`` (made where missing), listed in the probe's
    ``also.json`` first; the files, in order. An :class:`OSError` removes what was written, and is
    raised."""
    files = [token_file(probe, shared.path) for shared in also]
    listed = [{"file": str(f), "what": s.what} for f, s in zip(files, also, strict=True)]
    (probe / MANIFEST).write_text(json.dumps(listed, indent=1), encoding="utf-8")
    try:
        for shared, file in zip(also, files, strict=True):
            shared.path.mkdir(parents=True, exist_ok=True)
            file.write_text(token, encoding="utf-8")
    except OSError:
        remove(probe)
        raise
    return files


def _listed(probe: Path) -> list[tuple[Path, str]]:
    try:
        entries = json.loads((probe / MANIFEST).read_text(encoding="utf-8"))
        return [(Path(e["file"]), str(e["what"])) for e in entries]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def unread(probe: Path, token: str, seen: str) -> list[tuple[str, Path]]:
    """What each listed folder is, and its token file, where the job's ``seen`` does not hold the token."""
    lines = seen.split("\n")[1:]
    missed = []
    for index, (file, what) in enumerate(_listed(probe)):
        read = lines[index].strip() if index < len(lines) else ""
        if read != token:
            missed.append((what, file))
    return missed


def remove(probe: Path) -> None:
    """Remove the token files the probe's ``also.json`` lists (those already gone are no matter)."""
    for file, _ in _listed(probe):
        with contextlib.suppress(OSError):
            file.unlink(missing_ok=True)


def not_shared(missed: Sequence[tuple[str, Path]], *, nodes: str, runner: str) -> str:
    """The message for folders the probe's job could not read: ``nodes`` (``the compute nodes``) did not
    see them, ``runner`` (``a job on node1``) could not read the file."""
    said = "; ".join(
        f"{what} is not shared with {nodes}: {runner} could not read {file}" for what, file in missed
    )
    them = "it" if len(missed) == 1 else "them"
    return f"{said}; put {them} on the filesystem the nodes share (as job_dir)"
