"""SIGKILL of the daemon and of its workers at random moments while the toy trainer writes checkpoints.

The trainer (``inference.toy.trainer``) saves ``step_N`` every 10 steps; the run evaluates every 20th
step (``freq_steps = 20``). At random moments (0.3–3 s apart, from daemon start-up to the queue's last
job) either the daemon or the running worker is killed with SIGKILL; the supervisor restarts the daemon
as systemd would. ``max_attempts`` is set above the number of kills, so no job runs out of tries: every
due checkpoint must end with exactly one stored result and one delivered alert.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from reliability.figures import Expected, Figures
from reliability.scenarios.base import Options
from reliability.workspace import (
    TASK,
    RunSpec,
    Workspace,
    environ_secrets,
    wait_for,
    workspace,
    write_dataset,
)

SAVE_EVERY = 10
FREQ_STEPS = 20


def worker_processes(state_dir: Path) -> list[psutil.Process]:
    """Processes whose command line names a job folder under ``state_dir`` (worker, launcher, ranks)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            cmdline = process.info["cmdline"] or []
        except psutil.Error:
            continue
        if any(str(state_dir) in part for part in cmdline):
            found.append(process)
    return found


def saved_steps(log: Path) -> list[int]:
    steps = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if '"trainer.saved"' in line:
            steps.append(int(json.loads(line)["step"]))
    return steps


def kill_worker(ws: Workspace, rng: random.Random, figures: Figures) -> bool:
    """SIGKILL a random process of the running worker, 0-3 s into its life (a few tries: a worker may end
    by itself first); False if none was caught."""
    for _ in range(5):
        wait_for(lambda: worker_processes(ws.state_dir) or None, 180, "a worker to kill")
        time.sleep(rng.uniform(0.0, 3.0))
        workers = worker_processes(ws.state_dir)
        for worker in workers:
            figures.secret_leaks.extend(environ_secrets(worker.pid, ws.secrets))
        if not workers:
            continue
        ws.fault("worker SIGKILL", "job.retrying", "job.recovered")
        try:
            rng.choice(workers).send_signal(signal.SIGKILL)
        except psutil.Error:
            ws.faults.pop()  # it ended by itself a moment ago: no fault injected
            continue
        return True
    return False


def run(options: Options) -> Figures:
    kills = options.pick(short=6, full=24)
    checkpoints = options.pick(short=6, full=24)
    figures = Figures("kill -9 daemon and workers")
    rng = random.Random(options.seed)
    with workspace("kills", options.workdir) as ws:
        root = ws.folder / "runs" / "toy"
        root.mkdir(parents=True)
        dataset = write_dataset(ws.folder / "arith.jsonl", 8)
        ws.write_config([RunSpec("toy", root, f"freq_steps = {FREQ_STEPS}")], dataset=dataset)
        ws.upgrade()
        trainer_log = ws.logs / "trainer.out"
        trainer = subprocess.Popen(
            [
                sys.executable, "-m", "inference.toy.trainer", "--out", str(root), "--threads", "1",
                "--steps", str(checkpoints * SAVE_EVERY), "--save-every", str(SAVE_EVERY),
                "--sleep-between-saves", str(options.pick(short=4.0, full=6.0)),
            ],
            stdout=trainer_log.open("wb"),
            stderr=(ws.logs / "trainer.err").open("wb"),
        )  # fmt: skip
        supervisor = ws.start_daemon()
        due = [s for s in range(SAVE_EVERY, checkpoints * SAVE_EVERY + 1, SAVE_EVERY) if s % FREQ_STEPS == 0]
        try:
            # Faults start once the trainer is writing; odd kills go to a worker, even ones to the daemon.
            wait_for(lambda: saved_steps(trainer_log) or None, 600, "the trainer's first checkpoint")
            for number in range(kills):
                if number % 2 == 1 and kill_worker(ws, rng, figures):
                    continue
                time.sleep(rng.uniform(0.3, 3.0))
                ws.fault("daemon SIGKILL", "supervisor.daemon_exited")
                if supervisor.kill() is None:
                    ws.faults.pop()
                    continue
                # The next kill may come during start-up, but not before the restart began.
                wait_for(lambda: supervisor.pid, 30, "the daemon to be restarted")
                if rng.random() < 0.7:
                    supervisor.wait_ready()
            if trainer.wait(timeout=options.pick(short=300, full=600)) != 0:
                figures.notes.append(f"the trainer exited with {trainer.returncode}")
            wait_for(lambda: ws.jobs_settled(len(due)), options.pick(short=300, full=600), "every due job")
        except TimeoutError as exc:
            figures.notes.append(str(exc))
        finally:
            if trainer.poll() is None:
                trainer.kill()
        written = saved_steps(trainer_log)
        figures.written = len(written)
        figures.notes.append(
            f"trainer saved steps {written[0] if written else '-'}..{written[-1] if written else '-'}"
        )
        expected = Expected(due=frozenset(f"toy/step_{s}" for s in due if s in written), tasks=(TASK,))
        figures.secret_leaks = sorted(set(figures.secret_leaks))
        return ws.finish(figures, expected)
