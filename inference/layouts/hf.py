"""Hugging Face ``save_pretrained`` layout: ``config.json`` plus single or sharded safetensors.

A safetensors file is whole when its size is ``8 + N + max(data end offset)``, where the first 8 bytes
are the little-endian header length ``N``. ``save_pretrained`` writes into the final directory with no
rename, so this check (and the caller's quiet period) is what keeps a half-written shard from being read.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from inference.layouts.base import Layout, LayoutSettings, Readiness, Snapshot, Verdict

NAME = "hf"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
#: A header larger than this is not a safetensors header (the format itself caps it at 100 MB).
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class ShardHeader:
    """What the first bytes of a safetensors file say about its full size."""

    expected_size: int | None
    #: Why the header could not give a size; ``None`` when it did.
    problem: str | None = None
    #: True if the problem may be a write in progress (too few bytes yet), False if the bytes are wrong.
    maybe_partial: bool = False


def read_shard_header(path: Path) -> ShardHeader:
    """Read a safetensors header (I/O edge). Raises ``FileNotFoundError`` if the file is gone."""
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            return ShardHeader(None, "shorter than its 8-byte header length", maybe_partial=True)
        (length,) = struct.unpack("<Q", prefix)
        if length == 0 or length > MAX_HEADER_BYTES:
            return ShardHeader(None, f"header length {length} is not a safetensors header")
        raw = handle.read(length)
    if len(raw) < length:
        return ShardHeader(None, f"header cut short ({len(raw)} of {length} bytes)", maybe_partial=True)
    return header_expected_size(raw, length)


def header_expected_size(raw: bytes, length: int) -> ShardHeader:
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return ShardHeader(None, f"header is not JSON ({exc})")
    if not isinstance(header, dict):
        return ShardHeader(None, "header is not a JSON object")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return ShardHeader(None, f"tensor {name!r} has no valid data_offsets")
        end = max(end, offsets[1])
    return ShardHeader(8 + length + end)


def weight_files(snapshot: Snapshot, index_text: str | None) -> tuple[list[str], str | None]:
    """The safetensors files the checkpoint needs, or why that cannot be known yet (pure)."""
    names = snapshot.names()
    if INDEX_FILE in names:
        if index_text is None:
            return [], f"{INDEX_FILE} could not be read"
        try:
            index = json.loads(index_text)
            weight_map = index["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            return [], f"{INDEX_FILE} does not parse: {exc}"
        if not shards or not all(isinstance(s, str) for s in shards):
            return [], f"{INDEX_FILE} has an empty or malformed weight_map"
        return shards, None
    if SINGLE_FILE in names:
        return [SINGLE_FILE], None
    return [], None


def assess(
    snapshot: Snapshot,
    *,
    config_text: str | None,
    index_text: str | None,
    headers: dict[str, ShardHeader],
) -> Verdict:
    """Readiness of a ``save_pretrained`` directory from its snapshot and small files (pure).

    ``headers`` holds the header of each weight file that exists, keyed by relative path.
    """
    names = snapshot.names()
    if CONFIG_FILE not in names:
        return Verdict(Readiness.INCOMPLETE, f"no {CONFIG_FILE}")
    shards, problem = weight_files(snapshot, index_text)
    if problem is not None:
        # An index that does not parse may be half-written; it turns invalid only if it stays that way.
        return Verdict(Readiness.INCOMPLETE, problem)
    if not shards:
        return Verdict(Readiness.INCOMPLETE, f"no weights ({SINGLE_FILE} or {INDEX_FILE})")
    missing = [s for s in shards if s not in names]
    if missing:
        return Verdict(Readiness.INCOMPLETE, f"shard {missing[0]} named in {INDEX_FILE} is missing")
    for shard in shards:
        header = headers.get(shard)
        if header is None:
            return Verdict(Readiness.INCOMPLETE, f"{shard}: header not read yet")
        if header.problem is not None:
            kind = Readiness.INCOMPLETE if header.maybe_partial else Readiness.INVALID
            return Verdict(kind, f"{shard}: {header.problem}")
        size = snapshot.size(shard)
        if header.expected_size is not None and size is not None:
            if size < header.expected_size:
                return Verdict(
                    Readiness.INCOMPLETE, f"{shard}: truncated ({size} of {header.expected_size} bytes)"
                )
            if size > header.expected_size:
                return Verdict(
                    Readiness.INVALID, f"{shard}: {size - header.expected_size} bytes past the tensor data"
                )
    try:
        config = json.loads(config_text) if config_text is not None else None
    except json.JSONDecodeError as exc:
        # The trainer writes the config before the weights, so once the weights are whole it is final.
        return Verdict(Readiness.INVALID, f"{CONFIG_FILE} is not valid JSON: {exc}")
    if not isinstance(config, dict):
        return Verdict(Readiness.INVALID, f"{CONFIG_FILE} is not a JSON object")
    return Verdict.complete()


def looks_like(snapshot: Snapshot) -> bool:
    names = snapshot.names()
    return bool({CONFIG_FILE, SINGLE_FILE, INDEX_FILE} & names)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        return "\ufffd"  # not UTF-8: the JSON check reports it


def inspect(directory: Path, snapshot: Snapshot) -> Verdict:
    """Read what :func:`assess` needs from ``directory`` (I/O edge) and judge it."""
    index_text = _read_text(directory / INDEX_FILE) if INDEX_FILE in snapshot.names() else None
    shards, _ = weight_files(snapshot, index_text)
    headers = {}
    for shard in shards:
        if shard in snapshot.names():
            try:
                headers[shard] = read_shard_header(directory / shard)
            except FileNotFoundError:
                continue
    return assess(
        snapshot, config_text=_read_text(directory / CONFIG_FILE), index_text=index_text, headers=headers
    )


class HfLayout(Layout):
    """``save_pretrained`` output, as AReaL and most trainers write their final or periodic models."""

    name = NAME

    def recognise(self, directory: Path, snapshot: Snapshot) -> bool:
        return looks_like(snapshot)

    def inspect(self, directory: Path, snapshot: Snapshot, settings: LayoutSettings) -> Verdict:
        return inspect(directory, snapshot)
