"""Two daemons on one PostgreSQL database, which goes away for longer than the lease while jobs run.

Both daemons (each under its own supervisor, with its own state folder) watch the same run on a private
server (``tests.pgcluster``), ``lease_secs = 5`` and a heartbeat every second. Each round writes two
checkpoints, waits until a job is running and its worker has started, then stops the server (``fast``
or ``immediate``) for 2–3 leases (10–15 s) and starts it again: when it comes back, every heartbeat is
older than the lease although its holder is alive (the issue saw the double run after outages of 1.5
and 1.9 leases: 45 s and 56 s against 30 s). No daemon may take over a job whose holder is alive: every
job must end with one ``succeeded`` attempt in ``job_attempts`` (``duplicated`` counts a second one) and
no finished result thrown away (``discarded``: ``job.lost_lease`` lines of either daemon); every
checkpoint is evaluated once, and neither daemon may exit (``crashes``).
"""

from __future__ import annotations

import functools
import random
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import func, select

from reliability import checkpoints
from reliability.figures import Expected, Figures, recomputed
from reliability.scenarios.base import Options
from reliability.supervisor import Supervisor
from reliability.workspace import TASK, RunSpec, Workspace, wait_for, workspace, write_dataset
from storage.models import EvalJob, JobAttempt, JobState
from tests.pgcluster import start_cluster

LEASE_SECS = 5.0


def running_jobs(ws: Workspace) -> int | None:
    """Jobs running with a heartbeat (their worker started); None while none is or the database is away."""
    database = ws.database()
    try:
        with database.session() as session:
            count = session.scalar(
                select(func.count())
                .select_from(EvalJob)
                .where(EvalJob.state == JobState.RUNNING, EvalJob.heartbeat_at.is_not(None))
            )
    except Exception:
        return None
    finally:
        database.dispose()
    return count or None


def lost_lease_lines(folder: Path) -> int:
    return sum(
        path.read_text(encoding="utf-8", errors="replace").count('"job.lost_lease"')
        for path in folder.rglob("daemon-*.log")
    )


def run(options: Options) -> Figures:
    rounds = options.pick(short=2, full=4)
    figures = Figures("two daemons, PostgreSQL away longer than the lease")
    rng = random.Random(options.seed)
    cluster = start_cluster()
    try:
        url = cluster.create_database("evald_lease")
        with workspace("lease", options.workdir, url=url) as ws:
            root = ws.folder / "runs" / "toy"
            root.mkdir(parents=True)
            dataset = write_dataset(ws.folder / "arith.jsonl", 16)
            # The second daemon's config: the same run and database, its own state folder.
            state_b = ws.folder / "state-b"
            config_b = ws.write_config([RunSpec("toy", root)], dataset=dataset, state_dir=state_b)
            config_b = config_b.rename(ws.folder / "evald-b.toml")
            ws.write_config([RunSpec("toy", root)], dataset=dataset)
            ws.upgrade()
            checkpoints.toy_checkpoint()
            ws.start_daemon()
            second = Supervisor(config_b, ws.logs / "b", ws.daemon_env()).start()
            second.wait_ready()
            step = 0
            met_running = 0
            downs = []
            try:
                for _ in range(rounds):
                    for _ in range(2):
                        step += 1
                        checkpoints.write(root, step)
                    wait_for(lambda: running_jobs(ws), 300, "a running job")
                    time.sleep(rng.uniform(0.5, 2.0))
                    met_running += running_jobs(ws) is not None
                    mode = rng.choice(("fast", "immediate"))
                    down = rng.uniform(2.0, 3.0) * LEASE_SECS
                    ws.fault(f"PostgreSQL down 2-3 leases ({mode})", "db.unavailable")
                    downs.append(cluster.restart(down_secs=down, mode=mode))
                    wait_for(functools.partial(ws.jobs_settled, step), 600, f"the jobs of round {len(downs)}")
            except TimeoutError as exc:
                figures.notes.append(str(exc))
            finally:
                second.stop()
            figures.written = step
            expected = Expected(due=frozenset(f"toy/step_{s}" for s in range(1, step + 1)), tasks=(TASK,))
            ws.finish(figures, expected)
            figures.daemon_starts += second.starts
            figures.daemon_crashes += len(second.unplanned_exits)
            figures.discarded = lost_lease_lines(ws.logs)
            database = ws.database()
            try:
                with database.session() as session:
                    job_ids = session.scalars(select(EvalJob.id)).all()
                    succeeded = Counter(
                        session.scalars(
                            select(JobAttempt.job_id).where(JobAttempt.outcome == "succeeded")
                        ).all()
                    )
            finally:
                database.dispose()
            figures.recomputed += recomputed(state_b, job_ids)
            twice = {job: n for job, n in succeeded.items() if n > 1}
            shown = ", ".join(f"{d:.1f}" for d in downs)
            figures.notes.append(
                f"{len(downs)} outage(s) of {shown} s (lease {LEASE_SECS:g} s), {met_running} with a job "
                f"running as the server stopped; jobs with more than one succeeded attempt: "
                f"{twice or 'none'}; "
                f"job.lost_lease lines: {figures.discarded}"
            )
            return figures
    finally:
        cluster.destroy()
