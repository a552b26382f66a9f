"""The test suite's workers and evald commands: a fresh interpreter against one forked from the session's
servers.

The same toy job (``python -m inference.worker SPEC``, the default engine, 20 problems) run alternately
as a new process (``sys.executable``: torch, transformers, DeepSpeed and math-verify imported each time)
and through the test session's shim (tests/forkserver.py: a child forked from a process that imported
them once); then ``evald status`` on the toy run's SQLite database the same two ways (the CLI server:
SQLAlchemy, pydantic and the config imported once). Wall time from spawn to exit and CPU time: the fresh
process's from this process's reaped children, the forked one's from the client's and the server's reaped
children. Medians of ``--repeats``.

    python -m bench.forked_worker [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from bench.toy_config import toy_config
from bench.worker_start import report, toy_job
from inference.spec import JobResult
from storage.database import Database
from storage.migrations import upgrade
from tests import forkserver


def _children_cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.children_user + times.children_system


def timed(
    command: list[str], server: psutil.Process, env: dict[str, str], check: Callable[[], None]
) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``command``; it must exit 0 and pass ``check``."""
    before, served = resource.getrusage(resource.RUSAGE_CHILDREN), _children_cpu(server)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{command[1:]} failed ({done.returncode}): {done.stderr[-2000:]!r}")
    check()
    own = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, own + _children_cpu(server) - served


def compare(
    name: str,
    command: list[str],
    shim: Path,
    server: psutil.Process,
    env: dict[str, str],
    repeats: int,
    check: Callable[[], None],
) -> None:
    """``command`` fresh and through ``shim``, alternately; the medians and their ratio printed."""
    # The server's imports, at its first request, are the session's once: not in the figures.
    timed([str(shim), *command], server, env, check)
    runs: dict[str, list[tuple[float, float]]] = {f"{name}, fresh interpreter": [], f"{name}, forked": []}
    for _ in range(repeats):
        runs[f"{name}, fresh interpreter"].append(timed([sys.executable, *command], server, env, check))
        runs[f"{name}, forked"].append(timed([str(shim), *command], server, env, check))
    (fresh_wall, fresh_cpu), (forked_wall, forked_cpu) = report(runs, repeats).values()
    print(
        f"{name}: ratio fresh / forked: wall {fresh_wall / forked_wall:.1f}, CPU {fresh_cpu / forked_cpu:.1f}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="evald-bench-") as tmp:
        folder = Path(tmp)
        spec_path = toy_job(folder)
        result_path = spec_path.parent / "result.json"
        config = folder / "evald.toml"
        config.write_text(
            toy_config(folder / "evald.db", folder / "run", folder / "problems.jsonl", folder / "state"),
            encoding="utf-8",
        )
        upgrade(Database(f"sqlite:///{folder / 'evald.db'}"))
        session = forkserver.start_session(folder / "forks")
        if session is None:
            raise SystemExit(f"the fork server is off ({forkserver.SWITCH_ENV}=0)")

        def job_ok() -> None:
            if JobResult.read(result_path).error is not None:
                raise SystemExit(f"the job failed: {JobResult.read(result_path).error}")
            result_path.unlink()

        try:
            workers = psutil.Process(session.workers.process.pid)
            env = forkserver.worker_like_environment(dict(os.environ))
            worker = ["-m", "inference.worker", str(spec_path)]
            compare("toy worker", worker, session.shim, workers, env, args.repeats, job_ok)
            cli = psutil.Process(session.cli.process.pid)
            status = ["-m", "daemon", "--config", str(config), "status"]
            compare(
                "evald status", status, session.cli.shim, cli, dict(os.environ), args.repeats, lambda: None
            )
        finally:
            session.close()


if __name__ == "__main__":
    main()
