"""Tracker delivery: result stored -> visible in MLflow, and a backlog drained after an outage.

A real ``mlflow server`` on loopback (SQLite backend store, as tests/mlflowserver.py starts it), a real
SQLite evald database, results stored as the runner stores them (the alerter's ``after_result`` in the
result's transaction queues the tracker message), the tracker relay's thread sending them.

1. Latency: ``--results`` results stored one at a time; for each, the seconds from its commit until
   MLflow's client reads its value back at its step. Measured both ways in one process: the relay woken
   at the commit (what the daemon does), and the baseline, a relay that only polls the outbox.
2. First result after start: a fresh process (nothing of MLflow's loaded) starts the relay, stores one
   result ``--first-after`` seconds later (a first evaluation takes at least that: the model loads), and
   times it until the server's REST API answers it at its step (read with httpx, so the reading does not
   load MLflow for the relay). Both ways, each in ``--first-repeats`` fresh processes: the relay opening
   each sink as its thread starts (what the daemon does), and the baseline, opening it at the first
   message (as it did).
3. Backlog: the server unreachable (its port closed by a gate) while ``--backlog`` results are stored
   (spread over ``--runs`` evald runs evaluated side by side, each result to the next run in turn), then
   reachable again: seconds until all are delivered, and duplicates in MLflow (must be 0). Measured in
   one process for ``--baseline-backlog`` results both ways, the baseline one message per claim
   (``batch = 1``, as before batching) and batched (``batch = --batch``), then for ``--backlog`` batched.

    python -m bench.trackers [--results 20] [--backlog 10000] [--runs 10] [--baseline-backlog 500]
        [--first-repeats 3] [--first-after 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from daemon.alerts.lifecycle import Alerter
from daemon.config import Config, parse_config
from daemon.delivery.messages import ALERT_PREFIX
from daemon.delivery.relay import Relay
from daemon.delivery.trackers import tracker_routes
from storage import migrations, queries
from storage.database import Database
from storage.models import CheckpointState, OutboxMessage, OutboxState
from tests.mlflowserver import Gate, start_server, stop


def run_names(runs: int) -> list[str]:
    return ["bench"] if runs == 1 else [f"bench{i}" for i in range(runs)]


def config(folder: Path, url: str, uri: str, experiment: str, *, runs: int = 1, batch: int = 200) -> Config:
    (folder / "d.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    for name in run_names(runs):
        (folder / name).mkdir(exist_ok=True)
    tables = "".join(
        f'[[runs]]\nname = "{name}"\nroot = "{folder / name}"\ntasks = ["arith"]\n'
        for name in run_names(runs)
    )
    text = f"""
[database]
url = "{url}"
{tables}
[[tasks]]
name = "arith"
dataset = "{folder / "d.jsonl"}"
[[trackers]]
kind = "mlflow"
tracking_uri = "{uri}"
experiment = "{experiment}"
attach = "own"
samples = 0
max_backoff_secs = 1
timeout_secs = 10
batch = {batch}
"""
    return parse_config(tomllib.loads(text), base_dir=folder, source="bench")


class Store:
    def __init__(self, database: Database, cfg: Config) -> None:
        self.database = database
        self.alerter = Alerter(cfg)
        with database.session() as s:
            self.run_ids = [queries.ensure_run(s, run.name, str(run.root)) for run in cfg.runs]

    def result(self, step: int, run: int = 0) -> None:
        with self.database.session() as s:
            checkpoint_id = queries.record_checkpoint(
                s,
                run_id=self.run_ids[run],
                path=f"/bench/{run}/step_{step}",
                name=f"step_{step}",
                step=step,
                epoch=None,
                layout="hf",
                state=CheckpointState.READY,
            )
            queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=["arith"])
            job = queries.claim_next_job(s, "b:1")
            assert job is not None
            metrics = [queries.MetricRow("accuracy", (step % 97) / 97, 100, 0.05)]
            assert queries.complete_job(
                s, job_id=job.id, owner="b:1", metrics=metrics, samples=[], duration_s=1.0, load_s=0.1
            )
            self.alerter.after_result(s, job)
        self.alerter.after_commit()


def outbox_counts(database: Database) -> tuple[int, int, int]:
    """(results delivered, alert events delivered, messages still pending) in the tracker's outbox: the
    alerter's detectors fire on the bench's series, and their events go to the tracker too."""
    from sqlalchemy import func, select

    with database.session() as s:
        rows = s.execute(
            select(
                OutboxMessage.event_id.startswith(ALERT_PREFIX), OutboxMessage.state, func.count()
            ).group_by(OutboxMessage.event_id.startswith(ALERT_PREFIX), OutboxMessage.state)
        ).all()
    results = sum(int(n) for alert, state, n in rows if not alert and state is OutboxState.DELIVERED)
    alerts = sum(int(n) for alert, state, n in rows if alert and state is OutboxState.DELIVERED)
    pending = sum(int(n) for _, state, n in rows if state is OutboxState.PENDING)
    return results, alerts, pending


def visible(client: Any, run_id: str | None, experiment: str, step: int) -> tuple[str | None, bool]:
    if run_id is None:
        found = client.search_experiments(filter_string=f"name = '{experiment}'")
        if not found:
            return None, False
        runs = client.search_runs([found[0].experiment_id])
        if not runs:
            return None, False
        run_id = runs[0].info.run_id
    history = client.get_metric_history(run_id, "eval/arith/accuracy")
    return run_id, any(m.step == step for m in history)


def latency(folder: Path, uri: str, results: int, *, woken: bool) -> list[float]:
    from mlflow.tracking import MlflowClient

    experiment = f"latency-{'woken' if woken else 'polled'}-{int(time.time())}"
    database = Database(f"sqlite:///{folder / 'evald.db'}")
    migrations.upgrade(database)
    cfg = config(folder, database.url, uri, experiment)
    store = Store(database, cfg)
    relay = Relay(database, tracker_routes(cfg.trackers, {})).start()
    if woken:
        store.alerter._wake = relay.wake
    client = MlflowClient(uri)
    run_id: str | None = None
    seconds = []
    try:
        for i in range(results):
            step = (i + 1) * 10
            store.result(step)
            committed = time.perf_counter()
            while True:
                run_id, seen = visible(client, run_id, experiment, step)
                if seen:
                    break
                time.sleep(0.01)
            seconds.append(time.perf_counter() - committed)
    finally:
        relay.stop()
        database.dispose()
    return seconds


def first_result(folder: Path, uri: str, *, warm: bool, after_s: float) -> float:
    """In this process (a fresh one): seconds from the first result's commit until MLflow serves it."""
    import httpx

    experiment = f"first-{'warm' if warm else 'lazy'}-{time.time_ns()}"
    database = Database(f"sqlite:///{folder / 'evald.db'}")
    migrations.upgrade(database)
    cfg = config(folder, database.url, uri, experiment)
    store = Store(database, cfg)
    relay = Relay(database, tracker_routes(cfg.trackers, {}), warm=warm).start()
    store.alerter._wake = relay.wake
    api = f"{uri}/api/2.0/mlflow"
    try:
        time.sleep(after_s)
        store.result(10)
        committed = time.perf_counter()
        while True:
            found = httpx.get(f"{api}/experiments/get-by-name", params={"experiment_name": experiment})
            if found.status_code == 200:
                experiment_id = found.json()["experiment"]["experiment_id"]
                runs = httpx.post(f"{api}/runs/search", json={"experiment_ids": [experiment_id]}).json()
                for run in runs.get("runs", []):
                    history = httpx.get(
                        f"{api}/metrics/get-history",
                        params={"run_id": run["info"]["run_id"], "metric_key": "eval/arith/accuracy"},
                    ).json()
                    if any(int(m["step"]) == 10 for m in history.get("metrics", [])):
                        return time.perf_counter() - committed
            time.sleep(0.01)
    finally:
        relay.stop()
        database.dispose()


def first_results(root: Path, uri: str, *, warm: bool, repeats: int, after_s: float) -> list[float]:
    import subprocess
    import sys

    seconds = []
    for i in range(repeats):
        folder = root / f"first-{'warm' if warm else 'lazy'}-{i}"
        folder.mkdir()
        args = ["--first-child", str(folder), uri, "1" if warm else "0", str(after_s)]
        done = subprocess.run(
            [sys.executable, "-m", "bench.trackers", *args], capture_output=True, text=True, check=True
        )
        seconds.append(float(done.stdout.split()[-1]))
    return seconds


@dataclass(frozen=True)
class Drained:
    stored_s: float
    drained_s: float
    points: int
    duplicates: int
    missing: int
    #: Alert events (the detectors' findings on the bench's series) delivered beside the results.
    alerts: int


def backlog(folder: Path, server_port: int, n: int, *, runs: int, batch: int) -> Drained:
    from mlflow.tracking import MlflowClient

    folder.mkdir()
    gate = Gate(server_port)
    experiment = f"backlog-{batch}-{n}-{int(time.time())}"
    database = Database(f"sqlite:///{folder / 'evald.db'}")
    migrations.upgrade(database)
    cfg = config(folder, database.url, gate.uri, experiment, runs=runs, batch=batch)
    store = Store(database, cfg)
    gate.close()
    relay = Relay(database, tracker_routes(cfg.trackers, {})).start()
    store.alerter._wake = relay.wake
    started = time.perf_counter()
    for i in range(n):
        # Runs evaluated side by side: each result to the next run, its steps rising.
        store.result(i // runs + 1, run=i % runs)
    stored_s = time.perf_counter() - started
    gate.open()
    reopened = time.perf_counter()
    while (counts := outbox_counts(database))[0] < n or counts[2]:
        time.sleep(0.1)
    drained_s = time.perf_counter() - reopened
    relay.stop()
    gate.close()
    client = MlflowClient(f"http://127.0.0.1:{server_port}")
    found = client.search_experiments(filter_string=f"name = '{experiment}'")
    points = duplicates = missing = 0
    mlflow_runs = client.search_runs([found[0].experiment_id], max_results=1000)
    for run in mlflow_runs:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "eval/arith/accuracy")]
        points += len(steps)
        duplicates += len(steps) - len(set(steps))
    missing = n - (points - duplicates)
    database.dispose()
    return Drained(stored_s, drained_s, points, duplicates, missing, counts[1])


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=int, default=20, help="results timed stored -> visible")
    parser.add_argument("--backlog", type=int, default=10000, help="results stored during the outage")
    parser.add_argument("--runs", type=int, default=10, help="evald runs the backlog is spread over")
    parser.add_argument("--batch", type=int, default=200, help="the tracker's batch (messages per claim)")
    parser.add_argument(
        "--baseline-backlog",
        type=int,
        default=500,
        help="a smaller backlog drained both ways, one message per claim and batched (0: skip)",
    )
    parser.add_argument("--first-repeats", type=int, default=3, help="fresh processes per way (0: skip)")
    parser.add_argument("--first-after", type=float, default=10.0, help="seconds from start to the result")
    parser.add_argument("--first-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    if args.first_child:
        folder, uri, warm, after = args.first_child
        print(first_result(Path(folder), uri, warm=warm == "1", after_s=float(after)))
        return 0
    with tempfile.TemporaryDirectory(prefix="evald-bench-trackers-") as tmp:
        root = Path(tmp)
        server = start_server(root / "server")
        try:
            for name in ("a", "b"):
                (root / name).mkdir()
            woken = latency(root / "a", server.uri, args.results, woken=True)
            polled = latency(root / "b", server.uri, args.results, woken=False)
            print(
                f"stored -> visible in MLflow over {args.results} results: woken p50 "
                f"{statistics.median(woken):.3f} s, p95 {p95(woken):.3f} s; polled (baseline) p50 "
                f"{statistics.median(polled):.3f} s, p95 {p95(polled):.3f} s; p95 ratio "
                f"{p95(polled) / p95(woken):.1f}x"
            )
            if args.first_repeats:
                kw = {"repeats": args.first_repeats, "after_s": args.first_after}
                lazy = first_results(root, server.uri, warm=False, **kw)
                warm = first_results(root, server.uri, warm=True, **kw)
                print(
                    f"first result after start ({args.first_after:g} s after, {args.first_repeats} fresh "
                    f"processes each): sink opened at the first message (baseline) median "
                    f"{statistics.median(lazy):.3f} s (max {max(lazy):.3f}); opened as the relay starts "
                    f"median {statistics.median(warm):.3f} s (max {max(warm):.3f}); "
                    f"{statistics.median(lazy) / statistics.median(warm):.1f}x"
                )
            if args.baseline_backlog:
                n = args.baseline_backlog
                one = backlog(root / "one", server.port, n, runs=args.runs, batch=1)
                many = backlog(root / "many", server.port, n, runs=args.runs, batch=args.batch)
                print(
                    f"backlog of {n} results over {args.runs} runs: one message per claim (baseline) "
                    f"drained in {one.drained_s:.1f} s ({n / one.drained_s:.0f}/s), batch = {args.batch} "
                    f"in {many.drained_s:.1f} s ({n / many.drained_s:.0f}/s): "
                    f"{one.drained_s / many.drained_s:.1f}x; duplicates {one.duplicates} and "
                    f"{many.duplicates}, missing {one.missing} and {many.missing}"
                )
            n = args.backlog
            if not n:
                return 0
            big = backlog(root / "big", server.port, n, runs=args.runs, batch=args.batch)
            print(
                f"backlog of {n} results over {args.runs} runs stored during an outage "
                f"({big.stored_s:.1f} s to store): drained in {big.drained_s:.1f} s after the server "
                f"came back ({n / big.drained_s:.0f}/s, batch = {args.batch}); {big.points} points in "
                f"MLflow, {big.duplicates} duplicates, {big.missing} missing; {big.alerts} alert events "
                "delivered beside them"
            )
        finally:
            stop(server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
