"""Slurm driven through its command-line tools: the one module that runs them.

``sbatch --parsable`` submits, ``scontrol show job -o`` reads one job, ``squeue --json`` lists the queue
(``squeue -h -o FORMAT`` where the version has no JSON output), ``scancel`` cancels, and ``sacct`` is asked
only when accounting answers (slurmdbd is often absent on small clusters). What they print is read by
:mod:`.slurm_output`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from daemon.running.executors.slurm_output import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SlurmError,
    SlurmJob,
    SlurmMissing,
    SlurmUnreachable,
    SubmitRejected,
    is_unreachable,
    parse_sacct,
    parse_sbatch,
    parse_scontrol_job,
    parse_sinfo_limits,
    parse_squeue_format,
    parse_squeue_json,
)

log = structlog.get_logger("evald.slurm")

#: Seconds one Slurm command may take; the tools retry a controller that does not answer for a few
#: seconds themselves (``MessageTimeout``), so this only bounds a hung one.
COMMAND_TIMEOUT_SECS = 60.0


class SlurmCli:
    """Runs the Slurm tools with ``env`` (``SLURM_CONF`` picks a cluster other than /etc/slurm's)."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        timeout_s: float = COMMAND_TIMEOUT_SECS,
        bindir: Path | None = None,
        json_output: bool | None = None,
    ) -> None:
        self._env = dict(os.environ if env is None else env)
        self._timeout = timeout_s
        self._bindir = bindir
        #: None until known: whether ``squeue --json`` works here (``json_output=False`` never asks), and
        #: whether accounting answers.
        self._json: bool | None = json_output
        self._accounting: bool | None = None
        #: Every command run, in order (the tests count ``sbatch`` calls).
        self.calls: list[tuple[str, ...]] = []

    def _binary(self, name: str) -> str:
        if self._bindir is not None:
            return str(self._bindir / name)
        found = shutil.which(name, path=self._env.get("PATH"))
        if found is None:
            raise SlurmMissing((name,), f"{name} not found on PATH (is this a Slurm submit host?)")
        return found

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command; a controller that does not answer raises :class:`SlurmUnreachable`."""
        command = (self._binary(args[0]), *args[1:])
        self.calls.append(tuple(args))
        try:
            done = subprocess.run(
                command,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self._timeout,
                env=self._env,
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmUnreachable(args, f"no answer in {self._timeout:g} s") from exc
        except OSError as exc:
            raise SlurmMissing(args, f"cannot run {command[0]}: {exc.strerror}") from exc
        if done.returncode != 0 and is_unreachable(done.stderr + done.stdout):
            raise SlurmUnreachable(args, _said(done), done.returncode)
        return done

    def submit(self, script: Path, args: Sequence[str] = ()) -> str:
        """``sbatch --parsable [ARGS] SCRIPT``: the new job's id."""
        done = self.run("sbatch", "--parsable", *args, str(script))
        if done.returncode != 0:
            raise SubmitRejected(("sbatch", str(script)), _said(done), done.returncode)
        try:
            return parse_sbatch(done.stdout)
        except ValueError as exc:
            raise SlurmError(("sbatch", str(script)), str(exc), done.returncode) from exc

    def test_submit(self, script: str) -> None:
        """``sbatch --test-only`` of the script text ``script`` (on stdin): whether Slurm would take the
        job, without queueing it; :class:`SubmitRejected` with its words when it would not."""
        done = self.run("sbatch", "--test-only", stdin=script)
        if done.returncode != 0:
            raise SubmitRejected(("sbatch", "--test-only"), _said(done), done.returncode)

    def show(self, job_id: str) -> SlurmJob | None:
        """``scontrol show job -o ID``; None once the controller has forgotten the job (``MinJobAge``
        after it ended, or a controller that lost its state)."""
        done = self.run("scontrol", "show", "job", "-o", job_id)
        if done.returncode != 0:
            if "invalid job id" in done.stderr.lower():
                return None
            raise SlurmError(("scontrol", "show"), _said(done), done.returncode)
        lines = [line for line in done.stdout.splitlines() if line.startswith("JobId=")]
        if not lines:
            return None
        # An array job prints one line per task; evald submits plain jobs, whose line is the only one.
        return parse_scontrol_job(lines[0])

    def queue(self) -> list[SlurmJob]:
        """Every job the controller holds (pending, running, and ended within ``MinJobAge``)."""
        if self._json is not False:
            done = self.run("squeue", "--json")
            if done.returncode == 0 and done.stdout.lstrip().startswith("{"):
                self._json = True
                return parse_squeue_json(done.stdout)
            if self._json is None:
                # A version or build without the JSON output (before 21.08, or no openapi plugin).
                log.info("slurm.squeue_json_unavailable", said=_said(done))
                self._json = False
            else:
                raise SlurmError(("squeue", "--json"), _said(done), done.returncode)
        done = self.run("squeue", "-h", "-t", "all", "-o", SQUEUE_FORMAT)
        if done.returncode != 0:
            raise SlurmError(("squeue", "-o"), _said(done), done.returncode)
        return parse_squeue_format(done.stdout)

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        args = ["scancel", *([f"--signal={signal}"] if signal else []), job_id]
        done = self.run(*args)
        if done.returncode != 0 and "invalid job id" not in done.stderr.lower():
            raise SlurmError(("scancel", job_id), _said(done), done.returncode)

    def accounting(self, job_id: str) -> SlurmJob | None:
        """The job from ``sacct``, where accounting answers; None where it is disabled or has no row."""
        if self._accounting is False:
            return None
        try:
            done = self.run("sacct", "-X", "-n", "-P", "-j", job_id, "-o", ",".join(SACCT_FIELDS))
        except SlurmMissing:
            self._accounting = False
            return None
        if done.returncode != 0:
            said = _said(done)
            if "accounting storage is disabled" in said.lower() or self._accounting is None:
                log.info("slurm.accounting_unavailable", said=said)
                self._accounting = False
                return None
            raise SlurmError(("sacct", job_id), said, done.returncode)
        self._accounting = True
        rows = [job for job in parse_sacct(done.stdout) if job.job_id == job_id]
        return rows[0] if rows else None

    def partitions(self) -> list[str]:
        """The partitions this cluster has (``sinfo``), default first marked by Slurm's ``*`` removed."""
        done = self.run("sinfo", "-h", "-o", "%R")
        if done.returncode != 0:
            raise SlurmError(("sinfo",), _said(done), done.returncode)
        names = []
        for name in done.stdout.split():
            if name not in names:
                names.append(name)
        return names

    def partition_limits(self) -> dict[str, int | None]:
        """Each partition's MaxTime in seconds (None: no limit), in ``sinfo``'s order."""
        done = self.run("sinfo", "-h", "-o", "%R|%l")
        if done.returncode != 0:
            raise SlurmError(("sinfo",), _said(done), done.returncode)
        return parse_sinfo_limits(done.stdout)

    def partition_nodes(self, partition: str) -> list[str]:
        """The nodes of ``partition``, one name each."""
        done = self.run("sinfo", "-h", "-N", "-p", partition, "-o", "%N")
        if done.returncode != 0:
            raise SlurmError(("sinfo", "-N"), _said(done), done.returncode)
        return list(dict.fromkeys(done.stdout.split()))

    def partition_offers(self, partition: str) -> tuple[list[str], list[str]]:
        """The features and the GRES the nodes of ``partition`` have (``sinfo %f``, ``%G``)."""
        done = self.run("sinfo", "-h", "-p", partition, "-o", "%f|%G")
        if done.returncode != 0:
            raise SlurmError(("sinfo", "-p"), _said(done), done.returncode)
        features: dict[str, None] = {}
        gres: dict[str, None] = {}
        for line in done.stdout.splitlines():
            have, _, given = line.strip().partition("|")
            for found, into in ((have, features), (given, gres)):
                for item in found.split(","):
                    if item.strip() and item.strip() != "(null)":
                        into[item.strip()] = None
        return list(features), list(gres)

    def hostnames(self, nodelist: str) -> list[str]:
        """``scontrol show hostnames``: ``node[1-2]`` as ``node1``, ``node2``."""
        if not nodelist:
            return []
        done = self.run("scontrol", "show", "hostnames", nodelist)
        if done.returncode != 0:
            raise SlurmError(("scontrol", "show", "hostnames"), _said(done), done.returncode)
        return done.stdout.split()

    def ping(self) -> bool:
        with contextlib.suppress(SlurmError):
            done = self.run("scontrol", "ping")
            return done.returncode == 0 and "UP" in done.stdout
        return False


def _said(done: subprocess.CompletedProcess[str]) -> str:
    text = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()
    return " ".join(line.strip() for line in text[-3:])
