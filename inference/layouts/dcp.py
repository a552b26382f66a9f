"""PyTorch Distributed Checkpoint (DCP): ``.metadata`` plus ``__{rank}_{n}.distcp`` data files.

torch's ``FileSystemWriter`` (``torch/distributed/checkpoint/filesystem.py``) has every rank write its
``.distcp`` files, then rank 0 writes ``.metadata.tmp`` and renames it to ``.metadata``: a ``.metadata``
that unpickles, and whose storage index names only files that are there and long enough, is complete.

``.metadata`` is a pickle, and torch reads it with plain ``pickle.load``. It is read here only by
:class:`MetadataUnpickler`, which builds torch's own metadata dataclasses and nothing else, both when
judging readiness and when converting (torch's reader is given that metadata instead of unpickling the
file itself). Tensors are then read with torch's own ``dcp.load`` into tensors allocated from that
metadata; non-tensor entries (pickled step counters, dataloader state) are never read at all.
"""

from __future__ import annotations

import io
import pickle
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from inference.errors import CheckpointInvalid, FileRefused
from inference.layouts import files, hf, model_config, unpickling
from inference.layouts.base import Layout, LayoutSettings, Readiness, Snapshot, Verdict, take_snapshot

if TYPE_CHECKING:
    import torch
    from torch.distributed.checkpoint.metadata import Metadata

NAME = "dcp"
METADATA_FILE = ".metadata"
#: Metadata lists every chunk of every tensor: a few MB for a large model, far below this.
MAX_METADATA_BYTES = 256 * 1024 * 1024
DATA_FILE = re.compile(r"__\d+_\d+\.distcp$")

#: (module, name) pairs a DCP ``.metadata`` pickle may name, besides torch dtypes (checked by type).
_ALLOWED_GLOBALS = frozenset(
    {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
    }
)
#: Every class in this module is a plain metadata dataclass or enum: safe to build.
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata and refuses every other global, so a crafted ``.metadata`` runs no code."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in unpickling.GETATTR:
            return unpickling.member  # an enum member as Python 3.11.0-3.11.4 pickle one
        if module == _METADATA_MODULE:
            import torch.distributed.checkpoint.metadata as metadata

            found = getattr(metadata, name, None)
            if isinstance(found, type):
                return found
        elif (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in DCP metadata")


def read_metadata(path: Path) -> Metadata:
    """Unpickle ``path`` with :class:`MetadataUnpickler` (I/O edge).

    Raises ``pickle.UnpicklingError`` for a refused global, ``EOFError`` (or ``UnpicklingError``) for a
    file cut short, ``FileNotFoundError`` if the file is gone, and :class:`FileRefused` if it is not a
    regular file or larger than :data:`MAX_METADATA_BYTES`.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    data = files.read_bytes(path, limit=MAX_METADATA_BYTES)
    try:
        loaded = MetadataUnpickler(io.BytesIO(data)).load()
    except RecursionError as exc:
        raise FileRefused(path, "holds a pickle nested too deep to read") from exc
    if not isinstance(loaded, Metadata):
        raise pickle.UnpicklingError(f"holds a {type(loaded).__name__}, not DCP Metadata")
    return loaded


def storage_extents(metadata: Metadata) -> dict[str, int]:
    """Each data file the metadata points into, with the end of the last byte range read from it."""
    extents: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        relpath = str(info.relative_path)
        extents[relpath] = max(extents.get(relpath, 0), int(info.offset) + int(info.length))
    return extents


def assess(snapshot: Snapshot, extents: Mapping[str, int]) -> Verdict:
    """Readiness once ``.metadata`` unpickled, from the byte ranges it reads (pure)."""
    for relpath, end in sorted(extents.items()):
        parts = PurePosixPath(relpath).parts
        if len(parts) != 1 or parts[0] in (".", ".."):
            return Verdict(Readiness.INVALID, f"{METADATA_FILE} points outside the checkpoint: {relpath!r}")
        size = snapshot.size(relpath)
        if size is None:
            return Verdict(Readiness.INVALID, f"{relpath}, named in {METADATA_FILE}, is missing")
        if size < end:
            return Verdict(Readiness.INVALID, f"{relpath}: truncated ({size} of at least {end} bytes)")
    return Verdict.complete()


@files.judged
def inspect(directory: Path, snapshot: Snapshot) -> Verdict:
    if METADATA_FILE not in snapshot.names():
        return Verdict(Readiness.INCOMPLETE, f"no {METADATA_FILE} yet (torch renames it into place last)")
    try:
        metadata = read_metadata(directory / METADATA_FILE)
    except FileNotFoundError:
        return Verdict(Readiness.INCOMPLETE, f"{METADATA_FILE} disappeared")
    except EOFError:
        return Verdict(Readiness.INCOMPLETE, f"{METADATA_FILE} is cut short")
    except pickle.UnpicklingError as exc:
        if "truncated" in str(exc):
            return Verdict(Readiness.INCOMPLETE, f"{METADATA_FILE} is cut short")
        return Verdict(Readiness.INVALID, f"{METADATA_FILE}: refused: {exc}")
    except (ValueError, TypeError, AttributeError, IndexError) as exc:
        return Verdict(Readiness.INVALID, f"{METADATA_FILE} is not DCP metadata: {exc}")
    return assess(snapshot, storage_extents(metadata))


def key_mapping(stored: Iterable[str], expected: frozenset[str]) -> dict[str, str]:
    """Map stored names to the model's parameter names, dropping a wrapper prefix (pure).

    Writers nest the model (``{"model": state_dict}`` flattens to ``model.model.embed_tokens.weight``),
    wrap it (``module.``, ``_orig_mod.``) or save the inner base model (no ``model.``), so the prefix to
    strip or add is the one under which most stored names become model names.
    """
    names = sorted(stored)
    candidates: set[tuple[str, str]] = {("", "")}
    for name in names:
        for position, char in enumerate(name):
            if char == "." and name[position + 1 :] in expected:
                candidates.add((name[: position + 1], ""))
        for model_name in expected:
            if model_name.endswith("." + name):
                candidates.add(("", model_name[: -len(name)]))

    def mapped(strip: str, add: str) -> dict[str, str]:
        result = {}
        for name in names:
            if name.startswith(strip) and add + name[len(strip) :] in expected:
                result[name] = add + name[len(strip) :]
        return result

    best = max(candidates, key=lambda c: (len(mapped(*c)), -len(c[0]) - len(c[1])))
    return mapped(*best)


def expected_names(hf_config: Path) -> frozenset[str]:
    """Parameter names of the model ``hf_config`` describes, built on the meta device (no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(hf_config, local_files_only=True, trust_remote_code=False)
    # Through Any: transformers leaves from_config unannotated.
    from_config: Any = AutoModelForCausalLM.from_config
    with torch.device("meta"):
        model: torch.nn.Module = from_config(config, trust_remote_code=False)
    return frozenset(model.state_dict())


def load_tensors(directory: Path, metadata: Metadata, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """Read ``names`` with torch's own ``dcp.load``, in one process, from already-vetted metadata."""
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    class VettedReader(FileSystemReader):
        # torch's reader unpickles .metadata with plain pickle; hand it the vetted copy instead.
        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            return metadata

    state_dict: dict[str, torch.Tensor] = {}
    for name in names:
        entry = metadata.state_dict_metadata[name]
        if isinstance(entry, TensorStorageMetadata):
            state_dict[name] = torch.empty(entry.size, dtype=entry.properties.dtype)
    with warnings.catch_warnings():
        # "torch.distributed is disabled ... assuming the intent is to load in a single process": it is.
        warnings.simplefilter("ignore", UserWarning)
        load(state_dict, storage_reader=VettedReader(str(directory)), no_dist=True)
    return state_dict


def convert(directory: Path, hf_config: Path, target: Path) -> Path:
    """Write ``directory``'s model weights as ``save_pretrained`` safetensors plus ``hf_config``'s files."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        metadata = read_metadata(directory / METADATA_FILE)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointInvalid(f"{directory / METADATA_FILE}: refused: {exc}") from exc
    verdict = assess(take_snapshot(directory), storage_extents(metadata))
    if verdict.readiness is not Readiness.COMPLETE:
        raise CheckpointInvalid(f"{directory}: {verdict.reason}")
    tensors = [n for n, e in metadata.state_dict_metadata.items() if isinstance(e, TensorStorageMetadata)]
    mapping = key_mapping(tensors, expected_names(hf_config))
    if not mapping:
        shown = ", ".join(sorted(tensors)[:3]) or "none"
        raise CheckpointInvalid(
            f"{directory}: no tensor matches a parameter of the model in {hf_config} (stored: {shown})"
        )
    loaded = load_tensors(directory, metadata, mapping)
    hf.copy_side_files(hf_config, target)
    hf.write_safetensors({mapping[name]: tensor for name, tensor in loaded.items()}, target)
    return target


class DcpLayout(Layout):
    """``torch.distributed.checkpoint.save`` output (torchtitan, AReaL's recover checkpoints, FSDP2)."""

    name = NAME

    def recognise(self, directory: Path, snapshot: Snapshot) -> bool:
        return any(name == METADATA_FILE or DATA_FILE.fullmatch(name) for name in snapshot.names())

    def inspect(self, directory: Path, snapshot: Snapshot, settings: LayoutSettings) -> Verdict:
        return inspect(directory, snapshot)

    def materialise(self, directory: Path, settings: LayoutSettings, scratch: Path) -> Path:
        # torch's FileSystemWriter saves into one folder per checkpoint: its parent is the save folder.
        config = model_config.config_folder(
            directory,
            settings.hf_config,
            settings.run_root,
            save_root=directory.parent,
            holds_only="a DCP checkpoint holds only tensors",
        )
        return convert(directory, config, scratch / "dcp")
