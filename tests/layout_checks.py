"""Checks the layout tests share: replay a case slowly, compare consolidated weights, run the real worker."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from inference.spec import InferenceSpec, JobResult, JobSpec, TaskSpec
from inference.toy.problems import PROMPT_TEMPLATE, held_out_problems, write_jsonl
from tests.checkpoints import LayoutCase
from tests.conftest import SUBPROCESS_ENV
from tests.deadlines import patient
from tests.forkserver import worker_python

if TYPE_CHECKING:
    import torch

#: The prompts ``tests/writers`` computed reference logits for.
PROMPTS = ("12+34=", "7+5=")


def replay_order(case: LayoutCase, target: Path, *, chunks: int = 4) -> Iterator[str]:
    """Write ``case.order`` into ``target`` as the trainer did, file by file, each in ``chunks`` appends."""
    target.mkdir(parents=True, exist_ok=True)
    yield "run folder created"
    for relpath in case.order:
        data = (case.source / relpath).read_bytes()
        destination = target / relpath
        destination.parent.mkdir(parents=True, exist_ok=True)
        size = max(1, -(-len(data) // chunks))
        with destination.open("wb") as handle:
            yield f"{relpath}: created"
            for start in range(0, len(data), size):
                handle.write(data[start : start + size])
                handle.flush()
                yield f"{relpath}: {min(start + size, len(data))}/{len(data)} bytes"


def reference_logits(case: LayoutCase) -> torch.Tensor:
    """The logits the writer computed after training, kept beside its output (``RUN_reference``)."""
    from safetensors.torch import load_file

    for folder in (case.source, *case.source.parents):
        reference = folder.with_name(folder.name + "_reference") / "logits.safetensors"
        if reference.is_file():
            return load_file(str(reference))["logits"]
    raise FileNotFoundError(f"no *_reference/logits.safetensors beside {case.source} or its parents")


def consolidated_logits(folder: Path) -> torch.Tensor:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    with torch.no_grad():
        logits: torch.Tensor = model(**tokenizer(list(PROMPTS), return_tensors="pt", padding=True)).logits
    return logits


def run_job(case: LayoutCase, tmp_path: Path, *, hf_config: Path | str | None = "case") -> JobResult:
    """Evaluate the case's checkpoint with ``python -m inference.worker``; the result file it wrote."""
    dataset = tmp_path / "heldout.jsonl"
    write_jsonl(held_out_problems(8, seed=1), dataset)
    spec = JobSpec(
        job_id=1,
        checkpoint_path=case.source / case.candidate,
        layout=case.layout,
        hf_config=case.hf_config if hf_config == "case" else hf_config,
        result_path=tmp_path / "job" / "result.json",
        task=TaskSpec(name="toy", dataset=dataset, prompt_template=PROMPT_TEMPLATE, batch_size=8),
        inference=InferenceSpec(threads=1),
    )
    spec.result_path.parent.mkdir(parents=True)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.model_dump_json(), encoding="utf-8")
    done = subprocess.run(
        [worker_python(), "-m", "inference.worker", str(spec_path)],
        capture_output=True,
        text=True,
        # As the daemon starts it: no DS_ACCELERATOR, so DeepSpeed picks the accelerator itself.
        env=SUBPROCESS_ENV,
        timeout=patient(300),
    )
    assert done.returncode in (0, 3), done.stderr[-4000:]
    return JobResult.read(spec.result_path)
