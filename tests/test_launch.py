"""Starting a worker group and reading what it left, without running one (those are test_worker_group)."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.cli.evaluate import override_layout
from daemon.config import InferenceConfig, TaskConfig
from daemon.errors import ConfigError
from daemon.running.workers import describe_exit, failed_rank, read_outcome
from inference.launcher import worker_command
from inference.spec import InferenceSpec, JobResult, JobSpec, TaskSpec, WorkerError

TORCHRUN_SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
inference.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_15:14:56
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 5315)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_15:14:56
  host      : localhost
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 5317)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 5317
============================================================
"""


def _spec(tmp_path: Path, **inference: object) -> JobSpec:
    return JobSpec(
        job_id=1,
        checkpoint_path=tmp_path / "ckpt",
        result_path=tmp_path / "result.json",
        task=TaskSpec(name="t", dataset=tmp_path / "d.jsonl"),
        inference=InferenceSpec.model_validate(inference),
    )


def test_one_rank_runs_the_worker_and_a_group_runs_torchrun_through_the_launcher(tmp_path: Path) -> None:
    spec_path = tmp_path / "spec.json"
    alone = worker_command(InferenceSpec(), spec_path, python="py", hostfile=None)
    group = worker_command(InferenceSpec(tp=2, dp=3), spec_path, python="py", hostfile=None)
    nodes = worker_command(
        InferenceSpec(tp=8, dp=2),
        spec_path,
        python="py",
        hostfile=tmp_path / "hosts",
        launcher_args=["--x", "1"],
    )

    assert alone == ["py", "-m", "inference.worker", str(spec_path)]
    assert group[:5] == ["py", "-m", "inference.launcher", "--", "py"]
    assert "--nproc-per-node=6" in group and "--standalone" in group
    assert group[-3:] == ["--module", "inference.worker", str(spec_path)]
    assert nodes[:4] == ["py", "-m", "inference.launcher", "--untied"]
    # One rank needs no launcher, hostfile or not.
    assert worker_command(InferenceSpec(), spec_path, python="py", hostfile=tmp_path / "hosts") == alone
    assert nodes[7:11] == [
        "deepspeed.launcher.runner",
        "--hostfile",
        str(tmp_path / "hosts"),
        "--no_local_rank",
    ]
    assert nodes[11:] == ["--x", "1", "--module", "inference.worker", str(spec_path)]


def test_failed_rank_reads_torchruns_root_cause() -> None:
    assert failed_rank(TORCHRUN_SUMMARY) == (3, -9)
    assert failed_rank("Traceback: something else") is None


#: Rank 1 killed (SIGKILL), rank 0 ending at once on gloo's "Connection closed by peer": in the same
#: second, and torchrun named rank 0 (seen in half the runs of test_worker_failures' killed-rank test).
SIGNALLED_PEER = """Failures:
[1]:
  time      : 2026-12-07_08:06:20
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 20759)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 20759
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_08:06:20
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 20758)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_a_rank_killed_by_a_signal_is_the_cause_over_a_peer_that_exited_with_an_error() -> None:
    assert failed_rank(SIGNALLED_PEER) == (1, -9)
    # No signal among the failures: torchrun's root cause stands.
    assert failed_rank(SIGNALLED_PEER.replace("-9 (pid: 20759)  (SIGKILL)", "2 (pid: 20759)")) == (0, 1)
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(1) == "exit status 1"


def test_a_crash_names_the_rank_that_died_and_quotes_its_log(tmp_path: Path) -> None:
    spec = _spec(tmp_path, tp=2, dp=2)
    (tmp_path / "worker.log").write_text(TORCHRUN_SUMMARY)
    (tmp_path / "rank-3.log").write_text('{"event": "task.loaded", "rank": 3}\n')

    outcome = read_outcome(spec, 1, tmp_path / "worker.log")

    assert (outcome.result, outcome.error_kind) == (None, "crash")
    # Its log holds no error: the signal is the cause, and the log's tail follows below it.
    assert (
        outcome.error == "rank 3 failed (killed by SIGKILL), with no error in its log\n"
        'its log ends:\n{"event": "task.loaded", "rank": 3}'
    )


def test_without_a_summary_the_crash_quotes_the_workers_own_log(tmp_path: Path) -> None:
    (tmp_path / "worker.log").write_text("Traceback (most recent call last):\nZeroDivisionError\n")
    outcome = read_outcome(_spec(tmp_path), 1, tmp_path / "worker.log")
    assert outcome.error == (
        "worker exit status 1: ZeroDivisionError\n"
        "its log ends:\nTraceback (most recent call last):\nZeroDivisionError"
    )


def test_out_of_memory_on_any_rank_decides_over_the_errors_it_caused(tmp_path: Path) -> None:
    spec = _spec(tmp_path, tp=2)
    JobResult(job_id=1, error=WorkerError(kind="checkpoint_invalid", message="peer gone")).write(
        spec.result_path
    )
    oom = JobResult(job_id=1, error=WorkerError(kind="out_of_memory", message="rank 1: out of memory"))
    oom.write(tmp_path / "result.rank1.json")

    outcome = read_outcome(spec, 1, tmp_path / "worker.log")

    assert (outcome.error_kind, outcome.error) == ("out_of_memory", "rank 1: out of memory")


def test_exit_zero_without_a_result_is_a_crash(tmp_path: Path) -> None:
    outcome = read_outcome(_spec(tmp_path), 0, tmp_path / "worker.log")
    assert (outcome.error_kind, outcome.error) == ("crash", "worker exited without writing a result")


def test_config_refuses_layouts_that_cannot_work(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="engine 'hf' cannot shard a model"):
        InferenceConfig(engine="hf", tp=2)
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("{}\n")
    with pytest.raises(ValueError, match="n_samples = 4 draws identical greedy answers"):
        TaskConfig(name="t", dataset=dataset, n_samples=4)
    assert TaskConfig(name="t", dataset=dataset, n_samples=4, temperature=0.7).spec().n_samples == 4


def test_a_hostfile_must_have_one_slot_per_rank(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two nodes\nnode-a slots=8\nnode-b slots=8  # the second\n")
    assert InferenceConfig(hostfile=hostfile, tp=8, dp=2).hostfile == hostfile
    with pytest.raises(
        ValueError, match=r"has 16 slots but tp × dp = 8: DeepSpeed's launcher starts one rank"
    ):
        InferenceConfig(hostfile=hostfile, tp=8, dp=1)
    hostfile.write_text("node-a 8\n")
    with pytest.raises(ValueError, match=r"hostfile:1: expected 'HOST slots=N', got 'node-a 8'"):
        InferenceConfig(hostfile=hostfile, tp=8, dp=1)


def test_the_command_line_overrides_engine_tp_and_dp_for_one_evaluation() -> None:
    configured = InferenceConfig(tp=2, dp=1, dtype="bfloat16")

    assert override_layout(configured, engine=None, tp=None, dp=4) == InferenceSpec(
        tp=2, dp=4, dtype="bfloat16"
    )
    assert override_layout(configured, engine="hf", tp=1, dp=None).engine == "hf"
    with pytest.raises(ConfigError, match="engine 'hf' cannot shard a model"):
        override_layout(configured, engine="hf", tp=None, dp=None)
    with pytest.raises(ConfigError, match="--tp: Input should be greater than or equal to 1"):
        override_layout(configured, engine=None, tp=0, dp=None)
