"""Load a checkpoint of any layout for generation, as a Hugging Face model and tokenizer.

Loading is a trust boundary: transformers only ever reads safetensors, local files and no remote code.
Other weights are first turned into safetensors by the layout's ``materialise``, which unpickles nothing
beyond ``torch.load(weights_only=True)``; ``training_args.bin`` is never opened. Before transformers
touches the directory its files are checked, so a broken checkpoint is reported by name
(``…/config.json: invalid JSON``, ``…/model-00002-of-00003.safetensors: truncated``) as
:class:`CheckpointInvalid`; a directory that disappears, as trainers rotating old checkpoints do, is
:class:`CheckpointVanished`.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from inference import layouts
from inference.errors import CheckpointInvalid, CheckpointVanished
from inference.layouts import LayoutSettings, Readiness
from inference.sharding import load_sharded, wrap_unsharded
from inference.spec import InferenceSpec

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class LoadedModel(NamedTuple):
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    load_s: float


def check_checkpoint(directory: Path) -> None:
    """Raise :class:`CheckpointInvalid` naming the first broken file; cheap (reads headers only).

    The same rule the daemon's readiness check applies, run again here because the worker may be handed a
    path by ``evald eval`` that no daemon looked at.
    """
    verdict = layouts.hf.inspect(directory, layouts.take_snapshot(directory))
    if verdict.readiness is not Readiness.COMPLETE:
        raise CheckpointInvalid(f"{directory}: {verdict.reason}")


def check_layout(directory: Path, layout: str, settings: LayoutSettings) -> None:
    """Raise :class:`CheckpointInvalid` unless ``layout``'s own readiness rule calls ``directory`` complete.

    The daemon checked this already; ``evald eval`` hands the worker paths nobody checked.
    """
    verdict = layouts.inspect(directory, layouts.take_snapshot(directory), layout, settings)
    if verdict.readiness is not Readiness.COMPLETE:
        raise CheckpointInvalid(f"{directory}: {verdict.reason}")


def _vanished(directory: Path, exc: BaseException) -> CheckpointVanished:
    return CheckpointVanished(f"{directory}: checkpoint disappeared while loading ({exc})")


#: How many mismatched tensors an error names (the count says how many more there are).
MISMATCHES_SHOWN = 3


def shape_mismatches(directory: Path) -> str | None:
    """Which tensors of the safetensors in ``directory`` have another shape than ``config.json`` gives
    them, with both shapes and the file; ``None`` when none (or when that cannot be told).

    transformers refuses such a checkpoint with "You set `ignore_mismatched_sizes`...", naming no tensor;
    its report goes to a log nobody reads. The model is built on the meta device (no memory) to learn the
    shapes the config asks for, and each file's header gives the checkpoint's.
    """
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)  # type: ignore[no-untyped-call]
    except Exception:  # the diagnosis of an error must not replace it with its own
        return None
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    prefix = f"{model.base_model_prefix}."
    found: list[str] = []
    for path in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as weights:
                shapes = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}  # noqa: SIM118
        except Exception:
            continue
        for name, shape in shapes.items():
            # A checkpoint may name tensors with or without the base model's prefix (``model.``).
            wanted = (
                expected.get(name) or expected.get(prefix + name) or expected.get(name.removeprefix(prefix))
            )
            if wanted is not None and wanted != shape:
                found.append(f"{name} is {list(shape)} in {path.name}, config.json gives {list(wanted)}")
    if not found:
        return None
    shown = "; ".join(found[:MISMATCHES_SHOWN])
    more = f" (and {len(found) - MISMATCHES_SHOWN} more)" if len(found) > MISMATCHES_SHOWN else ""
    return f"tensor shape does not match config.json: {shown}{more}"


#: Errors the libraries raise about what a checkpoint holds: a config value of the wrong type (transformers'
#: strict config fields raise ``TypeError`` wrapped in huggingface_hub's ``StrictDataclassError``), a
#: shape that contradicts config.json (``RuntimeError``), a tokenizer file the ``tokenizers`` library
#: cannot read (a bare ``Exception`` from Rust: see :func:`_about_content`). Each is the same on every
#: attempt, so it is ``checkpoint_invalid`` at the first, not a crash retried.
CONTENT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ValueError,
    RuntimeError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    OverflowError,
    RecursionError,
)


def _about_content(exc: BaseException) -> bool:
    """Whether ``exc``, raised while a library read the checkpoint, is about the checkpoint's content.

    Out of memory is not (it depends on the host, and keeps its kind); neither is anything our own code
    raises on purpose. ``tokenizers`` raises plain ``Exception`` for a file it cannot parse (serde's
    "recursion limit exceeded", "data did not match any variant"): only that exact class is taken, not
    its subclasses, which are other libraries' own errors.
    """
    import torch
    from safetensors import SafetensorError

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return False
    try:
        from huggingface_hub.errors import StrictDataclassError

        strict: tuple[type[BaseException], ...] = (StrictDataclassError,)
    except ImportError:  # an older huggingface_hub has no strict dataclasses: nothing to catch
        strict = ()
    return isinstance(exc, (*CONTENT_ERRORS, SafetensorError, *strict)) or type(exc) is Exception


@contextmanager
def _converting_errors(
    directory: Path, what: str, diagnose: Callable[[], str | None] | None = None
) -> Iterator[None]:
    """Turn the libraries' errors about ``directory``'s content (:func:`_about_content`) into
    :class:`CheckpointInvalid`, at the first attempt; out-of-memory and other errors pass through.

    ``diagnose`` is asked, after a library error, for a message that names what is wrong better than the
    library's own (the tensor whose shape does not fit)."""
    try:
        yield
    except CheckpointInvalid:
        if not directory.is_dir():
            raise _vanished(directory, FileNotFoundError(directory)) from None
        raise
    except FileNotFoundError as exc:
        # Every file was there when checked; one missing now was deleted under us.
        raise _vanished(directory, exc) from exc
    except Exception as exc:
        if not _about_content(exc):
            raise
        if not directory.is_dir():
            raise _vanished(directory, exc) from exc
        message = " ".join(str(exc).split()) or type(exc).__name__
        better = diagnose() if diagnose is not None else None
        if better is not None:
            raise CheckpointInvalid(f"{directory}: cannot load the {what}: {better}") from exc
        raise CheckpointInvalid(f"{directory}: cannot load the {what}: {message}") from exc


def load_model(
    checkpoint: Path,
    spec: InferenceSpec,
    *,
    layout: str = "hf",
    settings: LayoutSettings | None = None,
    scratch: Path | None = None,
    device: str | None = None,
    tp_group: ProcessGroup | None = None,
) -> LoadedModel:
    """Load model and tokenizer from ``checkpoint`` onto ``device`` (default ``spec.device``), ready for
    left-padded batches; with ``spec.engine == "deepspeed"`` sharded over ``tp_group`` (``spec.tp`` ranks).

    Layouts that are not ``save_pretrained`` folders are first turned into one (in ``scratch``) by their
    layout's ``materialise``: a verl checkpoint points at its ``huggingface/`` folder, a DeepSpeed one is
    consolidated with DeepSpeed's own utilities.
    """
    started = time.perf_counter()
    if not checkpoint.is_dir():
        raise CheckpointVanished(f"{checkpoint}: checkpoint directory does not exist")
    with ExitStack() as cleanup:
        if scratch is None:
            # Never beside the checkpoint: that is the trainer's watched folder.
            scratch = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="evald-load-")))
        directory = _materialised(checkpoint, layout, settings or LayoutSettings(), scratch)
        with _reading(checkpoint, directory):
            if spec.engine == "deepspeed" and spec.tp > 1:
                sharded = load_sharded(directory, dtype=_dtype(spec), tp=spec.tp, tp_group=tp_group)
                tokenizer = _tokenizer(directory)
                return LoadedModel(model=sharded, tokenizer=tokenizer, load_s=time.perf_counter() - started)
            model, info = _pretrained(directory, spec)
        _require_every_weight(directory, info)
        tokenizer = _tokenizer(directory)
    model = _placed(model, spec, device)
    return LoadedModel(model=model, tokenizer=tokenizer, load_s=time.perf_counter() - started)


def _materialised(checkpoint: Path, layout: str, settings: LayoutSettings, scratch: Path) -> Path:
    """The ``save_pretrained`` folder the weights are read from: ``checkpoint``, or what its layout made of
    it in ``scratch``, once the layout's own readiness rule calls it complete."""
    with _converting_errors(checkpoint, "model", lambda: shape_mismatches(checkpoint)):
        check_layout(checkpoint, layout, settings)
        return layouts.get(layout).materialise(checkpoint, settings, scratch)


@contextmanager
def _reading(checkpoint: Path, directory: Path) -> Iterator[None]:
    """Reading the weights in ``directory`` (made from ``checkpoint``), its files checked first: the
    libraries' errors become :class:`CheckpointInvalid` naming ``checkpoint``, a shape mismatch by tensor."""
    with _converting_errors(checkpoint, "model", lambda: shape_mismatches(directory)):
        check_checkpoint(directory)
        yield


def _dtype(spec: InferenceSpec) -> torch.dtype:
    import torch

    dtype: torch.dtype = getattr(torch, spec.dtype)
    return dtype


def _pretrained(directory: Path, spec: InferenceSpec) -> tuple[PreTrainedModel, dict[str, Any]]:
    """The model in ``directory`` on the CPU, and transformers' loading info."""
    from transformers import AutoModelForCausalLM

    # With output_loading_info, from_pretrained returns (model, info), which its annotation omits.
    loaded: Any = AutoModelForCausalLM.from_pretrained(
        directory,
        dtype=_dtype(spec),
        use_safetensors=True,
        local_files_only=True,
        trust_remote_code=False,
        output_loading_info=True,
    )
    return loaded[0], loaded[1]


def _require_every_weight(directory: Path, info: dict[str, Any]) -> None:
    """transformers fills missing weights with fresh random ones and only warns: not this checkpoint."""
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise CheckpointInvalid(f"{directory}: weights missing for {shown}")


def _placed(model: PreTrainedModel, spec: InferenceSpec, device: str | None) -> PreTrainedModel:
    """``model`` on ``device`` (default ``spec.device``) for inference, wrapped for DeepSpeed if asked."""
    # Through nn.Module: transformers' decorators hide these methods' signatures from the type checker.
    module: torch.nn.Module = model
    module.to(device or spec.device)
    module.eval()
    if spec.engine == "deepspeed":
        return wrap_unsharded(model, _dtype(spec))
    return model


def _tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    with _converting_errors(directory, "tokenizer"):
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    # Generation appends on the right, so prompts are padded on the left.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
