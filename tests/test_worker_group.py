"""Worker groups of real processes: torchrun, DeepSpeed AutoTP over gloo on the CPU, the tiny model.

What must hold: tp × dp sharding changes nothing a user can see (greedy outputs and metrics are those of
one process, tp=2 logits those of the unsharded model), and sampling is reproducible on every rank and
in every run. The failure paths (a killed rank, a timeout, out of memory) are in test_worker_failures.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from daemon.running.workers import Outcome, WorkerProcess, read_outcome
from inference.launcher import worker_command
from inference.spec import PARENT_PID_ENV, InferenceSpec, JobResult, JobSpec, TaskSpec
from inference.toy.problems import PROMPT_TEMPLATE
from tests.conftest import SUBPROCESS_ENV, ToyRun
from tests.deadlines import patient, wait_process
from tests.forkserver import worker_python
from tests.harness import free_port

TIMEOUT_S = 300


def group_spec(
    checkpoint: Path,
    dataset: Path,
    folder: Path,
    *,
    tp: int,
    dp: int,
    engine: str = "deepspeed",
    task: dict[str, object] | None = None,
) -> JobSpec:
    """A job on the toy task: batches of 4, 12 new tokens, ``task`` fields on top."""
    folder.mkdir(parents=True, exist_ok=True)
    return JobSpec(
        job_id=7,
        checkpoint_path=checkpoint,
        result_path=folder / "result.json",
        task=TaskSpec.model_validate(
            {
                "name": "toy",
                "dataset": dataset,
                "prompt_template": PROMPT_TEMPLATE,
                "id_field": "id",
                "batch_size": 4,
                "max_new_tokens": 12,
                **(task or {}),
            }
        ),
        inference=InferenceSpec.model_validate({"engine": engine, "tp": tp, "dp": dp, "threads": 1}),
        max_samples=1000,
    )


def run_group(
    spec: JobSpec,
    env: dict[str, str] | None = None,
    *,
    hostfile: Path | None = None,
    launcher_args: Sequence[str] = (),
) -> Outcome:
    """Start the job exactly as the daemon does and read what it left."""
    spec_path = spec.result_path.parent / "spec.json"
    spec_path.write_text(spec.model_dump_json(), encoding="utf-8")
    command = worker_command(
        spec.inference, spec_path, python=worker_python(), hostfile=hostfile, launcher_args=launcher_args
    )
    # Tied to this test process as to a daemon: a test killed mid-run leaves no group behind.
    tie = {PARENT_PID_ENV: str(os.getpid())}
    worker = WorkerProcess.start(
        command, spec.result_path.parent / "worker.log", {**SUBPROCESS_ENV, **tie, **(env or {})}
    )
    try:
        code = wait_process(worker.process, TIMEOUT_S)
    finally:
        worker.kill()
    return read_outcome(spec, code, worker.log_path)


def evaluated(outcome: Outcome, where: Path) -> JobResult:
    log = (where / "worker.log").read_text(errors="replace")[-3000:]
    assert outcome.result is not None, f"{outcome.error_kind}: {outcome.error}\n{log}"
    return outcome.result


def outputs(result: JobResult) -> list[tuple[str, str, int, bool]]:
    return [(s.prompt_id, s.response, s.tokens, s.truncated) for s in result.samples]


@pytest.fixture(scope="module")
def single(toy_run: ToyRun, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, JobResult]:
    """The reference: tp=1, dp=1, one plain process, on 20 held-out problems."""
    from inference.toy.problems import held_out_problems, write_jsonl

    folder = tmp_path_factory.mktemp("single")
    dataset = folder / "heldout.jsonl"
    write_jsonl(held_out_problems(20, seed=1), dataset)
    spec = group_spec(toy_run.last_checkpoint, dataset, folder / "job", tp=1, dp=1)
    return dataset, evaluated(run_group(spec), folder / "job")


@pytest.mark.long
def test_tp2_dp2_gives_the_outputs_and_metrics_of_one_process(
    toy_run: ToyRun, single: tuple[Path, JobResult], tmp_path: Path
) -> None:
    dataset, reference = single
    spec = group_spec(toy_run.last_checkpoint, dataset, tmp_path, tp=2, dp=2)

    result = evaluated(run_group(spec), tmp_path)

    assert len(result.samples) == 20
    assert outputs(result) == outputs(reference)
    quality = {"accuracy", "response_length"}
    assert {m for m in result.metrics if m.name in quality} == {
        m for m in reference.metrics if m.name in quality
    }
    # Every batch of both replicas was compared across its two tp ranks, and they agreed.
    assert result.consistency is not None
    assert result.consistency.batches_checked == 6  # 10 items per replica, batches of 4
    assert result.consistency.disagreements == ()
    # Each rank logged to its own file.
    for rank in range(4):
        assert '"task.loaded"' in (tmp_path / f"rank-{rank}.log").read_text()


def test_hf_engine_runs_one_plain_process_per_replica(
    toy_run: ToyRun, single: tuple[Path, JobResult], tmp_path: Path
) -> None:
    dataset, reference = single
    spec = group_spec(toy_run.last_checkpoint, dataset, tmp_path, tp=1, dp=2, engine="hf")

    result = evaluated(run_group(spec), tmp_path)

    assert outputs(result) == outputs(reference)
    assert result.consistency is None


@pytest.mark.long
def test_deepspeeds_launcher_from_a_hostfile_runs_the_same_group(
    toy_run: ToyRun, single: tuple[Path, JobResult], tmp_path: Path
) -> None:
    """The several-node path, on this one node: DeepSpeed's launcher starts one rank per hostfile slot.
    Across real nodes it needs passwordless ssh; here launcher_args skip its ssh check and its ssh
    lookup of the master address, and give it a free port (its default, 29500, is shared by every group)."""
    dataset, reference = single
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    spec = group_spec(toy_run.last_checkpoint, dataset, tmp_path / "job", tp=2, dp=1)

    outcome = run_group(
        spec,
        {"DS_ACCELERATOR": "cpu"},
        hostfile=hostfile,
        launcher_args=["--no_ssh_check", "--master_addr", "127.0.0.1", "--master_port", str(free_port())],
    )

    result = evaluated(outcome, tmp_path / "job")
    assert outputs(result) == outputs(reference)
    assert result.consistency is not None and result.consistency.batches_checked == 5
    assert "deepspeed.launcher.launch" in (tmp_path / "job" / "worker.log").read_text()
    assert '"task.loaded"' in (tmp_path / "job" / "rank-1.log").read_text()


def test_tp2_logits_match_the_unsharded_model(toy_run: ToyRun, tmp_path: Path) -> None:
    out = tmp_path / "logits.json"
    done = subprocess.run(
        [
            worker_python(),
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "--module",
            "tests.tp_logits",
            str(toy_run.last_checkpoint),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=patient(TIMEOUT_S),
        env={**SUBPROCESS_ENV, "DS_ACCELERATOR": "cpu"},
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(out.read_text())

    assert found["max_abs_diff"] < 1e-5
    # The weights really were split: each rank holds half of every attention projection's rows.
    full_rows, columns = found["full_q_proj"]
    assert found["q_proj"] and all(shape == [full_rows // 2, columns] for shape in found["q_proj"].values())


@pytest.mark.long
def test_sampling_is_the_same_on_every_tp_rank_and_in_every_run(
    toy_run: ToyRun, single: tuple[Path, JobResult], tmp_path: Path
) -> None:
    dataset, _ = single
    sampling: dict[str, object] = {"n_samples": 3, "temperature": 1.0, "top_p": 0.95, "limit": 8}

    first = evaluated(
        run_group(group_spec(toy_run.last_checkpoint, dataset, tmp_path / "a", tp=2, dp=1, task=sampling)),
        tmp_path / "a",
    )
    second = evaluated(
        run_group(group_spec(toy_run.last_checkpoint, dataset, tmp_path / "b", tp=2, dp=1, task=sampling)),
        tmp_path / "b",
    )

    assert len(first.samples) == 8 * 3
    assert outputs(first) == outputs(second)
    # DeepSpeed's shared-memory all-reduce buffers (66 MB a rank) are gone once the group has mapped them.
    for folder in (tmp_path / "a", tmp_path / "b"):
        for rank in (0, 1):
            released = [
                json.loads(line)["path"]
                for line in (folder / f"rank-{rank}.log").read_text().splitlines()
                if '"group.shm_released"' in line
            ]
            assert len(released) == 1 and "deepspeed_allreduce_buffer_" in released[0]
            assert not Path(released[0]).exists()
    # Both tp ranks drew the same tokens in every batch (their digests were compared per batch).
    for result in (first, second):
        assert result.consistency is not None
        assert result.consistency.batches_checked == 2
        assert result.consistency.disagreements == ()
    # It did sample: the three completions of a prompt are not all the same answer.
    by_prompt: dict[str, set[str]] = {}
    for sample in first.samples:
        by_prompt.setdefault(sample.prompt_id, set()).add(sample.response)
    assert any(len(responses) > 1 for responses in by_prompt.values())


@pytest.mark.long
@pytest.mark.parametrize(("tp", "divergent", "outvoted", "tie"), [(2, 1, (1,), True), (3, 0, (0,), False)])
def test_a_divergent_tp_rank_is_outvoted_and_recorded(
    toy_run: ToyRun,
    single: tuple[Path, JobResult],
    tmp_path: Path,
    tp: int,
    divergent: int,
    outvoted: tuple[int, ...],
    tie: bool,
) -> None:
    """tp=3: the majority's tokens win even over the tp head's; tp=2 has no majority, and the head's win."""
    dataset, reference = single
    spec = group_spec(toy_run.last_checkpoint, dataset, tmp_path, tp=tp, dp=1, task={"limit": 8})

    result = evaluated(run_group(spec, {"EVALD_SIMULATE_DIVERGENT_TP_RANK": str(divergent)}), tmp_path)

    assert result.consistency is not None
    assert [(d.replica, d.batch, d.outvoted, d.tie) for d in result.consistency.disagreements] == [
        (0, 0, outvoted, tie)
    ]
    assert outputs(result) == outputs(reference)[:8]
