"""The Slurm parsers over outputs a real Slurm 22.05 printed (tests/slurm/outputs), and [executor]'s
validation (``extra_sbatch`` may not override evald's own options, in any of their forms). No cluster
needed: the live tests are in test_slurm_executor.py.

The outputs were captured from the one-host test cluster (tests/slurmcluster.py) with jobs 1-7: 1, 2
``--wrap`` jobs that completed; 3 ``exit 3`` (comment ``evald job=5 attempt=2``); 4 scancelled while
running; 5 ``--hold``; 6 ``--time=1`` around ``sleep 300``; 7 ``--begin=now+1hour``. The ``-controller-down``
file is ``squeue --json`` while slurmctld was stopped; ``squeue-format`` was printed with SQUEUE_FORMAT after
5 and 7 were cancelled.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from daemon.config import ExecutorConfig, parse_executor
from daemon.config.executor import slurm_seconds, slurm_time
from daemon.errors import ConfigError
from daemon.running.executors.slurm_output import (
    SlurmError,
    SlurmUnreachable,
    parse_duration,
    parse_sbatch,
    parse_scontrol_job,
    parse_squeue_format,
    parse_squeue_json,
)

OUTPUTS = Path(__file__).parent / "slurm" / "outputs"


def _local(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def test_squeue_json_of_22_05() -> None:
    jobs = {job.job_id: job for job in parse_squeue_json((OUTPUTS / "squeue-22.05.json").read_text())}

    assert sorted(jobs, key=int) == ["1", "2", "3", "4", "5", "6", "7"]
    failed, cancelled, held, timed_out, later = (jobs[i] for i in ("3", "4", "5", "6", "7"))
    assert (failed.state, failed.reason, failed.exit_code, failed.exit_signal) == (
        "FAILED",
        "NonZeroExitCode",
        3,
        None,
    )
    assert failed.comment == "evald job=5 attempt=2"
    assert failed.name == "evald-cap-fail"
    assert (failed.nodes, failed.partition, failed.batch_host) == ("vm", "debug", "vm")
    assert (cancelled.state, cancelled.exit_code, cancelled.exit_signal) == ("CANCELLED", 0, 15)
    assert cancelled.finished and failed.finished and not held.finished
    assert (held.state, held.reason, held.nodes, held.start_time) == ("PENDING", "JobHeldUser", "", None)
    assert (later.state, later.reason) == ("PENDING", "BeginTime")
    assert (timed_out.state, timed_out.reason, timed_out.time_limit_s) == ("TIMEOUT", "TimeLimit", 60)
    assert timed_out.run_s == 60.0
    assert timed_out.queue_wait_s == 3.0
    assert jobs["1"].time_limit_s is None  # UNLIMITED


def test_squeue_json_with_the_controller_away_is_unreachable_not_an_empty_queue() -> None:
    text = (OUTPUTS / "squeue-22.05-controller-down.json").read_text()

    with pytest.raises(SlurmUnreachable, match="slurm_load_jobs: Failed while looking for jobs"):
        parse_squeue_json(text)


def test_squeue_json_that_is_not_json() -> None:
    with pytest.raises(SlurmError, match="not JSON"):
        parse_squeue_json("squeue: error: Invalid job state")


def test_scontrol_and_squeue_agree() -> None:
    """The same jobs, read from scontrol show job -o and squeue --json, captured a minute apart."""
    json_jobs = {job.job_id: job for job in parse_squeue_json((OUTPUTS / "squeue-22.05.json").read_text())}
    lines = (OUTPUTS / "scontrol-show-job-22.05.txt").read_text().splitlines()
    shown = {job.job_id: job for job in map(parse_scontrol_job, lines)}

    assert sorted(shown) == ["3", "4", "5", "6", "7"]
    for job_id, job in shown.items():
        other = json_jobs[job_id]
        assert (job.state, job.reason, job.name, job.nodes, job.partition) == (
            other.state,
            other.reason,
            other.name,
            other.nodes,
            other.partition,
        )
        assert (job.exit_code, job.exit_signal, job.time_limit_s) == (
            other.exit_code,
            other.exit_signal,
            other.time_limit_s,
        )
        assert (job.submit_time, job.start_time) == (other.submit_time, other.start_time), job_id
    assert shown["6"].end_time == _local("2026-12-01T21:10:22")
    assert shown["3"].exit_code == 3
    assert shown["4"].exit_signal == 15


def test_a_comment_with_spaces_is_cut_in_scontrol_output() -> None:
    """scontrol -o prints values unquoted: ``Comment=evald job=5 attempt=2`` reads as three pairs. That
    is why evald's comments have no spaces (``evald:job=5:attempt=2:run=...``)."""
    line = (OUTPUTS / "scontrol-show-job-22.05.txt").read_text().splitlines()[0]

    assert parse_scontrol_job(line).comment == "evald"


def test_squeue_format_fallback() -> None:
    jobs = {j.job_id: j for j in parse_squeue_format((OUTPUTS / "squeue-format-22.05.txt").read_text())}

    assert (jobs["6"].state, jobs["6"].reason, jobs["6"].time_limit_s) == ("TIMEOUT", "TimeLimit", 60)
    assert jobs["6"].start_time == _local("2026-12-01T21:09:22")
    assert jobs["6"].end_time == _local("2026-12-01T21:10:22")
    # Captured after jobs 5 and 7 were cancelled while pending: no node, the hold still the reason.
    assert (jobs["5"].state, jobs["5"].reason, jobs["5"].nodes) == ("CANCELLED", "JobHeldUser", "")
    assert (jobs["5"].batch_host, jobs["6"].batch_host) == ("", "vm")
    assert jobs["3"].comment == "evald job=5 attempt=2"
    assert jobs["1"].comment == ""  # squeue prints (null)


def test_squeue_format_line_with_missing_fields() -> None:
    with pytest.raises(ValueError, match="has 3 fields, not 12"):
        parse_squeue_format("1|RUNNING|None\n")


def test_sbatch_parsable() -> None:
    assert parse_sbatch("42\n") == "42"
    assert parse_sbatch("42;cluster2\n") == "42"
    with pytest.raises(ValueError, match="no job id"):
        parse_sbatch("Submitted batch job 42\n")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1:00", 60),
        ("00:01:00", 60),
        ("2-03:04:05", 183845),
        ("UNLIMITED", None),
        ("45", 45),
        # squeue printed INVALID for a held job's limit once: no limit, not a failed read of the queue.
        ("INVALID", None),
        ("NOT_SET", None),
    ],
)
def test_durations(text: str, seconds: int | None) -> None:
    assert parse_duration(text) == seconds


# --- [executor] ---------------------------------------------------------------------------------


def test_executor_defaults_to_local() -> None:
    assert parse_executor({}, base_dir=Path.cwd(), source="evald.toml") == ExecutorConfig(kind="local")


def test_slurm_executor_config(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "env.sh").write_text("module load cuda\n")
    data = {
        "runs": [{"name": "ignored: daemon.config reads it"}],
        "executor": {
            "kind": "slurm",
            "partition": "gpu",
            "job_dir": "jobs",
            "account": "rl",
            "time_limit": "1:30:00",
            "extra_sbatch": [" --constraint=a100"],
            "setup_script": "env.sh",
            "max_queued": 4,
            "max_queued_per_run": 2,
        },
    }

    config = parse_executor(data, base_dir=tmp_path, source="evald.toml")

    assert (config.kind, config.partition, config.job_dir) == ("slurm", "gpu", tmp_path / "jobs")
    assert config.setup_script == tmp_path / "env.sh"
    assert config.extra_sbatch == ("--constraint=a100",)
    assert config.time_limit_minutes(3600) == "1:30:00"
    assert config.model_copy(update={"time_limit": None}).time_limit_minutes(3601) == "61"


def test_bad_executor_configs_name_each_field(tmp_path: Path) -> None:
    (tmp_path / "with space").mkdir()
    data = {
        "executor": {
            "kind": "slurm",
            "job_dir": "with space",
            "time_limit": "an hour",
            "extra_sbatch": ["--constraint=a100", "constraint=x", "--job-name=mine"],
            "setup_script": "missing.sh",
            "max_queued": 2,
            "max_queued_per_run": 3,
            "qeue": "x",
        }
    }

    with pytest.raises(ConfigError) as caught:
        parse_executor(data, base_dir=tmp_path, source="evald.toml")

    problems = caught.value.problems
    assert 'executor.partition: required when kind = "slurm"' in problems
    assert (
        f"executor.job_dir: {tmp_path / 'with space'}: a job folder for Slurm may not contain '%' or spaces"
        in (problems)
    )
    assert any(p.startswith("executor.time_limit: 'an hour' is not a Slurm time limit") for p in problems)
    assert (
        "executor.extra_sbatch: [1] 'constraint=x' is not one sbatch option (like \"--constraint=a100\"); "
        "[2] --job-name is set by evald itself for every job" in problems
    )
    assert f"executor.setup_script: file not found: {tmp_path / 'missing.sh'}" in problems
    assert "executor.max_queued_per_run: 3 is more than max_queued = 2" in problems
    assert "executor.qeue: unknown field" in problems
    assert str(caught.value).startswith("evald.toml: ")


def test_slurm_settings_under_a_local_executor_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_executor({"executor": {"partition": "gpu"}}, base_dir=tmp_path, source="evald.toml")

    assert caught.value.problems == ['executor.partition: applies only to kind = "slurm"']


def test_a_missing_job_dir(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_executor(
            {"executor": {"kind": "slurm", "partition": "gpu", "job_dir": "nope"}},
            base_dir=tmp_path,
            source="evald.toml",
        )

    assert caught.value.problems == [
        f"executor.job_dir: folder not found: {tmp_path / 'nope'} (create it on the shared filesystem)"
    ]


#: evald's own sbatch options in every form sbatch reads (long, ``=`` or space, short, short with the
#: value attached, an abbreviation), each with the setting the refusal names instead.
OVERRIDES = [
    ("--time=30", "--time", "executor.time_limit"),
    ("--time 30", "--time", "executor.time_limit"),
    ("-t 30", "-t", "executor.time_limit"),
    ("-t30", "-t", "executor.time_limit"),
    ("--tim=30", "--tim", "executor.time_limit"),
    ("--partition=gpu2", "--partition", "executor.partition"),
    ("-p gpu2", "-p", "executor.partition"),
    ("--part=gpu2", "--part", "executor.partition"),
    ("--nodes=2", "--nodes", "executor.nodes"),
    ("-N2", "-N", "executor.nodes"),
    ("--cpus-per-task=4", "--cpus-per-task", "executor.cpus_per_task"),
    ("-c 4", "-c", "executor.cpus_per_task"),
    ("--export=NONE", "--export", "[inference] worker_env"),
    ("--export-file=/etc/env", "--export-file", "[inference] worker_env"),
    ("--export-f=/etc/env", "--export-f", "[inference] worker_env"),
    ("--requeue", "--requeue", "executor.requeue"),
    ("--no-requeue", "--no-requeue", "executor.requeue"),
    ("--account=other", "--account", "executor.account"),
    ("-A other", "-A", "executor.account"),
    ("--qos=high", "--qos", "executor.qos"),
    ("-q high", "-q", "executor.qos"),
    ("--mem=8G", "--mem", "executor.mem"),
    ("--exclude=node3", "--exclude", "executor.exclude"),
    ("-x node3", "-x", "executor.exclude"),
    ("-J mine", "-J", "set by evald itself"),
    ("--open-mode=truncate", "--open-mode", "set by evald itself"),
]


@pytest.mark.parametrize(("line", "option", "instead"), OVERRIDES)
def test_extra_sbatch_cannot_override_evalds_own_options(
    tmp_path: Path, line: str, option: str, instead: str
) -> None:
    (tmp_path / "jobs").mkdir(exist_ok=True)
    data = {"executor": {"kind": "slurm", "partition": "gpu", "job_dir": "jobs", "extra_sbatch": [line]}}

    with pytest.raises(ConfigError) as caught:
        parse_executor(data, base_dir=tmp_path, source="evald.toml")

    (problem,) = caught.value.problems
    assert problem.startswith(f"executor.extra_sbatch: [0] {option} ") and instead in problem


@pytest.mark.parametrize(
    "line",
    [
        "--constraint=a100",
        "-C a100",
        "--exclusive",
        "--gres=nvme:1",
        "--mem-per-gpu=40G",
        "--time-min=10",
        "--nodelist=node1",
        "-w node1",
        "--hold",
        "--reservation=maint",
    ],
)
def test_other_sbatch_options_are_taken(tmp_path: Path, line: str) -> None:
    (tmp_path / "jobs").mkdir(exist_ok=True)
    data = {"executor": {"kind": "slurm", "partition": "gpu", "job_dir": "jobs", "extra_sbatch": [line]}}
    assert parse_executor(data, base_dir=tmp_path, source="evald.toml").extra_sbatch == (line,)


def test_the_time_limits_in_seconds(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    base = {"kind": "slurm", "partition": "gpu", "job_dir": "jobs"}
    config = parse_executor({"executor": base}, base_dir=tmp_path, source="evald.toml")
    # Unset: job_timeout_secs rounded up to minutes, and 4 × that at most.
    assert (config.time_limit_secs(3601), config.max_time_limit_secs(3601)) == (61 * 60, 4 * 61 * 60)
    for text, seconds in [
        ("90", 5400),
        ("1:30", 90),
        ("2:00:00", 7200),
        ("1-12", 36 * 3600),
        ("1-0:30", 24 * 3600 + 1800),
        ("1-0:0:5", 86405),
    ]:
        limited = parse_executor(
            {"executor": {**base, "time_limit": text}}, base_dir=tmp_path, source="evald.toml"
        )
        assert limited.time_limit_secs(60) == seconds, text
    capped = parse_executor(
        {"executor": {**base, "time_limit": "1:00:00", "max_time_limit": "3:00:00"}},
        base_dir=tmp_path,
        source="evald.toml",
    )
    assert (capped.time_limit_secs(60), capped.max_time_limit_secs(60)) == (3600, 3 * 3600)
    with pytest.raises(ConfigError) as caught:
        parse_executor(
            {"executor": {**base, "time_limit": "2:00:00", "max_time_limit": "90"}},
            base_dir=tmp_path,
            source="evald.toml",
        )
    assert caught.value.problems == ["executor.max_time_limit: '90' is less than time_limit = '2:00:00'"]


def test_slurm_time_writes_what_slurm_reads() -> None:
    for seconds in (60, 7200, 5400, 90, 86405):
        assert slurm_seconds(slurm_time(seconds)) == seconds
    assert (slurm_time(7200), slurm_time(90)) == ("120", "0:01:30")
