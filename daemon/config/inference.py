"""``[inference]``: how a worker evaluates (engine, device, tp × dp, hostfile) and what it may inherit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from daemon.config.base import Section, existing_file
from daemon.config.worker_env import refused_extra
from inference.engines import tp_limit
from inference.spec import Engine, InferenceSpec


def hostfile_slots(path: Path) -> int:
    """The rank count of a DeepSpeed hostfile (``host slots=N`` per line, ``#`` comments)."""
    total = 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith("slots=") or not parts[1][6:].isdigit():
            raise ValueError(f"{path}:{number}: expected 'HOST slots=N', got {raw.strip()!r}")
        total += int(parts[1][6:])
    return total


def _worker_env_name(name: str) -> str:
    why = refused_extra(name)
    if why is not None:
        raise ValueError(why)
    return name


class InferenceConfig(Section):
    """How each evaluation job runs: its engine, device and dtype, its worker group, limits and retries."""

    #: ``deepspeed`` (AutoTP, any tp) or ``hf`` (plain transformers, tp = 1).
    engine: Engine = "deepspeed"
    #: How generation batches its sequences. ``continuous``: a sequence that ends frees its slot for the
    #: next waiting prompt at once, so long, uneven responses (reasoning traces) waste no steps on
    #: finished rows; tp = 1 only. ``paged``: the same over a pool of KV blocks sized for the device, so
    #: memory follows the live tokens rather than every slot at full length (more sequences at once on a
    #: long-tailed load; the newest is preempted and run again if the pool runs short); tp = 1 only.
    #: ``fixed``: batches of prompts of similar length, each decoding until its longest row ends; any tp.
    #: ``auto``: ``fixed`` at tp > 1, else the engine measured faster on the device (``continuous`` on
    #: ``cpu``; ``fixed`` on ``cuda`` until a GPU figure says otherwise, BENCHMARKS.md). Code tasks, judged
    #: batch by batch as they generate, always use ``fixed``. ``batch_size`` is how many sequences an
    #: engine holds at once; an out-of-memory error halves it.
    batching: Literal["auto", "fixed", "continuous", "paged"] = "auto"
    #: ``cpu`` or ``cuda``; on ``cuda`` rank r of a worker group takes the r-th visible GPU of its node
    #: (``[scheduling.resources] gpus`` says which are visible).
    device: str = "cpu"
    #: The dtype the weights are loaded and run in: ``bfloat16`` or ``float16`` take half the memory of
    #: ``float32``.
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    #: torch intra-op threads per rank (worth setting when several ranks share a CPU node); unset:
    #: torch's default.
    threads: int | None = Field(default=None, ge=1)
    #: Tensor-parallel ranks per replica, one model sharded across them: each job runs tp × dp ranks.
    tp: int = Field(default=1, ge=1)
    #: Data-parallel replicas, each evaluating a share of the items: each job runs tp × dp ranks.
    dp: int = Field(default=1, ge=1)
    #: DeepSpeed hostfile for a worker group across several nodes; unset, the group runs on this node.
    hostfile: Path | None = None
    #: Extra arguments for the launcher of a worker group (torchrun, or DeepSpeed's with a hostfile),
    #: e.g. ``["--master_addr", "10.0.0.1"]``.
    launcher_args: tuple[str, ...] = ()
    #: Interpreter that runs workers; defaults to the daemon's own.
    python: Path | None = None
    #: Environment variables a worker inherits beyond those it needs (daemon/running/environment.py
    #: lists them: PATH, HOME, CUDA_*, HF_*, ...), e.g. a reward function's settings.
    worker_env: tuple[Annotated[str, AfterValidator(_worker_env_name)], ...] = ()
    #: A worker still running after this long is killed and its job failed.
    job_timeout_secs: float = Field(default=3600.0, gt=0)
    #: A job whose worker crashes or times out is tried this many times in all before it stays failed.
    max_attempts: int = Field(default=3, ge=1)
    #: Seeds torch in every worker, and sampling (re-seeded per batch from it), so a sampled task draws
    #: alike at every checkpoint and on every rank.
    seed: int = 0
    #: Per-sample outputs stored per job (the first ones); the rest are only aggregated.
    max_samples: int = Field(default=1000, ge=0)
    #: Longest prompt, response or answer text stored per sample; longer text is cut and marked.
    max_text_chars: int = Field(default=2000, ge=16)

    @field_validator("hostfile")
    @classmethod
    def _hostfile(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return existing_file(value, info)

    @model_validator(mode="after")
    def _layout(self) -> InferenceConfig:
        if self.engine == "hf" and self.tp > 1:
            raise ValueError(f"engine 'hf' cannot shard a model (tp = {self.tp}): use engine = \"deepspeed\"")
        limit = tp_limit(self.batching, self.tp)
        if limit is not None:
            raise ValueError(limit)
        if self.hostfile is not None and self.tp * self.dp > 1:
            slots = hostfile_slots(self.hostfile)
            if slots != self.tp * self.dp:
                raise ValueError(
                    f"hostfile {self.hostfile} has {slots} slots but tp × dp = {self.tp * self.dp}: "
                    "DeepSpeed's launcher starts one rank per slot"
                )
        return self

    def spec(self) -> InferenceSpec:
        return InferenceSpec(
            engine=self.engine,
            batching=self.batching,
            device=self.device,
            dtype=self.dtype,
            threads=self.threads,
            tp=self.tp,
            dp=self.dp,
        )
