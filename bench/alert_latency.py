"""Alert latency: from the commit of the result that raised an alert to its receipt at a loopback receiver.

A real SQLite database, the alert lifecycle run in the result's transaction, the relay in its thread, and a
real HTTP receiver on loopback that verifies every Standard Webhooks signature. Results alternate a cliff and
a recovery after a plateau, so each stored result raises (or resolves) alerts. Measured both ways in one
process: the relay woken at the commit (what the daemon does), and the baseline, a relay that only polls the
outbox every second. Target: p95 < 1 s.

    python -m bench.alert_latency [--alerts 40]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path

import structlog

from daemon.alerts.lifecycle import Alerter
from daemon.config import Config, Secret, parse_config
from daemon.delivery.receiver import WebhookReceiver
from daemon.delivery.relay import Relay
from daemon.delivery.sinks.webhook import Endpoint
from storage import migrations, queries
from storage.database import Database
from storage.models import CheckpointState

PLATEAU = [0.30, 0.45, 0.55, 0.60, 0.61, 0.60, 0.62, 0.61, 0.60, 0.61]


def config(folder: Path, url: str) -> Config:
    (folder / "d.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    text = f"""
[[runs]]
name = "bench"
root = "{folder / "run"}"
[[tasks]]
name = "math"
dataset = "d.jsonl"
[alerts]
cooldown_secs = 0
[[webhooks]]
name = "receiver"
url = "{url}"
"""
    return parse_config(tomllib.loads(text), base_dir=folder, source="bench", environ={})


def store(db: Database, alerter: Alerter, step: int, accuracy: float) -> float:
    """Store one result and its alerts; returns the monotonic time of the commit."""
    with db.session() as s:
        run_id = queries.ensure_run(s, "bench", "/runs/bench")
        checkpoint = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=f"/runs/bench/step_{step}",
            name=f"step_{step}",
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=step, tasks=("math",))
    with db.session() as s:
        job = queries.claim_next_job(s, "bench:1")
        assert job is not None
    stderr = math.sqrt(accuracy * (1 - accuracy) / 500)
    with db.session() as s:
        queries.complete_job(
            s,
            job_id=job.id,
            owner="bench:1",
            metrics=[queries.MetricRow("accuracy", accuracy, 500, stderr)],
            samples=[],
            duration_s=1.0,
            load_s=None,
        )
        alerter.after_result(s, job)
    committed = time.monotonic()
    alerter.after_commit()
    return committed


def measure(alerts: int, *, wake: bool) -> list[float]:
    secret = Secret.generate()
    with tempfile.TemporaryDirectory(prefix="evald-bench-") as tmp, WebhookReceiver(secret) as receiver:
        folder = Path(tmp)
        db = Database(f"sqlite:///{folder / 'evald.db'}")
        migrations.upgrade(db)
        settings = config(folder, receiver.url)
        relay = Relay(db, [Endpoint(settings.webhooks[0], secret)]).start()
        alerter = Alerter(settings, wake=relay.wake if wake else lambda: None)
        latencies: list[float] = []
        try:
            for i, value in enumerate(PLATEAU):
                store(db, alerter, (i + 1) * 100, value)
            step = 1100
            while len(latencies) < alerts:
                for value in (0.30, 0.61, 0.61):
                    seen = len(receiver.deliveries)
                    committed = store(db, alerter, step, value)
                    step += 100
                    queued = _queued(db)
                    if queued > seen:
                        delivered = receiver.wait_for(queued, timeout=30)
                        latencies.extend(a.received_at - committed for a in delivered[seen:queued])
                    # Spaced out as checkpoints are: each result's alerts are measured on their own.
                    time.sleep(0.05)
            assert all(a.error is None for a in receiver.attempts), "a signature failed to verify"
        finally:
            relay.stop()
            db.dispose()
    return latencies[:alerts]


def _queued(db: Database) -> int:
    from sqlalchemy import func, select

    from storage.models import OutboxMessage

    with db.session() as s:
        return int(s.scalar(select(func.count()).select_from(OutboxMessage)) or 0)


def quantiles(values: Sequence[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=20, method="inclusive")
    return statistics.median(values), cuts[18]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=40, help="alert notifications to time, each way")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    woken = measure(args.alerts, wake=True)
    polled = measure(args.alerts, wake=False)
    for name, values in (("relay woken at commit", woken), ("relay polling every 1 s", polled)):
        p50, p95 = quantiles(values)
        ms = [p50 * 1000, p95 * 1000, max(values) * 1000]
        print(f"{name:26s} n={len(values):3d}  p50 {ms[0]:7.1f} ms  p95 {ms[1]:7.1f} ms  max {ms[2]:7.1f} ms")
    ratio = quantiles(polled)[1] / quantiles(woken)[1]
    print(f"p95, polling / woken: {ratio:.1f}x   (target: woken p95 < 1 s)")


if __name__ == "__main__":
    main()
