"""Daemon start: the CPU and wall time of ``evald run`` from its process's start to ``daemon.ready``, and
from SIGTERM to its exit, on the embedded default (a SQLite file, the local executor, the CPU).

Each start is a new ``python -m daemon --config ... run`` process (what ``tests/harness.py``'s
``DaemonProcess`` starts, about a hundred times a test suite), on a config like the harness's: one run
folder with no checkpoint, one ``arith`` task, JSON logs. It is timed until ``"daemon.ready"`` appears in
its log, then sent SIGTERM and timed until it exits. Two cases, and a baseline, in the same rounds and
interleaved so the machine's load falls on all alike:

- ``python -c pass``: the interpreter's own start, below which no start can go;
- ``database at head``: the database brought to the current schema first (``evald db upgrade``), as the
  tests and every later start of a daemon have it: the schema is checked by reading its revision;
- ``new database``: a SQLite file that does not exist yet, which the daemon's first start creates and
  migrates (``db.created``, alembic and every migration file).

Prints per case the median wall time to ready and of the stop, and the median CPU time (user and
system) of the process: at ready (``/proc``, in clock ticks) and in all (its rusage, at exit), which the
machine's other load changes less than the wall time. evald's bytecode is written first (as an installed
evald has it).

    python -m bench.daemon_start [--rounds 15]
"""

from __future__ import annotations

import argparse
import compileall
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.toy_config import EVALUATED, toy_config
from inference.toy import problems

#: As tests/harness.py's daemons run: one thread, a short quiet period and tick.
SECTIONS = """\
[inference]
threads = 1

[scheduling]
quiet_secs = 0.5
rescan_secs = 2.0
tick_secs = 0.05
"""

#: How often the log is read for ``daemon.ready`` (the reading is this process's CPU, not the daemon's).
POLL_SECS = 0.005
#: A start or a stop that takes longer is a failure, not a figure.
GIVE_UP_SECS = 60.0


@dataclass(frozen=True)
class Start:
    """One daemon's start and stop: wall seconds to ready and of the stop, CPU seconds at ready and in all."""

    ready_s: float
    stop_s: float
    cpu_ready_s: float
    cpu_s: float


def write_config(folder: Path, dataset: Path, db: Path) -> Path:
    folder.mkdir()
    (folder / "run").mkdir()
    config = folder / "evald.toml"
    config.write_text(
        toy_config(
            db,
            folder / "run",
            dataset,
            folder / "state",
            task=EVALUATED,
            sections=SECTIONS,
            daemon='log_format = "json"\n',
        )
    )
    return config


def daemon(config: Path) -> list[str]:
    return [sys.executable, "-m", "daemon", "--config", str(config), "run"]


def cpu_so_far(pid: int) -> float:
    """User and system seconds the live process ``pid`` has used (``/proc``: clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_and_stop(command: list[str], log: Path, ready: bytes | None) -> Start:
    """Start ``command`` with its output in ``log``; once ``ready`` is in the log send SIGTERM, and wait
    for the exit. ``ready`` None (the baseline, which exits by itself): its whole life counts as its start."""
    with log.open("wb") as out:
        began = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    at_ready, cpu_ready = began, 0.0
    if ready is not None:
        while ready not in log.read_bytes():
            if process.poll() is not None or time.perf_counter() - began > GIVE_UP_SECS:
                process.kill()
                raise SystemExit(f"{' '.join(command)}: no {ready!r}: {log.read_text()[-2000:]}")
            time.sleep(POLL_SECS)
        at_ready, cpu_ready = time.perf_counter(), cpu_so_far(process.pid)
        process.send_signal(signal.SIGTERM)
    _, status, used = os.wait4(process.pid, 0)
    ended = time.perf_counter()
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {process.returncode}: {log.read_text()[-2000:]}")
    cpu = used.ru_utime + used.ru_stime
    if ready is None:
        return Start(ended - began, 0.0, cpu, cpu)
    return Start(at_ready - began, ended - at_ready, cpu_ready, cpu)


def rounds(folder: Path, count: int) -> dict[str, list[Start]]:
    """``count`` rounds of the baseline and both cases, interleaved."""
    dataset = folder / "arith.jsonl"
    assert problems.main(["--out", str(dataset), "--n", "5", "--seed", "3"]) == 0
    at_head = write_config(folder / "head", dataset, folder / "head" / "evald.db")
    upgrade = subprocess.run([*daemon(at_head)[:-1], "db", "upgrade"], capture_output=True, text=True)
    if upgrade.returncode != 0:
        raise SystemExit(f"evald db upgrade: {upgrade.stderr[-2000:]}")
    ready, baseline = b'"daemon.ready"', [sys.executable, "-c", "pass"]
    starts: dict[str, list[Start]] = {"python -c pass": [], "database at head": [], "new database": []}
    for i in range(count):
        fresh = write_config(folder / f"new{i}", dataset, folder / f"new{i}" / "evald.db")
        starts["python -c pass"].append(start_and_stop(baseline, folder / "pass.log", None))
        starts["database at head"].append(start_and_stop(daemon(at_head), folder / "head.log", ready))
        starts["new database"].append(start_and_stop(daemon(fresh), folder / "new.log", ready))
    return starts


def print_table(starts: dict[str, list[Start]]) -> None:
    def median_ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:8.0f}ms"

    print(f"{'':18} {'to ready':>10} {'stop':>10} {'CPU at ready':>13} {'CPU in all':>11} {'/ start':>8}")
    start_cpu = statistics.median(s.cpu_s for s in starts["python -c pass"])
    for name, runs in starts.items():
        cpu = statistics.median(s.cpu_s for s in runs)
        print(
            f"{name:18} {median_ms([s.ready_s for s in runs])} {median_ms([s.stop_s for s in runs])} "
            f"{median_ms([s.cpu_ready_s for s in runs]):>13} {median_ms([s.cpu_s for s in runs]):>11} "
            f"{cpu / start_cpu:7.1f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    # Bytecode written first, as an installed evald has it: with PYTHONDONTWRITEBYTECODE set (some shells
    # do) every start would compile the modules from source again, and that is what would be timed.
    for package in ("daemon", "evald", "inference", "storage"):
        compileall.compile_dir(package, quiet=1)
    with tempfile.TemporaryDirectory(prefix="evald-daemon-start-") as tmp:
        starts = rounds(Path(tmp), args.rounds)
    print(f"{args.rounds} rounds, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print_table(starts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
