"""Hugging Face ``save_pretrained`` layout: ``config.json`` plus safetensors or ``pytorch_model*.bin``.

A safetensors file is whole when its size is ``8 + N + max(data end offset)``, where the first 8 bytes
are the little-endian header length ``N``. A ``.bin`` file (``torch.save``'s zip format) is whole when it
ends in a zip end-of-central-directory record whose central directory ends right before it: ``torch.save``
writes that record last. ``save_pretrained`` writes into the final directory with no rename, so these
checks (and the caller's quiet period) are what keep a half-written shard from being read.

Loading is a trust boundary: ``.bin`` weights are read only with ``torch.load(weights_only=True)`` and
rewritten as safetensors before transformers sees the folder, so transformers only ever reads
safetensors; ``training_args.bin`` and other pickles are never opened.
"""

from __future__ import annotations

import json
import pickle
import shutil
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from inference.errors import CheckpointInvalid, FileRefused
from inference.layouts import files, unpickling, validation
from inference.layouts.base import FileStat, Layout, LayoutSettings, Readiness, Shape, Snapshot, Verdict
from inference.layouts.validation import Tensor

if TYPE_CHECKING:
    import torch

NAME = "hf"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
BIN_SINGLE_FILE = "pytorch_model.bin"
BIN_INDEX_FILE = "pytorch_model.bin.index.json"
CONFIG_FILE = "config.json"
#: Files copied beside converted weights: config, generation config, tokenizer and chat template.
#: Pickles (``training_args.bin``) and weights are never copied.
SIDE_FILE_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken")
#: A header larger than this is not a safetensors header (the format itself caps it at 100 MB).
MAX_HEADER_BYTES = 100 * 1024 * 1024
#: A ``torch.save`` zip lists one entry per tensor storage: a model's thousands fit in a few MB.
MAX_CENTRAL_DIRECTORY_BYTES = 64 * 1024 * 1024
#: JSON files transformers reads from a checkpoint besides ``config.json`` and the index: the tokenizer's.
#: ``generation_config.json`` is not among them: transformers skips one it cannot read.
TOKENIZER_JSON_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "chat_template.json",
)


@dataclass(frozen=True)
class ShardHeader:
    """What the first bytes of a safetensors file say about its full size."""

    expected_size: int | None
    #: Why the header could not give a size; ``None`` when it did.
    problem: str | None = None
    #: True if the problem may be a write in progress (too few bytes yet), False if the bytes are wrong.
    maybe_partial: bool = False
    #: True if the header, read whole, is wrong whatever comes next (a tensor whose offsets do not fit
    #: its shape, a key twice): refused at once.
    final: bool = False
    #: The tensors it declares, in data order (none for a ``.bin`` file or a header with a problem).
    tensors: tuple[Tensor, ...] = ()


def read_shard_header(path: Path) -> ShardHeader:
    """Read a safetensors header (I/O edge). Raises ``FileNotFoundError`` if the file is gone and
    :class:`FileRefused` if it is not a regular file."""
    with files.opened(path) as handle:
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


_ZIP_LOCAL = b"PK\x03\x04"
_ZIP_END = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_END = b"PK\x06\x06"
_ZIP64_RECORD_SIZE = 56
_ZIP_END_SIZE = 22
_ZIP64_LOCATOR_SIZE = 20


def read_torch_zip_end(path: Path) -> ShardHeader:
    """Whether a ``torch.save`` file is whole, from its last bytes (I/O edge; no unpickling).

    ``torch.save`` writes the zip's central directory and end records last, with no comment, so a whole
    file ends in the 22-byte end record, and its central directory ends where the end records begin (the
    zip64 end record, which torch always writes, or the plain one). A file cut anywhere else fails one of
    these checks. Raises ``FileNotFoundError`` if the file is gone and :class:`FileRefused` if it is not a
    regular file.
    """
    with files.opened(path) as handle:
        return _torch_zip_end(handle)


def _torch_zip_end(handle: IO[bytes]) -> ShardHeader:
    start = handle.read(4)
    size = handle.seek(0, 2)
    if len(start) < 4:
        return ShardHeader(None, "shorter than a zip header", maybe_partial=True)
    if start != _ZIP_LOCAL:
        return ShardHeader(
            None,
            "not a zip-format torch.save file (the legacy format cannot be checked for completeness;"
            " re-save it with torch.save's defaults or as safetensors)",
        )
    if size < 4 + _ZIP_END_SIZE + _ZIP64_LOCATOR_SIZE:
        return ShardHeader(None, "zip end record not written yet", maybe_partial=True)
    handle.seek(size - _ZIP_END_SIZE - _ZIP64_LOCATOR_SIZE)
    tail = handle.read(_ZIP_END_SIZE + _ZIP64_LOCATOR_SIZE)
    end = tail[_ZIP64_LOCATOR_SIZE:]
    if end[:4] != _ZIP_END or end[20:22] != b"\x00\x00":
        return ShardHeader(None, "zip end record not written yet", maybe_partial=True)
    cd_size, cd_offset = struct.unpack("<II", end[12:20])
    cd_end = size - _ZIP_END_SIZE
    if tail[:4] == _ZIP64_LOCATOR:
        # torch writes zip64 records: the central directory ends where the zip64 end record begins.
        (record_offset,) = struct.unpack("<Q", tail[8:16])
        if record_offset + _ZIP64_RECORD_SIZE != size - _ZIP_END_SIZE - _ZIP64_LOCATOR_SIZE:
            return ShardHeader(None, "zip64 end record does not match the file size", maybe_partial=True)
        handle.seek(record_offset)
        record = handle.read(_ZIP64_RECORD_SIZE)
        if record[:4] != _ZIP64_END:
            return ShardHeader(None, "zip64 end record missing", maybe_partial=True)
        cd_size, cd_offset = struct.unpack("<QQ", record[40:56])
        cd_end = record_offset
    if cd_offset + cd_size != cd_end:
        return ShardHeader(None, "zip end record does not match the file size", maybe_partial=True)
    if cd_size > MAX_CENTRAL_DIRECTORY_BYTES:
        # zipfile would hold every entry in memory: a crafted directory of millions is refused unread.
        return ShardHeader(
            None, f"zip central directory is {cd_size} bytes, more than {MAX_CENTRAL_DIRECTORY_BYTES}"
        )
    try:
        handle.seek(0)
        with zipfile.ZipFile(handle) as archive:
            names = archive.namelist()
    except zipfile.BadZipFile as exc:
        return ShardHeader(None, f"not a readable zip file ({exc})")
    if not any(name.endswith("/data.pkl") or name == "data.pkl" for name in names):
        return ShardHeader(None, "zip file holds no torch.save data.pkl")
    return ShardHeader(size)


def header_expected_size(raw: bytes, length: int) -> ShardHeader:
    """What a safetensors header read whole (``raw``, ``length`` bytes) says (pure): the file's size, or
    why the header is wrong. Bytes that are not JSON may be a file preallocated and not written yet;
    JSON read whole that is not strict, or tensors that do not fit their offsets, are final."""
    try:
        header = files.parse_json(raw.decode("utf-8"), "header")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return ShardHeader(None, f"header is not JSON ({exc})")
    except FileRefused as exc:
        return ShardHeader(None, f"header {exc.problem}", final=True)
    if not isinstance(header, dict):
        return ShardHeader(None, "header is not a JSON object", final=True)
    tensors, problem = validation.header_tensors(header)
    if problem is not None:
        return ShardHeader(None, problem, final=True)
    end = tensors[-1].end if tensors else 0
    return ShardHeader(8 + length + end, tensors=tensors)


def index_file(snapshot: Snapshot) -> str | None:
    """The weight index the checkpoint uses, safetensors first (pure)."""
    names = snapshot.names()
    for name in (INDEX_FILE, BIN_INDEX_FILE):
        if name in names:
            return name
    return None


def weight_files(snapshot: Snapshot, index_text: str | None) -> tuple[list[str], str | None]:
    """The weight files the checkpoint needs, or why that cannot be known yet (pure).

    Safetensors win over ``.bin`` when both are there, as transformers itself prefers them. An index
    nested too deep raises :class:`FileRefused`: final, unlike one that does not parse (yet).
    """
    names = snapshot.names()
    index_name = index_file(snapshot)
    if SINGLE_FILE in names and index_name != INDEX_FILE:
        return [SINGLE_FILE], None
    if index_name is not None:
        if index_text is None:
            return [], f"{index_name} could not be read"
        try:
            index = files.parse_json(index_text, index_name)
            weight_map = index["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            return [], f"{index_name} does not parse: {exc}"
        if not shards or not all(isinstance(s, str) for s in shards):
            return [], f"{index_name} has an empty or malformed weight_map"
        return shards, None
    if BIN_SINGLE_FILE in names:
        return [BIN_SINGLE_FILE], None
    return [], None


def is_bin(name: str) -> bool:
    return not name.endswith(".safetensors")


def header_verdict(name: str, header: ShardHeader | None) -> Verdict | None:
    """Why the header of weights file ``name`` is not read yet or is wrong; ``None`` when it is fine
    (pure). A file too short for its header is ``invalid`` but not final: the caller's quiet period
    tells a write in progress from a file that stopped short."""
    if header is None:
        return Verdict(Readiness.INCOMPLETE, f"{name}: header not read yet")
    if header.problem is not None:
        return Verdict(Readiness.INVALID, f"{name}: {header.problem}", final=header.final)
    return None


def size_verdict(name: str, header: ShardHeader, size: int | None) -> Verdict | None:
    """Why weights file ``name`` is not the size its header says (pure). Shorter is ``invalid`` but not
    final: the quiet period tells a write in progress (the folder still changes) from a file cut short,
    which is named once the folder is quiet instead of after ``invalid_after_secs``."""
    if header.expected_size is not None and size is not None:
        if size < header.expected_size:
            return Verdict(Readiness.INVALID, f"{name}: truncated ({size} of {header.expected_size} bytes)")
        if size > header.expected_size:
            return Verdict(
                Readiness.INVALID, f"{name}: {size - header.expected_size} bytes past the tensor data"
            )
    return None


def shard_verdict(name: str, header: ShardHeader | None, size: int | None) -> Verdict | None:
    """Why the weights file ``name`` (its header read, its size on disk) is not whole yet or never will be;
    ``None`` when it is (pure)."""
    problem = header_verdict(name, header)
    if problem is not None or header is None:
        return problem
    return size_verdict(name, header, size)


def assess(
    snapshot: Snapshot,
    *,
    config_text: str | None,
    index_text: str | None,
    headers: dict[str, ShardHeader],
) -> Verdict:
    """Readiness of a ``save_pretrained`` directory from its snapshot and small files (pure).

    ``headers`` holds the header of each weight file that exists, keyed by relative path. What the
    headers and the config say against each other (:func:`validation.content_verdict`) is judged
    before the files' sizes: a header read whole and a parsed config are final, a file's size may
    still grow. Raises :class:`FileRefused` for a ``config.json`` or index that is not strict JSON (NaN,
    a key twice, nested too deep).
    """
    names = snapshot.names()
    if CONFIG_FILE not in names:
        return Verdict(Readiness.INCOMPLETE, f"no {CONFIG_FILE}")
    shards, problem = weight_files(snapshot, index_text)
    if problem is not None:
        # An index that does not parse may be half-written; it turns invalid only if it stays that way.
        return Verdict(Readiness.INCOMPLETE, problem)
    if not shards:
        return Verdict(
            Readiness.INCOMPLETE,
            f"no weights ({SINGLE_FILE}, {INDEX_FILE}, {BIN_SINGLE_FILE} or {BIN_INDEX_FILE})",
        )
    missing = [s for s in shards if s not in names]
    if missing:
        return Verdict(Readiness.INCOMPLETE, f"shard {missing[0]} named in {index_file(snapshot)} is missing")
    for shard in shards:
        problem_verdict = header_verdict(shard, headers.get(shard))
        if problem_verdict is not None:
            return problem_verdict
    unparsed: json.JSONDecodeError | None = None
    try:
        config = files.parse_json(config_text, CONFIG_FILE) if config_text is not None else None
    except json.JSONDecodeError as exc:
        config, unparsed = None, exc
    if isinstance(config, dict):
        contradiction = validation.content_verdict(config, {s: headers[s].tensors for s in shards})
        if contradiction is not None:
            return contradiction
    for shard in shards:
        problem_verdict = size_verdict(shard, headers[shard], snapshot.size(shard))
        if problem_verdict is not None:
            return problem_verdict
    if unparsed is not None:
        # The trainer writes the config before the weights, so once the weights are whole it is final.
        return Verdict(Readiness.INVALID, f"{CONFIG_FILE} is not valid JSON: {unparsed}")
    if not isinstance(config, dict):
        return Verdict(Readiness.INVALID, f"{CONFIG_FILE} is not a JSON object")
    return Verdict.complete()


def looks_like(snapshot: Snapshot) -> bool:
    names = snapshot.names()
    return bool({CONFIG_FILE, SINGLE_FILE, INDEX_FILE, BIN_SINGLE_FILE, BIN_INDEX_FILE} & names)


def broken_verdict(directory: Path, snapshot: Snapshot, shards: list[str]) -> Verdict | None:
    """A final verdict when a file the checkpoint needs is a directory or a link to nothing (I/O edge).

    Such a name is not in the snapshot (which lists files), so it would read as "not written yet" until
    ``invalid_after_secs``; but no trainer writes a file by first making a directory or a dangling link
    of its name. The weights looked for are the shards the index names, or every name weights may have
    while none is found.
    """
    needed = [CONFIG_FILE, *(shards or (SINGLE_FILE, INDEX_FILE, BIN_SINGLE_FILE, BIN_INDEX_FILE))]
    names = snapshot.names()
    for name in needed:
        if name in names:
            continue
        problem = files.not_a_file(directory / name)
        if problem is not None:
            return Verdict(Readiness.INVALID, f"{name} {problem}", final=True)
    return None


@files.judged
def inspect(directory: Path, snapshot: Snapshot) -> Verdict:
    """Read what :func:`assess` needs from ``directory`` (I/O edge) and judge it; once the rest is
    complete, the tokenizer's JSON files too (read only then: a tokenizer may be tens of MB)."""
    index_name = index_file(snapshot)
    index_text = files.read_text(directory / index_name) if index_name is not None else None
    shards, _ = weight_files(snapshot, index_text)
    broken = broken_verdict(directory, snapshot, shards)
    if broken is not None:
        return broken
    headers = {}
    for shard in shards:
        if shard in snapshot.names():
            read = read_torch_zip_end if is_bin(shard) else read_shard_header
            try:
                headers[shard] = read(directory / shard)
            except FileNotFoundError:
                continue
    verdict = assess(
        snapshot, config_text=files.read_text(directory / CONFIG_FILE), index_text=index_text, headers=headers
    )
    if verdict.readiness is not Readiness.COMPLETE:
        return verdict
    present = [name for name in TOKENIZER_JSON_FILES if name in snapshot.names()]
    texts = {name: files.read_text(directory / name) for name in present}
    return validation.tokenizer_verdict(texts) or verdict


class HfLayout(Layout):
    """``save_pretrained`` output, as AReaL and most trainers write their final or periodic models."""

    name = NAME

    def recognise(self, directory: Path, snapshot: Snapshot) -> bool:
        return looks_like(snapshot)

    def shape(self, directory: Path) -> Shape:
        return Shape.HF_EXPORT

    def inspect(self, directory: Path, snapshot: Snapshot, settings: LayoutSettings) -> Verdict:
        return inspect(directory, snapshot)

    def materialise(self, directory: Path, settings: LayoutSettings, scratch: Path) -> Path:
        return as_safetensors(directory, scratch)


def load_torch_file(path: Path) -> dict[str, torch.Tensor]:
    """A ``torch.save`` state dict, unpickled only as far as ``weights_only=True`` allows.

    A pickle that asks for anything beyond tensors and plain containers (a ``__reduce__`` calling
    ``os.system``) is refused by torch's restricted unpickler before it runs, and reported by file name.
    """
    import torch

    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointInvalid(
            f"{path}: refused to unpickle: it needs more than tensors (torch.load weights_only=True"
            f" said: {unpickling.refusal(exc)})"
        ) from exc
    except (RuntimeError, EOFError, zipfile.BadZipFile) as exc:
        raise CheckpointInvalid(f"{path}: not a readable torch.save file: {exc}") from exc
    if not isinstance(loaded, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        raise CheckpointInvalid(f"{path}: holds no flat name-to-tensor state dict")
    return dict(loaded)


def copy_side_files(source: Path, target: Path) -> None:
    """Copy config, generation config and tokenizer files (never weights or pickles) into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if not path.is_file() or not path.name.endswith(SIDE_FILE_SUFFIXES):
            continue
        if path.name in (INDEX_FILE, BIN_INDEX_FILE):
            continue
        shutil.copyfile(path, target / path.name)


def write_safetensors(state_dict: Mapping[str, torch.Tensor], target: Path) -> None:
    """Write ``state_dict`` as ``target/model.safetensors``; tied weights are written once per name.

    safetensors refuses tensors that share memory (tied embeddings in a ``.bin``), so a second name for
    the same storage gets its own copy.
    """
    from safetensors.torch import save_file

    seen: set[int] = set()
    tensors = {}
    for name, tensor in state_dict.items():
        key = tensor.untyped_storage().data_ptr()
        plain = tensor.detach().to("cpu").contiguous()
        tensors[name] = plain.clone() if key in seen else plain
        seen.add(key)
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / SINGLE_FILE), metadata={"format": "pt"})


def as_safetensors(directory: Path, scratch: Path) -> Path:
    """``directory`` itself when its weights are safetensors; else a safetensors copy in ``scratch``."""
    snapshot = Snapshot(tuple(FileStat(p.name, 0, 0) for p in directory.iterdir() if p.is_file()))
    index_name = index_file(snapshot)
    try:
        index_text = files.read_text(directory / index_name) if index_name is not None else None
        shards, problem = weight_files(snapshot, index_text)
    except FileRefused as exc:
        raise CheckpointInvalid(f"{directory}: {files.refusal(directory, exc).reason}") from exc
    if problem is not None:
        raise CheckpointInvalid(f"{directory}: {problem}")
    if not shards or not is_bin(shards[0]):
        return directory  # safetensors already, or nothing: the check that follows names what is missing
    state_dict: dict[str, torch.Tensor] = {}
    for shard in shards:
        state_dict.update(load_torch_file(directory / shard))
    target = scratch / "safetensors"
    copy_side_files(directory, target)
    write_safetensors(state_dict, target)
    return target
