"""PostgreSQL restarted under the daemon while checkpoints arrive and are evaluated.

A private server (``tests.pgcluster``: its own data folder and port; the shared server at 5432 is never
touched) holds the database, reached with a password in ``EVALD_DATABASE_URL`` (the server trusts
loopback, so any password works: it is there to be grepped for). Checkpoints are copied in one after
another; at random moments the server is stopped (``fast`` or ``immediate``, i.e. a crash), kept down
0.2–3 s and started again. The daemon must stay up through every restart (no supervisor restart
allowed: ``crashes`` fails it), log each outage, and store every result and alert once.
"""

from __future__ import annotations

import random
import secrets
import threading
import time

from reliability import checkpoints
from reliability.figures import Expected, Figures
from reliability.scenarios.base import Options
from reliability.workspace import TASK, RunSpec, wait_for, workspace, write_dataset
from tests.pgcluster import start_cluster


def run(options: Options) -> Figures:
    restarts = options.pick(short=2, full=6)
    count = options.pick(short=3, full=8)
    figures = Figures("PostgreSQL restarts")
    rng = random.Random(options.seed)
    cluster = start_cluster()
    try:
        password = "pw-" + secrets.token_hex(12)
        url = cluster.create_database("evald_reliability")
        with_password = url.replace("postgres@", f"postgres:{password}@")
        with workspace(
            "postgres", options.workdir, url=url, extra_env={"EVALD_DATABASE_URL": with_password}
        ) as ws:
            ws.secrets.append(password)
            root = ws.folder / "runs" / "toy"
            root.mkdir(parents=True)
            ws.write_config([RunSpec("toy", root)], dataset=write_dataset(ws.folder / "arith.jsonl", 4))
            ws.upgrade()
            checkpoints.toy_checkpoint()
            ws.start_daemon()
            stop = threading.Event()

            def writer() -> None:
                for step in range(1, count + 1):
                    checkpoints.write(root, step)
                    if stop.wait(rng.uniform(4.0, 10.0)):
                        return

            thread = threading.Thread(target=writer)
            thread.start()
            try:
                for _ in range(restarts):
                    time.sleep(rng.uniform(2.0, 12.0))
                    mode = rng.choice(("fast", "immediate"))
                    ws.fault(f"PostgreSQL restart ({mode})", "db.unavailable", words=("db.unavailable",))
                    cluster.restart(down_secs=rng.uniform(0.2, 3.0), mode=mode)
                thread.join()
                wait_for(lambda: ws.jobs_settled(count), options.pick(short=400, full=900), "every job")
            except TimeoutError as exc:
                figures.notes.append(str(exc))
            finally:
                stop.set()
                thread.join()
            figures.written = count
            expected = Expected(due=frozenset(f"toy/step_{s}" for s in range(1, count + 1)), tasks=(TASK,))
            return ws.finish(figures, expected)
    finally:
        cluster.destroy()
