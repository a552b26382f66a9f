"""Run the real writers once per test session and hand each caller its own copy of what they wrote."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.forkserver import worker_python
from tests.session_cache import built_once, cache_root

REPO = Path(__file__).resolve().parents[2]
#: torchrun started with the session's shim starts its ranks with it: forked (tests/forkserver.py).
TWO_RANKS = (worker_python(), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")


def writer_env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "DS_ACCELERATOR": "cpu",
        # DeepSpeed's CPU shared-memory all-reduce reads LOCAL_SIZE; torchrun sets only LOCAL_WORLD_SIZE.
        "LOCAL_SIZE": "2",
    }


#: The ZeRO stages each writer launch trains, one after the other: a launch costs every rank torch's and
#: DeepSpeed's imports, so `make test`'s three stages share one; ZeRO-2 (long tests only) has its own.
DEEPSPEED_LAUNCHES = ((0, 1, 3), (2,))


def deepspeed_run(stage: int, target: Path) -> Path:
    """``target`` holding a 2-rank ZeRO-``stage`` run (``global_step1``, ``global_step2``, ``latest``).

    ZeRO-3 runs are saved as OpenRLHF saves its actor: the engine checkpoints in ``target/_actor``, and
    ``target/global_stepN_hf`` beside them. Beside ``target``, ``target_reference`` holds ``hf_config/`` and
    the trained engine's ``logits.safetensors``.
    """
    stages = next(group for group in DEEPSPEED_LAUNCHES if stage in group)
    key = "deepspeed-zero" + "".join(map(str, stages))
    command = [
        *TWO_RANKS, str(REPO / "tests" / "writers" / "deepspeed_engine.py"), "--out", str(cache_root() / key),
        *(f"--stage={s}" for s in stages), "--openrlhf",
    ]  # fmt: skip
    return _copy_of(key, command, target, "DeepSpeed", part=f"zero{stage}")


def deepspeed_order(run: Path, tag: str) -> tuple[str, ...]:
    """The files of ``run/tag`` in ``DeepSpeedEngine.save_checkpoint``'s order, relative to ``run``.

    Model states, then every rank's optimizer shard, then rank 0 copies the recovery scripts into the run
    folder, and ``latest`` comes last (``deepspeed/runtime/engine.py``: ``save_checkpoint``).
    """
    shards = sorted(p.name for p in (run / tag).iterdir())
    model = [name for name in shards if name.endswith("_model_states.pt")]
    optim = [name for name in shards if name.endswith("_optim_states.pt")]
    scripts = [name for name in ("zero_to_fp32.py", "zero_to_torch.py") if (run / name).is_file()]
    return (*(f"{tag}/{name}" for name in model + optim), *scripts, "latest")


def trainer_run(target: Path, zero_stage: int | None = None) -> Path:
    """``target`` holding a ``transformers.Trainer`` run (``checkpoint-2``, ``checkpoint-4``).

    With ``zero_stage`` it trains under DeepSpeed on 2 ranks. Beside it, ``target_reference`` holds the
    trained model's ``logits.safetensors``.
    """
    key = f"trainer-zero{zero_stage}" if zero_stage is not None else "trainer"
    script = [str(REPO / "tests" / "writers" / "hf_trainer.py"), "--out", str(cache_root() / key)]
    if zero_stage is None:
        command = [worker_python(), *script]
    else:
        command = [*TWO_RANKS, *script, "--zero-stage", str(zero_stage)]
    return _copy_of(key, command, target, "Trainer")


def _copy_of(key: str, command: list[str], target: Path, writer: str, *, part: str | None = None) -> Path:
    """Run ``command`` (it writes ``cache_root() / key``) once per session; copy its output (or its folder
    ``part``, when it writes several runs) and the ``_reference`` beside it to ``target``."""

    def write(_: Path) -> None:
        done = subprocess.run(command, capture_output=True, text=True, env=writer_env(), timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{writer} writer failed ({done.returncode}):\n{done.stderr[-4000:]}")

    # A writer of several runs keeps each run's reference inside its own folder: only one run has it beside.
    built = built_once(key, write, beside=() if part is not None else (f"{key}_reference",))
    source = built / part if part is not None else built
    shutil.copytree(source, target)
    shutil.copytree(
        source.with_name(source.name + "_reference"), target.with_name(target.name + "_reference")
    )
    return target


def _trainer_rank(relpath: str) -> int:
    """Where ``Trainer._save_checkpoint`` writes a file (``transformers/trainer.py``): ``save_model`` first
    (config, weights, tokenizer, ``training_args.bin``; under DeepSpeed without gathered weights, then
    ``engine.save_checkpoint``: shards, recovery scripts, ``latest``), then optimizer, scheduler and RNG
    states, and ``trainer_state.json`` last."""
    name = relpath.rsplit("/", 1)[-1]
    ranks = (
        ("config.json", "generation_config.json"),
        (".safetensors", ".safetensors.index.json"),
        ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"),
        ("training_args.bin",),
        ("_model_states.pt",),
        ("_optim_states.pt",),
        ("zero_to_fp32.py", "zero_to_torch.py"),
        ("latest",),
        ("optimizer.pt",),
        ("scheduler.pt", "scaler.pt"),
        (".pth",),
        ("trainer_state.json",),
    )
    for rank, endings in enumerate(ranks):
        if name.endswith(endings):
            return rank
    raise ValueError(f"{relpath}: a file the Trainer's write order does not place")


def trainer_order(run: Path, folder: str) -> tuple[str, ...]:
    files = [p.relative_to(run).as_posix() for p in (run / folder).rglob("*") if p.is_file()]
    return tuple(sorted(files, key=lambda relpath: (_trainer_rank(relpath), relpath)))


def deepspeed_case(stage: int, tmp: Path) -> LayoutCase:
    """The ``global_step2`` tag of a real 2-rank ZeRO-``stage`` run, as a slow-writer case."""
    run = deepspeed_run(stage, tmp / "run")
    return LayoutCase(
        layout="deepspeed",
        source=run,
        candidate="global_step2",
        order=deepspeed_order(run, "global_step2"),
        step=2,
        hf_config=tmp / "run_reference" / "hf_config",
    )
