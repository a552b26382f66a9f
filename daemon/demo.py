"""``evald demo``: the whole job on one laptop, with real processes.

A tiny model is trained on the CPU by a separate trainer process that writes ``save_pretrained``
checkpoints the way real trainers do; ``evald run`` watches the run folder in its own process, evaluates
each checkpoint in a worker process and stores the results in SQLite. The demo only starts the two
processes, follows the database, and stops the daemon with SIGTERM when every checkpoint is evaluated.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from sqlalchemy import func, select

from daemon.analysis import report
from daemon.config import ENDPOINT_PREFIX, Secret, load_config
from daemon.delivery.receiver import WebhookReceiver
from daemon.errors import EvaldError
from inference.toy.problems import DATA_DIR
from storage import migrations, queries
from storage.database import Database
from storage.models import JobState, OutboxMessage, OutboxState

if TYPE_CHECKING:
    from daemon.web.server import BackgroundServer

#: The demo gives up (and says so) after this long; it normally takes one to two minutes on 2 cores.
DEMO_TIMEOUT_SECS = 600.0
EVAL_PROBLEMS = 100

CONFIG_TEMPLATE = """\
# Written by `evald demo`. Run the daemon on it yourself with:
#   evald --config {config} run
[database]
url = "sqlite:///{db}"

[[runs]]
name = "toy"
root = "{run_dir}"
layout = "auto"

# The shipped MATH500-format arithmetic set; the same 100 problems, stratified by level, at every step.
[[tasks]]
name = "arith"
dataset = "{dataset}"
prompt_field = "problem"
answer_field = "answer"
id_field = "unique_id"
prompt_template = "{{prompt}}="
max_new_tokens = 12
batch_size = 50
metrics = {metrics}

[tasks.subset]
size = {problems}
seed = 0
stratify_field = "level"

[inference]
engine = "hf"
device = "cpu"
threads = 1

[scheduling]
quiet_secs = 1.0
rescan_secs = 5.0
tick_secs = 0.1

[daemon]
state_dir = "{state}"

# The toy trainer's learning rate jumps after step {collapse_at}: the alerts go to a receiver the demo runs.
[alerts]
feedback_dir = "{feedback}"

[[webhooks]]
name = "demo-receiver"
url = "{receiver}"
secret_env = "{secret_env}"
"""

#: The trainer learns for this many steps, then its learning rate jumps (a run gone wrong).
COLLAPSE_AT = 720
TRAIN_STEPS = 960
SECRET_ENV = "EVALD_DEMO_WEBHOOK_SECRET"
#: After the last evaluation, how long the demo waits for its alerts to reach the receiver.
DELIVERY_WAIT_SECS = 15.0

#: What the demo's task computes: quality, RL and efficiency metrics of the registry.
DEMO_METRICS = (
    "accuracy",
    "exact_match",
    "reward",
    "entropy",
    "response_length",
    "response_length_correct",
    "response_length_incorrect",
    "truncation_rate",
    "tokens_per_s",
    "latency_p50_s",
    "latency_p95_s",
    "peak_memory_mb",
    "load_s",
    "wall_s",
)
TABLE_METRICS = ("accuracy", "entropy", "response_length", "truncation_rate", "tokens_per_s", "wall_s")


def _say(message: str, stream: TextIO) -> None:
    print(message, file=stream, flush=True)


def write_workspace(workdir: Path, receiver_url: str = "http://127.0.0.1:9/hook") -> Path:
    """Create the run folder and the config (the eval set is shipped); returns the config path."""
    (workdir / "run").mkdir(parents=True, exist_ok=True)
    dataset = DATA_DIR / "arith500.jsonl"
    config = workdir / "evald.toml"
    config.write_text(
        CONFIG_TEMPLATE.format(
            config=config,
            db=workdir / "evald.db",
            run_dir=workdir / "run",
            dataset=dataset,
            problems=EVAL_PROBLEMS,
            metrics=json.dumps(list(DEMO_METRICS)),
            state=workdir / "state",
            collapse_at=COLLAPSE_AT,
            feedback=workdir / "feedback",
            receiver=receiver_url,
            secret_env=SECRET_ENV,
        ),
        encoding="utf-8",
    )
    # [[trackers]] tables a user left in the workspace (trackers.toml): the demo's results go there too.
    extra = workdir / "trackers.toml"
    if extra.is_file():
        with config.open("a", encoding="utf-8") as out:
            out.write("\n" + extra.read_text(encoding="utf-8"))
    return config


def _tracker_lines(config_path: Path, database: Database) -> list[str]:
    """Where the results went besides evald's database, when the workspace configures trackers."""
    from daemon.config import load_config
    from daemon.delivery.report import destinations

    trackers = load_config(config_path).trackers
    return destinations(database, trackers) if trackers else []


def _terminal_jobs(database: Database) -> tuple[int, list[queries.JobRow]]:
    with database.session() as session:
        jobs = queries.job_rows(session)
        checkpoints = queries.checkpoint_rows(session)
    settled = [c for c in checkpoints if c.state in ("invalid", "vanished")]
    done = [j for j in jobs if j.state in (JobState.SUCCEEDED, JobState.FAILED)]
    return len(settled), done


def run_demo(workdir: Path | None, *, as_json: bool, serve: bool = False, port: int = 0) -> int:
    workdir = (workdir or Path(tempfile.mkdtemp(prefix="evald-demo-"))).resolve()
    progress = sys.stderr if as_json else sys.stdout
    _say(f"evald demo: workspace {workdir}", progress)
    workdir.mkdir(parents=True, exist_ok=True)
    if (workdir / "evald.db").exists() or any((workdir / "run").glob("step_*")):
        raise EvaldError(f"{workdir} already holds a demo; pass a new --workdir or remove it")
    secret = Secret.generate()
    with WebhookReceiver(secret) as receiver:
        return _run(workdir, receiver, secret, as_json=as_json, progress=progress, serve=serve, port=port)


def _run(
    workdir: Path,
    receiver: WebhookReceiver,
    secret: Secret,
    *,
    as_json: bool,
    progress: TextIO,
    serve: bool = False,
    port: int = 0,
) -> int:
    config_path = write_workspace(workdir, receiver.url)
    database = Database(f"sqlite:///{workdir / 'evald.db'}")
    migrations.upgrade(database)
    # The dashboard from the start, so the curves can be watched growing as checkpoints are evaluated.
    server = _serve(config_path, port, progress) if serve else None
    try:
        code = _run_trainer_and_daemon(
            workdir, config_path, database, receiver, secret, as_json=as_json, progress=progress
        )
        if server is not None:
            serve_until_interrupted(server.url, progress)
        return code
    finally:
        if server is not None:
            server.stop()


def _serve(config_path: Path, port: int, progress: TextIO) -> BackgroundServer:
    from daemon.web.server import BackgroundServer, build

    server = BackgroundServer(build(load_config(config_path)), port=port)
    server.start()
    _say(f"dashboard: {server.url}", progress)
    return server


class Interrupt:
    """A signal handler that only records which signal came.

    Not a ``threading.Event``: Python runs a handler in the main thread between two bytecodes, possibly
    while that thread holds the Event's lock inside ``Event.wait``, and ``Event.set`` would then wait
    for that lock forever (the demo would never end on SIGTERM)."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        self.signal = signum


@contextmanager
def interrupts(*signals: signal.Signals) -> Iterator[Interrupt]:
    """``signals`` recorded by an :class:`Interrupt` inside the block, the previous handlers back after.

    Set here, whatever the process inherited: a shell without job control (a script's ``cmd &``, CI,
    a test runner started that way) starts commands with SIGINT ignored, and Python then installs no
    KeyboardInterrupt for it, so Ctrl-C or ``kill -INT`` would have been ignored and the demo would
    have served forever."""
    interrupt = Interrupt()
    previous = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield interrupt
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_until_interrupted(url: str, progress: TextIO, poll_secs: float = 0.1) -> int:
    """Say where the dashboard is and wait for Ctrl-C (SIGINT) or SIGTERM; returns the signal."""
    # The handlers are in place before the line is printed: whoever reads it may press Ctrl-C at once.
    with interrupts(signal.SIGINT, signal.SIGTERM) as interrupt:
        _say(f"\ndashboard: {url} (serving until Ctrl-C)", progress)
        while interrupt.signal is None:
            time.sleep(poll_secs)
        return interrupt.signal


def _run_trainer_and_daemon(
    workdir: Path,
    config_path: Path,
    database: Database,
    receiver: WebhookReceiver,
    secret: Secret,
    *,
    as_json: bool,
    progress: TextIO,
) -> int:
    """Start the toy trainer and a real daemon (``evald run``) on ``config_path``, follow them until every
    checkpoint is evaluated and the alerts and tracker messages arrived, stop both, and print what came
    out; a daemon that did not exit cleanly raises."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", SECRET_ENV: secret.reveal_text()}
    daemon_log = (workdir / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "daemon", "--config", str(config_path), "run"],
        stdout=daemon_log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    trainer_log = (workdir / "trainer.log").open("wb")
    trainer = subprocess.Popen(
        [
            *(sys.executable, "-m", "inference.toy.trainer", "--out", str(workdir / "run"), "--threads", "1"),
            *("--steps", str(TRAIN_STEPS), "--collapse-at", str(COLLAPSE_AT)),
        ],
        stdout=trainer_log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    _say("trainer and daemon started; checkpoints are evaluated as they appear", progress)
    try:
        rows = _follow(database, trainer, daemon, workdir, progress)
        alerts = _await_alerts(database, receiver)
        _await_trackers(database)
    finally:
        for process in (trainer, daemon):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        daemon_code = daemon.wait(timeout=60)
        trainer.wait(timeout=60)
        daemon_log.close()
        trainer_log.close()
        database.dispose()
    if daemon_code != 0:
        raise EvaldError(f"the daemon exited with status {daemon_code}; see {workdir / 'daemon.log'}")
    _print_outcome(rows, alerts, config_path, database, as_json=as_json)
    return 0


def _print_outcome(
    rows: list[queries.ResultRow],
    alerts: list[dict[str, Any]],
    config_path: Path,
    database: Database,
    *,
    as_json: bool,
) -> None:
    """The demo's outcome on stdout: each checkpoint's metrics and the alerts received (JSON, or a table
    and the commands that show more)."""
    grouped = report.metrics_by_checkpoint(rows)
    if as_json:
        checkpoints = [
            {"step": step, "metrics": metrics} for (_run, step, _name, _task), metrics in grouped.items()
        ]
        print(json.dumps({"checkpoints": checkpoints, "alerts": alerts}))
    else:
        table_rows = [
            [step, *(m.get(name) for name in TABLE_METRICS)] for (_r, step, _n, _t), m in grouped.items()
        ]
        print(
            report.table(
                ("step", "accuracy", "entropy", "length", "truncated", "tokens/s", "wall s"), table_rows
            )
        )
        print(f"\nalerts at the demo's webhook receiver (the learning rate jumped after step {COLLAPSE_AT}):")
        for alert in alerts:
            seal = "signature verified" if alert["signature_verified"] else "SIGNATURE NOT VERIFIED"
            got = "delivered" if alert["delivered"] else "NOT DELIVERED"
            what = f"{alert['state']} {alert['rule']} on {alert['metric']}"
            print(f"  step {alert['step']}: {what} ({got}, {seal})")
        print(f"\nresults: evald --config {config_path} results")
        for line in _tracker_lines(config_path, database):
            print(line)
        print(f"alerts: evald --config {config_path} alerts")
        if grouped:
            (_run, step, _name, task), _ = list(grouped.items())[-1]
            query = f"--run toy --step {step} --task {task} --wrong-only"
            print(f"what it got wrong: evald --config {config_path} samples {query}")


def _follow(
    database: Database,
    trainer: subprocess.Popen[bytes],
    daemon: subprocess.Popen[bytes],
    workdir: Path,
    out: TextIO,
) -> list[queries.ResultRow]:
    """Print each result as it is stored; return them all once the trainer is done and all are evaluated."""
    deadline = time.monotonic() + DEMO_TIMEOUT_SECS
    shown: set[int] = set()
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise EvaldError(
                f"the daemon stopped with status {daemon.returncode}; see {workdir / 'daemon.log'}"
            )
        trainer_code = trainer.poll()
        if trainer_code not in (None, 0):
            raise EvaldError(f"the trainer failed with status {trainer_code}; see {workdir / 'trainer.log'}")
        settled, done = _terminal_jobs(database)
        with database.session() as session:
            rows = queries.result_rows(session)
        for job in done:
            if job.id not in shown:
                shown.add(job.id)
                values = {
                    r.metric: r.value
                    for r in rows
                    if r.step == job.step and r.task == job.task and r.metric in TABLE_METRICS
                }
                detail = (
                    ", ".join(f"{k} {v:.3g}" for k, v in values.items())
                    if values
                    else f"{job.state}: {job.error}"
                )
                _say(f"  step {job.step}: {detail}", out)
        saved = [p for p in (workdir / "run").iterdir() if p.is_dir()]
        if trainer_code == 0 and len(done) + settled >= len(saved) > 0:
            return rows
        time.sleep(0.5)
    raise EvaldError(f"not every checkpoint was evaluated within {DEMO_TIMEOUT_SECS:.0f} s; see {workdir}")


def _await_trackers(database: Database) -> None:
    """Until the trackers' outbox rows are sent (or the wait is over), so the daemon's relay delivers
    them before it is stopped; what is left is said by the tracker lines and sent at the next start."""
    deadline = time.monotonic() + DELIVERY_WAIT_SECS
    while time.monotonic() < deadline:
        with database.session() as session:
            pending = session.scalar(
                select(func.count())
                .select_from(OutboxMessage)
                .where(
                    OutboxMessage.endpoint.like(f"{ENDPOINT_PREFIX}%"),
                    OutboxMessage.state == OutboxState.PENDING,
                )
            )
        if not pending:
            return
        time.sleep(0.2)


def _await_alerts(database: Database, receiver: WebhookReceiver) -> list[dict[str, Any]]:
    """Every alert notification queued for the receiver, once delivered (or after the wait): what it was,
    whether the receiver got it, and whether its signature verified there."""
    deadline = time.monotonic() + DELIVERY_WAIT_SECS
    while True:
        with database.session() as session:
            queued = session.execute(
                select(OutboxMessage.event_id, OutboxMessage.body)
                # The receiver's notices only: a tracker's rows (results, alert events) go elsewhere.
                .where(OutboxMessage.endpoint.not_like(f"{ENDPOINT_PREFIX}%"))
                .order_by(OutboxMessage.id)
            ).all()
        got = {a.webhook_id: a for a in receiver.attempts if a.status == 200}
        if all(event_id in got for event_id, _ in queued) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    alerts = []
    for event_id, body in queued:
        facts = json.loads(body)
        attempt = got.get(event_id)
        alerts.append(
            {
                "rule": facts["rule"],
                "metric": facts["metric"],
                "step": facts["step"],
                "state": facts["state"],
                "severity": facts["severity"],
                "message": facts["message"],
                "webhook_id": event_id,
                "delivered": attempt is not None,
                "signature_verified": attempt is not None and attempt.error is None,
            }
        )
    return alerts
