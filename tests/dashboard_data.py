"""Runs for the dashboard's browser tests, stored through the real queue functions (as a daemon stores
them): three seeds of one recipe and one of another, quality and system metrics, a metric spanning four
decades (log scale), an outlier (ignore outliers), a mean over zero samples (value NaN, n = 0: never drawn
as 0), results stored over three hours (wall and relative time axes), an alert that fired before its last
repeat (its onset is marked), and an evald config naming each run with its own settings (run table)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import update

from daemon.alerts.lifecycle import fingerprint
from storage import queries
from storage.database import Database
from storage.models import Alert, AlertState, CheckpointState, EvalJob
from tests.harness import upgraded, write_dataset

TASK = "math"
RUNS = ("grpo-s1", "grpo-s2", "grpo-s3", "ppo-s1")
STEPS = tuple(range(10, 170, 10))
#: Each run's [[runs]] settings that differ (the run table shows them; grouping by config uses them).
FREQ_STEPS = {"grpo-s1": 10, "grpo-s2": 10, "grpo-s3": 10, "ppo-s1": 20}
#: grpo-s1's tokens/s at this step is a glitch a thousand times the rest.
OUTLIER_STEP = 90
#: grpo-s1's response_length_correct at this step is a mean over no sample.
EMPTY_STEP = 40
#: grpo-s1's accuracy alert: first fired here, last seen at ALERT_LAST.
ALERT_ONSET, ALERT_LAST = 120, 150
#: ppo-s1's reward alert: fired at RESOLVED_ONSET, resolved by RESOLVED_STEP's result (the alert list shows
#: both states).
RESOLVED_ONSET, RESOLVED_STEP = 60, 80
#: When the first result was stored; each checkpoint is evaluated a minute per step later.
START = datetime(2026, 11, 30, 21, 0, tzinfo=UTC)


def _accuracy(run: str, step: int) -> float:
    seed = RUNS.index(run)
    base = 0.15 + 0.5 * (1 - math.exp(-step / 60)) + 0.03 * math.sin(step / 13 + seed * 1.7)
    if run == "ppo-s1":
        base -= 0.08
    if run == "grpo-s1" and step >= ALERT_ONSET:
        base -= 0.2  # the collapse the alert is about
    return round(base, 6)


def metrics_at(run: str, step: int) -> list[queries.MetricRow]:
    seed = RUNS.index(run)
    acc = _accuracy(run, step)
    stderr = round(math.sqrt(acc * (1 - acc) / 100), 6)
    tokens = 900.0 + 40 * seed + step
    if run == "grpo-s1" and step == OUTLIER_STEP:
        tokens = 900_000.0
    correct_length = (
        queries.MetricRow("response_length_correct", math.nan, 0, None)
        if run == "grpo-s1" and step == EMPTY_STEP
        else queries.MetricRow("response_length_correct", 180.0 + step / 2, 40, 3.0)
    )
    return [
        queries.MetricRow("accuracy", acc, 100, stderr),
        queries.MetricRow("reward", round(acc * 2 - 1, 6), 100, round(2 * stderr, 6)),
        queries.MetricRow("pass@4", round(min(1.0, acc + 0.15), 6), 100, stderr),
        # Four decades over the run: the log scale's ticks.
        queries.MetricRow("perplexity", round(20000 * math.exp(-step / 16) + 1 + seed, 4), 100, None),
        queries.MetricRow("tokens_per_s", tokens, None, None),
        queries.MetricRow("latency_p50_s", round(0.8 + 0.01 * step + 0.05 * seed, 4), None, None),
        queries.MetricRow("peak_memory_mb", 4096.0 + 16 * seed, None, None),
        queries.MetricRow("load_s", round(2.0 + 0.1 * seed, 3), None, None),
        queries.MetricRow("response_length", 200.0 + step + 7 * seed, 100, 4.0),
        correct_length,
    ]


def stored_at(run: str, step: int) -> datetime:
    return START + timedelta(minutes=RUNS.index(run) * 5 + step)


@dataclass(frozen=True)
class DashboardData:
    url: str
    config: Path
    token: str


def store(database: Database) -> None:
    with database.session() as s:
        run_ids = {run: queries.ensure_run(s, run, f"/ckpt/{run}") for run in RUNS}
    for run in RUNS:
        for step in STEPS:
            with database.session() as s:
                checkpoint_id = queries.record_checkpoint(
                    s,
                    run_id=run_ids[run],
                    path=f"/ckpt/{run}/step_{step}",
                    name=f"step_{step}",
                    step=step,
                    epoch=None,
                    layout="hf",
                    state=CheckpointState.READY,
                )
                queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=[TASK])
                job = queries.claim_next_job(s, "h:1")
                assert job is not None and job.step == step
                assert queries.complete_job(
                    s,
                    job_id=job.id,
                    owner="h:1",
                    metrics=metrics_at(run, step),
                    samples=[],
                    duration_s=1.0,
                    load_s=0.5,
                )
                # Stored as a three-hour run stores them (complete_job stamps now).
                s.execute(
                    update(EvalJob).where(EvalJob.id == job.id).values(finished_at=stored_at(run, step))
                )
    with database.session() as s:
        # The onset and last step where alerts carry them (issue 20), else the one step they kept.
        steps = {"first_step": ALERT_ONSET, "last_step": ALERT_LAST, "step": ALERT_LAST}
        s.add(
            Alert(
                fingerprint=fingerprint("grpo-s1", "drop_from_best", "accuracy", TASK),
                run_id=run_ids["grpo-s1"],
                task=TASK,
                metric="accuracy",
                rule="drop_from_best",
                severity="critical",
                state=AlertState.FIRING,
                message=f"accuracy dropped from step {ALERT_ONSET}",
                repeats=4,
                **{k: v for k, v in steps.items() if hasattr(Alert, k)},
            )
        )
        s.add(
            Alert(
                fingerprint=fingerprint("ppo-s1", "robust_z", "reward", TASK),
                run_id=run_ids["ppo-s1"],
                task=TASK,
                metric="reward",
                rule="robust_z",
                severity="warning",
                state=AlertState.RESOLVED,
                message=f"reward fell far below its recent steps at step {RESOLVED_ONSET}",
                first_step=RESOLVED_ONSET,
                last_step=RESOLVED_ONSET,
                resolved_step=RESOLVED_STEP,
                fired_at=stored_at("ppo-s1", RESOLVED_ONSET),
                resolved_at=stored_at("ppo-s1", RESOLVED_STEP),
            )
        )


CONFIG = """\
[database]
url = "{url}"

{runs}
[[tasks]]
name = "{task}"
dataset = "{dataset}"
prompt_field = "problem"
id_field = "id"
prompt_template = "{{prompt}}="
max_new_tokens = 12

[web]
token_env = "EVALD_TEST_WEB_TOKEN"
"""

RUN = """[[runs]]
name = "{name}"
root = "{root}"
freq_steps = {freq}
"""


def build(tmp: Path) -> DashboardData:
    url = f"sqlite:///{tmp / 'dashboard.db'}"
    database = upgraded(url)
    try:
        store(database)
    finally:
        database.dispose()
    runs = "\n".join(RUN.format(name=r, root=tmp / r, freq=FREQ_STEPS[r]) for r in RUNS)
    dataset = write_dataset(tmp / "math.jsonl", 4)
    config = tmp / "dashboard.toml"
    config.write_text(CONFIG.format(url=url, runs=runs, task=TASK, dataset=dataset))
    return DashboardData(url, config, token="dashboard-test-token")
