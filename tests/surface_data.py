"""Two small runs stored through the real queue functions, for the query surfaces' tests (compare, plot,
TensorBoard export, /metrics): results at known steps, alerts in both states, and jobs in every state."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from daemon.alerts.lifecycle import fingerprint
from storage import queries, scheduling
from storage.database import Database
from storage.models import Alert, AlertState, CheckpointState
from tests.fixtures import fresh_postgres
from tests.harness import upgraded, write_config, write_dataset

TASK = "arith"
#: run → [(step, accuracy, its stderr, wall_s)] (full stage).
SERIES: dict[str, list[tuple[int, float, float, float]]] = {
    "a": [(10, 0.2, 0.05, 1.5), (20, 0.4, 0.05, 2.5), (30, 0.5, 0.05, 4.0), (40, 0.45, 0.05, 30.0)],
    "b": [(10, 0.25, 0.04, 0.7), (20, 0.6, 0.04, 1.2), (30, 0.52, 0.04, 9.0), (50, 0.7, 0.04, 200.0)],
}
#: Run a's quick stage: (step, accuracy, stderr).
QUICK = [(10, 0.1, 0.1), (20, 0.3, 0.1)]
#: Durations of the succeeded jobs (each job's duration_s is the wall_s stored with it), and the failed one.
DURATIONS = [wall for points in SERIES.values() for (_, _, _, wall) in points] + [0.2, 0.3]
FAILED_S = 12.0


@dataclass(frozen=True)
class AlertSeed:
    run: str
    rule: str
    metric: str | None
    step: int
    state: AlertState


ALERTS = (
    AlertSeed("a", "drop_from_best", "accuracy", 40, AlertState.FIRING),
    AlertSeed("a", "eval_failed", None, 30, AlertState.FIRING),
    AlertSeed("b", "robust_z", "accuracy", 20, AlertState.RESOLVED),
)


def _complete(
    database: Database,
    run_id: int,
    run: str,
    step: int,
    stage: str,
    metrics: list[queries.MetricRow],
    wall: float,
) -> None:
    with database.session() as s:
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=f"/{run}/step_{step}",
            name=f"step_{step}",
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=[TASK], stage=stage)
        job = queries.claim_next_job(s, "h:1")
        assert job is not None and job.step == step
        assert queries.complete_job(
            s, job_id=job.id, owner="h:1", metrics=metrics, samples=[], duration_s=wall, load_s=0.1
        )


def store(database: Database) -> None:
    """Fill an upgraded, empty ``database`` with the runs above."""
    run_ids = {}
    with database.session() as s:
        for run in SERIES:
            run_ids[run] = queries.ensure_run(s, run, f"/{run}")
    for run, points in SERIES.items():
        for step, accuracy, stderr, wall in points:
            metrics = [
                queries.MetricRow("accuracy", accuracy, 100, stderr),
                queries.MetricRow("wall_s", wall, None, None),
            ]
            _complete(database, run_ids[run], run, step, "full", metrics, wall)
    for (step, accuracy, stderr), wall in zip(QUICK, (0.2, 0.3), strict=True):
        _complete(
            database,
            run_ids["a"],
            "a",
            step,
            "quick",
            [queries.MetricRow("accuracy", accuracy, 20, stderr)],
            wall,
        )
    with database.session() as s:
        # The queue as it stands: one failed, one deferred, one pending job of run b.
        for step in (60, 70, 80):
            checkpoint_id = queries.record_checkpoint(
                s,
                run_id=run_ids["b"],
                path=f"/b/step_{step}",
                name=f"step_{step}",
                step=step,
                epoch=None,
                layout="hf",
                state=CheckpointState.READY,
            )
            queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=[TASK])
            if step == 60:
                job = queries.claim_next_job(s, "h:1")
                assert job is not None
                assert queries.fail_job(
                    s, job_id=job.id, owner="h:1", kind="crash", error="boom", duration_s=FAILED_S
                )
            if step == 70:
                scheduling.defer_pending(s, "gpu busy", datetime.now(UTC))
    with database.session() as s:
        for seed in ALERTS:
            s.add(
                Alert(
                    fingerprint=fingerprint(seed.run, seed.rule, seed.metric, TASK),
                    run_id=run_ids[seed.run],
                    task=TASK,
                    metric=seed.metric,
                    rule=seed.rule,
                    severity="warning",
                    state=seed.state,
                    first_step=seed.step,
                    last_step=seed.step,
                    message=f"{seed.rule} at step {seed.step}",
                    resolved_at=datetime.now(UTC) if seed.state == AlertState.RESOLVED else None,
                )
            )


@dataclass(frozen=True)
class Stored:
    url: str
    #: An evald.toml naming the database (for ``main(["--config", config, ...])``).
    config: str


def _surfaces(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stored]:
    """The runs above, stored once per test module and backend (the tests only read them)."""
    tmp = tmp_path_factory.mktemp(f"surfaces-{request.param}")

    def build(url: str) -> Stored:
        database = upgraded(url)
        try:
            store(database)
        finally:
            database.dispose()
        dataset = write_dataset(Path(tmp) / "d.jsonl", 2)
        return Stored(url, str(write_config(Path(tmp), url, dataset=dataset)))

    if request.param == "sqlite":
        yield build(f"sqlite:///{tmp / 'evald.db'}")
    else:
        with fresh_postgres() as url:
            yield build(url)


def surfaces_fixture() -> Any:
    """The module-scoped fixture for a test module to bind: ``surfaces = surface_data.surfaces_fixture()``
    (a binding rather than an import, which linters read as unused)."""
    return pytest.fixture(
        scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
    )(_surfaces)
