"""The interpreter the venv is made from: the same pure-Python work timed under each candidate.

`make` builds the venv from the distribution's ``python3.11`` where it can (Makefile: ``PYTHON``): Debian
builds it with profile-guided and link-time optimisation, pyenv's default build with neither. The work is
what the test suite's own processes and evald's daemon spend their Python time on, with the standard
library only (so that any interpreter runs it bare, ``-I -S``): JSON log lines written and parsed, a
SQLite database written and queried, regular expressions over checkpoint names, dataclasses built and
compared, paths joined. Each interpreter runs it ``--repeats`` times, alternating; the figure is its
process's CPU time (user + system), and the ratio is against the first interpreter named.

    python -m bench.interpreter [--repeats 5] [INTERPRETER ...]

With no interpreter named: pyenv's ``python3.11`` (``pyenv which``, where pyenv is there) and
``/usr/bin/python3.11``.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

WORK = r"""
import dataclasses, json, re, sqlite3
from pathlib import PurePosixPath

@dataclasses.dataclass(frozen=True)
class Point:
    run: str
    step: int
    task: str
    value: float

names = re.compile(r"(?:global_step|checkpoint-|step_|step-)(\d+)$")
db = sqlite3.connect(":memory:")
db.execute("create table results (run text, step integer, task text, value real)")
points = []
for round in range(6):
    lines = []
    for step in range(4000):
        point = Point("r", step, f"task{step % 7}", step / 4000)
        points.append(point)
        lines.append(json.dumps({"event": "job.succeeded", **dataclasses.asdict(point)}))
        path = PurePosixPath("/runs/r") / f"global_step{step}" / "mp_rank_00_model_states.pt"
        names.search(path.parent.name)
    parsed = [json.loads(line) for line in lines]
    db.executemany("insert into results values (?, ?, ?, ?)", [tuple(p.values())[1:] for p in parsed])
    db.execute("select task, avg(value) from results group by task").fetchall()
    len(set(points))
"""


def _cpu_of(interpreter: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([interpreter, "-I", "-S", "-c", WORK], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _defaults() -> list[str]:
    found = []
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        done = subprocess.run([pyenv, "which", "python3.11"], capture_output=True, text=True)
        if done.returncode == 0:
            found.append(done.stdout.strip())
    if Path("/usr/bin/python3.11").is_file():
        found.append("/usr/bin/python3.11")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("interpreters", nargs="*")
    args = parser.parse_args()
    interpreters = args.interpreters or _defaults()
    if len(interpreters) < 2:
        if args.interpreters:
            sys.exit(f"name two interpreters to compare, not {interpreters}")
        print(f"interpreters found: {interpreters}: nothing to compare here (name two)")
        return
    times: dict[str, list[float]] = {name: [] for name in interpreters}
    for _ in range(args.repeats):
        for name in interpreters:
            times[name].append(_cpu_of(name))
    baseline = statistics.median(times[interpreters[0]])
    for name in interpreters:
        version = subprocess.run(
            [name, "-I", "-S", "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        median = statistics.median(times[name])
        print(f"{name} ({version}): {median:.2f} CPU-s (median of {args.repeats})")
        print(f"{name}: ratio {interpreters[0]} / this: {baseline / median:.2f}")


if __name__ == "__main__":
    main()
