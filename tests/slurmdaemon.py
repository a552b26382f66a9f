"""The daemon with ``[executor] kind = "slurm"`` on the tests' one-host cluster (tests/slurmcluster.py).

:func:`slurm_config` writes the daemon tests' config (tests/harness.py) with an ``[executor]`` section;
:func:`counting_path` puts an ``sbatch`` on PATH that logs each call and then runs the real one, so that a
test counts submissions; :func:`evald_jobs` lists what the controller holds under a config's prefix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.deadlines import patient
from tests.harness import write_config
from tests.slurmcluster import PARTITION, SlurmCluster


@dataclass(frozen=True)
class SlurmDaemon:
    config: Path
    job_dir: Path
    prefix: str
    #: One line per ``sbatch`` call the daemon made.
    sbatch_log: Path
    env: dict[str, str]

    def sbatch_calls(self) -> int:
        """Submissions of evaluation jobs (the job folder probe, ``.probe-*``, is not one)."""
        if not self.sbatch_log.exists():
            return 0
        lines = self.sbatch_log.read_text(encoding="utf-8").splitlines()
        return len([line for line in lines if "/.probe-" not in line])

    def probes(self) -> int:
        if not self.sbatch_log.exists():
            return 0
        return len([x for x in self.sbatch_log.read_text(encoding="utf-8").splitlines() if "/.probe-" in x])

    def queue(self) -> list[dict[str, str]]:
        """This config's jobs the controller holds: id, name, state (``squeue``, all states)."""
        done = subprocess.run(
            ["squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%r"],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=patient(60),
            check=True,
        )
        rows = [line.split("|") for line in done.stdout.splitlines() if line.strip()]
        return [
            {"id": r[0], "name": r[1], "state": r[2], "reason": r[3]}
            for r in rows
            if r[1].startswith(f"{self.prefix}-") and r[1] != f"{self.prefix}-probe"
        ]

    def cancel_all(self) -> None:
        for job in self.queue():
            if job["state"] in ("CANCELLED", "COMPLETED", "FAILED", "TIMEOUT"):
                continue
            subprocess.run(["scancel", job["id"]], env=self.env, capture_output=True, timeout=patient(60))


def counting_path(folder: Path, log: Path, hang: Path | None = None) -> str:
    """A folder holding an ``sbatch`` that appends its arguments to ``log`` and execs the real one; while
    the file ``hang`` exists it waits first (a hung ``sbatch``, as a controller that does not answer)."""
    real = shutil.which("sbatch") or "/usr/bin/sbatch"
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "sbatch"
    wait = f"while [ -e {hang} ]; do sleep 0.2; done\n" if hang is not None else ""
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\n{wait}exec {real} "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    return str(folder)


def slurm_config(
    tmp: Path,
    url: str,
    cluster: SlurmCluster,
    *,
    dataset: Path,
    partition: str = PARTITION,
    time_limit: str = "5",
    executor_extra: str = "",
    hang: Path | None = None,
    **settings: object,
) -> SlurmDaemon:
    """The harness config with ``[executor] kind = "slurm"`` (its own name prefix: a test sees only its
    jobs) and the environment to start the daemon with (``SLURM_CONF``, the counting ``sbatch``, which
    hangs while the file ``hang`` exists)."""
    job_dir = tmp / "slurm-jobs"
    job_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    path = write_config(tmp, url, dataset=dataset, **settings)  # type: ignore[arg-type]
    section = f"""
[executor]
kind = "slurm"
partition = "{partition}"
job_dir = "{job_dir}"
name_prefix = "{prefix}"
time_limit = "{time_limit}"
poll_secs = 0.5
{executor_extra}
"""
    path.write_text(path.read_text(encoding="utf-8") + section, encoding="utf-8")
    sbatch_log = tmp / "sbatch-calls.log"
    bindir = counting_path(tmp / "bin", sbatch_log, hang)
    env = {
        **os.environ,
        **cluster.env,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
    }
    return SlurmDaemon(path, job_dir, prefix, sbatch_log, env)


def history_json(config: Path, job_id: int, env: dict[str, str]) -> list[dict[str, object]]:
    from tests.harness import evald

    done = evald("--config", str(config), "history", str(job_id), "--format", "json", env=env)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows
