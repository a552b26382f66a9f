"""The test suite's workers: a fresh interpreter against one forked from the session's server.

The same toy job (``python -m inference.worker SPEC``, the default engine, 20 problems) run alternately
as a new process (``sys.executable``: torch, transformers, DeepSpeed and math-verify imported each time)
and through the test session's shim (tests/forkserver.py: a child forked from a process that imported
them once). Wall time from spawn to exit and CPU time: the fresh worker's from this process's reaped
children, the forked one's from the client's and the server's reaped children. Medians of ``--repeats``.

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
from collections.abc import Sequence
from pathlib import Path

import psutil

from bench.worker_start import report, toy_job
from inference.spec import JobResult
from tests import forkserver


def _children_cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.children_user + times.children_system


def timed(python: str, spec_path: Path, server: psutil.Process, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one worker run; it must succeed with a result."""
    result_path = spec_path.parent / "result.json"
    result_path.unlink(missing_ok=True)
    before, served = resource.getrusage(resource.RUSAGE_CHILDREN), _children_cpu(server)
    started = time.perf_counter()
    done = subprocess.run([python, "-m", "inference.worker", str(spec_path)], capture_output=True, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or JobResult.read(result_path).error is not None:
        raise SystemExit(f"the job failed ({done.returncode}): {done.stderr[-2000:]!r}")
    own = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, own + _children_cpu(server) - served


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="evald-bench-") as tmp:
        folder = Path(tmp)
        spec_path = toy_job(folder)
        session = forkserver.start_session(folder / "forks")
        if session is None:
            raise SystemExit(f"the fork server is off ({forkserver.SWITCH_ENV}=0)")
        server = psutil.Process(session.process.pid)
        env = forkserver.worker_like_environment(dict(os.environ))
        try:
            # The server's imports, at its first request, are the session's once: not in the figures.
            timed(str(session.shim), spec_path, server, env)
            runs: dict[str, list[tuple[float, float]]] = {"fresh interpreter": [], "forked": []}
            for _ in range(args.repeats):
                runs["fresh interpreter"].append(timed(sys.executable, spec_path, server, env))
                runs["forked"].append(timed(str(session.shim), spec_path, server, env))
        finally:
            session.close()

    (fresh_wall, fresh_cpu), (forked_wall, forked_cpu) = report(runs, args.repeats).values()
    print(f"ratio fresh / forked: wall {fresh_wall / forked_wall:.1f}, CPU {fresh_cpu / forked_cpu:.1f}")


if __name__ == "__main__":
    main()
