"""What the scanner checks of a checkpoint's content before a worker run is spent on it.

Everything here is pure and cheap: a safetensors header (already read, at most 100 MB and usually a few
KB), the parsed ``config.json``, and sizes from the directory snapshot. A worker run costs minutes of a
reserved GPU; a check here costs microseconds, so what it can tell is told here:

- **Safetensors headers**, as the ``safetensors`` library itself checks them when it opens the file:
  every tensor has a known dtype, a shape of whole numbers and ``data_offsets`` that tile the data from 0
  with no gap or overlap, each tensor's span exactly its shape times its dtype's size.
- **config.json**'s sizes: ``vocab_size``, ``hidden_size``, layer, intermediate and expert counts, when
  given, are whole numbers in a plausible range (:data:`DIMENSION_BOUNDS`): a ``vocab_size`` of 2^31
  would make the worker allocate an embedding of 2^31 rows before any weight is read.
- **Headers against the config**: the token embedding and the LM head are ``[vocab_size, hidden_size]``
  (transformers refuses anything else at load), and the total tensor bytes of the checkpoint within
  :data:`PLAUSIBLE_BYTES_PER_PARAMETER` bytes per parameter the config implies
  (:func:`implied_parameters`): a sparse 1 TB file with consistent offsets beside the config of a small
  model is refused from its header, unread.
- **Tokenizer files** (:func:`tokenizer_verdict`): strict JSON, as ``config.json`` and the index, nested
  no deeper than the ``tokenizers`` library reads.

Each check returns the problem in words, or ``None``; :func:`content_verdict` turns a problem into a final
``invalid`` verdict, since neither a header read whole nor a parsed config changes by waiting.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inference.layouts import files
from inference.layouts.base import Readiness, Verdict

CONFIG_FILE = "config.json"

#: Bits per element of every dtype ``safetensors`` 0.8 accepts (its ``Dtype`` enum); another is refused
#: by the library at load, so it is refused here first.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

#: The most each size of ``config.json`` may be. Real models stay far below: the largest vocabularies are
#: about 262,144 (Gemma 3), hidden sizes about 16,384 (Llama 3.1 405B), layer counts under 130, experts
#: 256 (DeepSeek-V3). Each bound is 64 times or more above those, so no real model is refused, while a
#: size that would make the worker allocate terabytes before reading a weight (``vocab_size`` 2^31) is.
DIMENSION_BOUNDS: dict[str, int] = {
    "vocab_size": 2**24,
    "hidden_size": 2**20,
    "n_embd": 2**20,
    "d_model": 2**20,
    "intermediate_size": 2**22,
    "moe_intermediate_size": 2**22,
    "n_inner": 2**22,
    "ffn_dim": 2**22,
    "d_ff": 2**22,
    "num_hidden_layers": 2**14,
    "n_layer": 2**14,
    "num_layers": 2**14,
    "num_attention_heads": 2**14,
    "num_key_value_heads": 2**14,
    "num_local_experts": 2**16,
    "num_experts": 2**16,
    "n_routed_experts": 2**16,
    "moe_num_experts": 2**16,
}

#: How many bytes of tensors per parameter the config implies a checkpoint may hold. Weights are 2 (bf16)
#: or 4 (fp32) bytes; :func:`implied_parameters` is a rough count that ignores biases, norms, vision
#: towers and odd projections, so the allowance is 8 times fp32: a real checkpoint is never near it, a
#: sparse terabyte beside a small config is far past it.
PLAUSIBLE_BYTES_PER_PARAMETER = 32
#: Never refused below this many tensor bytes whatever the config implies (tiny test models, configs
#: whose sizes the estimate misreads): the check is for terabytes, not megabytes.
PLAUSIBLE_FLOOR_BYTES = 256 * 1024 * 1024

_HIDDEN = ("hidden_size", "n_embd", "d_model")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
_INTERMEDIATE = ("intermediate_size", "n_inner", "ffn_dim", "d_ff")
_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
#: Configs whose token embedding is not ``hidden_size`` wide (OPT-350m's ``word_embed_proj_dim``,
#: ALBERT's ``embedding_size``): only the embedding's rows are checked for them.
_EMBEDDING_WIDTH_KEYS = ("word_embed_proj_dim", "embedding_size", "embed_dim", "project_in_dim")
#: Tensors that are ``[vocab_size, hidden_size]`` in a text model as ``save_pretrained`` names them.
EMBEDDING_TENSORS = frozenset(
    {
        "model.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
        "transformer.wte.weight",
        "wte.weight",
        "gpt_neox.embed_in.weight",
        "transformer.word_embeddings.weight",
        "word_embeddings.weight",
        "lm_head.weight",
        "embed_out.weight",
    }
)


@dataclass(frozen=True)
class Tensor:
    """One entry of a safetensors header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entry(name: str, info: object) -> Tensor | str:
    """The header entry ``name`` as a :class:`Tensor`, or why it is not one."""
    if not isinstance(info, dict):
        return f"tensor {name!r} is not described by a JSON object"
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        return f"tensor {name!r} has dtype {dtype!r}, which safetensors does not know"
    if not (isinstance(shape, list) and all(_whole(n) and n >= 0 for n in shape)):
        return f"tensor {name!r} has shape {shape!r}, not a list of whole numbers"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_whole(o) and o >= 0 for o in offsets)):
        return f"tensor {name!r} has no valid data_offsets"
    begin, end = offsets
    if end < begin:
        return f"tensor {name!r} ends (byte {end}) before it begins (byte {begin})"
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != end - begin:
        return (
            f"tensor {name!r} is {dtype} {list(shape)}, {bits / 8:g} bytes, but its data_offsets"
            f" span {end - begin}"
        )
    return Tensor(name, dtype, tuple(shape), begin, end)


def header_tensors(header: Mapping[str, Any]) -> tuple[tuple[Tensor, ...], str | None]:
    """The tensors of a parsed safetensors header, in data order, or why the header is not consistent.

    The rules are the ``safetensors`` library's own (``Metadata::validate``): ``__metadata__`` maps
    strings to strings, and the tensors, sorted by offset, tile the data from byte 0 with no gap or
    overlap, each spanning its shape times its dtype's size.
    """
    metadata = header.get("__metadata__")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        return (), "__metadata__ is not a map of strings to strings"
    found: list[Tensor] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        entry = _entry(name, info)
        if isinstance(entry, str):
            return (), entry
        found.append(entry)
    found.sort(key=lambda t: (t.begin, t.end))
    position = 0
    for tensor in found:
        if tensor.begin != position:
            where = "overlaps the tensor before it" if tensor.begin < position else "leaves a gap before it"
            problem = f"it {where} (which ends at byte {position})"
            return (), f"tensor {tensor.name!r} starts at byte {tensor.begin}: {problem}"
        position = tensor.end
    return tuple(found), None


def _dimension(config: Mapping[str, Any], keys: Iterable[str]) -> int | None:
    """The first of ``keys`` set in ``config`` or its ``text_config``, as a whole number (pure)."""
    places = [config]
    if isinstance(config.get("text_config"), dict):
        places.append(config["text_config"])
    for place in places:
        for key in keys:
            value = place.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def config_problem(config: Mapping[str, Any]) -> str | None:
    """Why ``config.json``'s sizes cannot describe a model a worker can build, or ``None`` (pure).

    The sizes of :data:`DIMENSION_BOUNDS` given as numbers (at the top or in ``text_config``) must be
    whole and from 1 to their bound (0 is allowed for expert counts: a dense model may say
    ``num_experts: 0``). A size given as anything else (a list, per layer) is the architecture's to read.
    """
    places = [("", config)]
    if isinstance(config.get("text_config"), dict):
        places.append(("text_config.", config["text_config"]))
    for prefix, place in places:
        for key, bound in DIMENSION_BOUNDS.items():
            value = place.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            least = 0 if key in _EXPERTS else 1
            if not _whole(value):
                return f"{prefix}{key} is {value!r}, not a whole number"
            if not least <= value <= bound:
                return f"{prefix}{key} is {value}, outside the plausible {least}..{bound}"
    return None


def implied_parameters(config: Mapping[str, Any]) -> int | None:
    """A generous count of the parameters ``config`` describes, or ``None`` when it does not say enough.

    Embedding and head (``2 · vocab · hidden``) plus, per layer, attention (``4 · hidden²``) and an MLP
    (``3 · hidden · intermediate``), and for a mixture of experts that many experts' MLPs more. Biases,
    norms, vision towers and wider attention heads are left out: :data:`PLAUSIBLE_BYTES_PER_PARAMETER`
    allows for them.
    """
    hidden, layers = _dimension(config, _HIDDEN), _dimension(config, _LAYERS)
    vocab = _dimension(config, ("vocab_size",))
    if hidden is None or layers is None or vocab is None:
        return None
    intermediate = _dimension(config, _INTERMEDIATE) or 4 * hidden
    experts = _dimension(config, _EXPERTS) or 0
    expert_width = _dimension(config, ("moe_intermediate_size",)) or intermediate
    per_layer = 4 * hidden * hidden + 3 * hidden * intermediate + 3 * hidden * expert_width * experts
    return 2 * vocab * hidden + layers * per_layer


def size_problem(total_bytes: int, config: Mapping[str, Any]) -> str | None:
    """Why ``total_bytes`` of tensors are far more than ``config`` can describe, or ``None`` (pure)."""
    parameters = implied_parameters(config)
    if parameters is None:
        return None
    allowed = max(PLAUSIBLE_FLOOR_BYTES, PLAUSIBLE_BYTES_PER_PARAMETER * parameters)
    if total_bytes <= allowed:
        return None
    return (
        f"its headers declare {total_bytes} bytes of tensors, more than {allowed}"
        f" ({PLAUSIBLE_BYTES_PER_PARAMETER} bytes for each of the about {parameters} parameters"
        " config.json describes)"
    )


def shape_problem(shard: str, tensors: Iterable[Tensor], config: Mapping[str, Any]) -> str | None:
    """Why the tensors of ``shard`` contradict ``config``'s top-level sizes, or ``None`` (pure).

    The token embedding and LM head must be ``[vocab_size, hidden_size]`` (only their rows where the
    config gives the embedding another width): transformers refuses anything else at load. Other tensors'
    shapes depend on the architecture; the worker names those (``shape_mismatches``) at its first attempt.
    Decoder layers past ``num_hidden_layers`` are not refused: real checkpoints hold them (DeepSeek-V3's
    multi-token-prediction layer is ``model.layers.61``).
    """
    vocab = config.get("vocab_size")
    if not _whole(vocab):
        return None
    hidden = next((config[k] for k in _HIDDEN if _whole(config.get(k))), None)
    if any(config.get(k) is not None for k in _EMBEDDING_WIDTH_KEYS):
        hidden = None
    for tensor in tensors:
        if tensor.name not in EMBEDDING_TENSORS:
            continue
        rows_wrong = len(tensor.shape) != 2 or tensor.shape[0] != vocab
        width_wrong = hidden is not None and tensor.shape[-1:] != (hidden,)
        if rows_wrong or width_wrong:
            wanted = f"[{vocab}, {hidden if hidden is not None else '…'}]"
            return f"{shard}: tensor {tensor.name!r} is {list(tensor.shape)}, config.json gives {wanted}"
    return None


def content_verdict(config: Mapping[str, Any], tensors: Mapping[str, Iterable[Tensor]]) -> Verdict | None:
    """Why ``config.json`` cannot describe a model, or the shards' tensors (shard → its header's tensors)
    contradict it; ``None`` when they agree (pure). Final: neither a parsed config nor a header read whole
    changes by waiting."""
    problem = config_problem(config)
    if problem is not None:
        return Verdict(Readiness.INVALID, f"{CONFIG_FILE}: {problem}", final=True)
    for shard, found in tensors.items():
        problem = shape_problem(shard, found, config)
        if problem is not None:
            return Verdict(Readiness.INVALID, problem, final=True)
    total = sum(tensor.nbytes for found in tensors.values() for tensor in found)
    problem = size_problem(total, config)
    if problem is not None:
        return Verdict(Readiness.INVALID, f"weights implausible for {CONFIG_FILE}: {problem}", final=True)
    return None


def tokenizer_verdict(texts: Mapping[str, str | None]) -> Verdict | None:
    """Why the tokenizer's JSON files (name → text, ``None``: not there) would fail the worker's load, or
    ``None`` (pure). One that does not parse may be written still (trainers save the tokenizer after the
    weights): incomplete. Raises :class:`~inference.errors.FileRefused` for one that is not strict JSON
    (NaN, a key twice, nested deeper than the ``tokenizers`` library reads)."""
    for name, text in texts.items():
        if text is None:
            continue
        try:
            files.parse_json(text, name)
        except json.JSONDecodeError as exc:
            return Verdict(Readiness.INCOMPLETE, f"{name} is not whole JSON yet ({exc})")
    return None
