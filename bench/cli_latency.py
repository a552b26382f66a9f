"""CLI latency: how long ``evald --help``, ``evald results --run toy`` and ``evald status`` take, end to end.

Each command is a new ``python -m daemon`` process (what the ``evald`` script runs), timed from start to
exit with its output read, on a SQLite database made by evald's own commands and queries: ``evald db
upgrade``, then ``--checkpoints`` checkpoints of one run, each with one succeeded ``arith`` job of two
metrics (112 result rows by default, as the issue measured). Two baselines are run in the same rounds,
interleaved with the commands so the machine's load falls on all alike:

- ``python -c pass``: the interpreter's own start, below which no command can go;
- ``sqlite3 read``: a Python process that reads the same rows ``evald results --run toy`` prints (the same
  join, order and columns) with the standard library's ``sqlite3`` and prints them.

Prints the median and the fastest wall time of ``--rounds`` runs of each, the median's ratio to both
baselines, and the median CPU time (user and system) of the process, which the machine's other load
changes less than the wall time. evald's bytecode is written first (as an installed evald has it).
``--instructions`` adds the instructions each process executes, counted once under valgrind's cachegrind:
a figure the machine's load does not change at all (the wall time of a quiet machine follows it), for
comparing two trees on a shared, busy host.

    python -m bench.cli_latency [--rounds 15] [--checkpoints 56] [--instructions]
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.toy_config import toy_config
from inference.toy import problems
from storage import queries
from storage.database import Database
from storage.models import CheckpointState

#: The rows ``evald results --run toy`` prints (storage.queries.result_rows), in its order.
RESULTS_SQL = """
SELECT runs.name, checkpoints.name, checkpoints.step, checkpoints.epoch, eval_jobs.task, eval_jobs.stage,
       results.metric, results.value, results.n, results.stderr, eval_jobs.finished_at
FROM results JOIN eval_jobs ON results.job_id = eval_jobs.id
JOIN checkpoints ON eval_jobs.checkpoint_id = checkpoints.id JOIN runs ON checkpoints.run_id = runs.id
WHERE runs.name = 'toy'
ORDER BY runs.name, checkpoints.step, checkpoints.name, eval_jobs.task, eval_jobs.stage, results.metric,
         results.id
"""


def workspace(folder: Path, checkpoints: int) -> tuple[Path, Path]:
    """The config and its database, the database brought to the schema by ``evald db upgrade``."""
    root, db = folder / "run", folder / "evald.db"
    root.mkdir()
    dataset = folder / "arith.jsonl"
    assert problems.main(["--out", str(dataset), "--n", "5", "--seed", "3"]) == 0
    config = folder / "evald.toml"
    config.write_text(toy_config(db, root, dataset, folder / "state"))
    timed(evald(config, "db", "upgrade"))
    database = Database(f"sqlite:///{db}")
    try:
        with database.session() as s:
            run_id = queries.ensure_run(s, "toy", str(root))
            for i in range(1, checkpoints + 1):
                step = i * 10
                checkpoint_id = queries.record_checkpoint(
                    s,
                    run_id=run_id,
                    path=str(root / f"step_{step}"),
                    name=f"step_{step}",
                    step=step,
                    epoch=None,
                    layout="hf",
                    state=CheckpointState.READY,
                )
                queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=["arith"])
                job = queries.claim_next_job(s, "bench:1")
                assert job is not None
                queries.complete_job(
                    s,
                    job_id=job.id,
                    owner="bench:1",
                    duration_s=1.0,
                    load_s=0.1,
                    metrics=[
                        queries.MetricRow("accuracy", min(1.0, 0.2 + i / (2 * checkpoints)), 5, 0.18),
                        queries.MetricRow("wall_s", 1.0, None, None),
                    ],
                    samples=[],
                )
    finally:
        database.dispose()
    return config, db


def evald(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "daemon", "--config", str(config), *args]


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(command: list[str]) -> tuple[float, float, str]:
    """Wall seconds from start to exit, the process's CPU seconds (user and system: what the machine's
    other load changes least), and what it printed."""
    cpu, began = _cpu(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    elapsed, used = time.perf_counter() - began, _cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip()[-2000:]}")
    return elapsed, used, done.stdout


def instructions(command: list[str]) -> int:
    """The instructions ``command``'s process executes (valgrind's cachegrind, no cache simulation)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    done = subprocess.run(
        [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", *command],
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{' '.join(command)} under valgrind: exit {done.returncode}: {done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--checkpoints", type=int, default=56, help="two result rows each")
    parser.add_argument(
        "--instructions", action="store_true", help="also count each command's instructions (valgrind)"
    )
    args = parser.parse_args(argv)
    # Bytecode written first, as an installed evald has it: with PYTHONDONTWRITEBYTECODE set (some shells
    # do) every start would compile the modules from source again, and that is what would be timed.
    for package in ("daemon", "inference", "storage"):
        compileall.compile_dir(package, quiet=1)
    with tempfile.TemporaryDirectory(prefix="evald-cli-bench-") as tmp:
        config, db = workspace(Path(tmp), args.checkpoints)
        baseline_read = (
            f"import sqlite3\nfor row in sqlite3.connect({str(db)!r}).execute({RESULTS_SQL!r}): print(row)"
        )
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "sqlite3 read": [sys.executable, "-c", baseline_read],
            "evald --help": [sys.executable, "-m", "daemon", "--help"],
            "evald results --run toy": evald(config, "results", "--run", "toy"),
            "evald status": evald(config, "status"),
        }
        rows = timed(cases["sqlite3 read"])[2].count("\n")
        printed = timed(cases["evald results --run toy"])[2].count("\n") - 2  # its header and rule
        if rows != printed or rows != 2 * args.checkpoints:
            raise SystemExit(f"the baseline read {rows} rows, evald results printed {printed}")
        times: dict[str, list[float]] = {name: [] for name in cases}
        cpus: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, command in cases.items():
                elapsed, used, _ = timed(command)
                times[name].append(elapsed)
                cpus[name].append(used)
        counted = {name: instructions(c) for name, c in cases.items()} if args.instructions else {}
    print(f"{rows} result rows, {args.rounds} rounds, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print_table(times, cpus, counted)
    return 0


def print_table(times: dict[str, list[float]], cpus: dict[str, list[float]], counted: dict[str, int]) -> None:
    """Per command: wall median and fastest, the median against both baselines, CPU median, and where
    counted the instructions against the interpreter's start."""
    start, read = statistics.median(times["python -c pass"]), statistics.median(times["sqlite3 read"])
    header = f"{'':24} {'wall median':>11} {'fastest':>8} {'/ start':>8} {'/ read':>7} {'CPU median':>11}"
    print(header + (f" {'instructions':>13} {'/ start':>8}" if counted else ""))
    for name, seconds in times.items():
        median = statistics.median(seconds)
        line = (
            f"{name:24} {median * 1000:9.0f}ms {min(seconds) * 1000:6.0f}ms {median / start:7.1f}x "
            f"{median / read:6.1f}x {statistics.median(cpus[name]) * 1000:9.0f}ms"
        )
        if counted:
            line += f" {counted[name] / 1e6:12.0f}M {counted[name] / counted['python -c pass']:7.1f}x"
        print(line)


if __name__ == "__main__":
    sys.exit(main())
