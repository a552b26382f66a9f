"""The planner on both databases, with a controlled wall clock: which checkpoints are evaluated, in
which order, in which stages, and why the others were not."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from daemon.config import AdaptiveConfig, RunConfig, SchedulingConfig, TwoStageConfig
from daemon.scheduling import followups
from daemon.scheduling.planner import BASE_MODEL_NAME, Planner
from daemon.scheduling.policy import schedule_summary
from daemon.watching import WatchedRun
from storage import queries
from storage import scheduling as store
from storage.database import Database
from storage.models import CheckpointState, EvalJob, JobState

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


class WallClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def at(self, secs: float) -> None:
        self.now = T0 + timedelta(seconds=secs)


@dataclass
class Bench:
    """A run's database rows, a planner over them, and the clock it reads."""

    db: Database
    clock: WallClock
    scheduling: SchedulingConfig
    run: RunConfig
    tasks: tuple[str, ...]
    run_id: int = 0
    planner: Planner = field(init=False)
    #: When the service would fire the run's time trigger next (it re-arms on every reset).
    next_tick: datetime | None = None

    def __post_init__(self) -> None:
        with self.db.session() as s:
            self.run_id = queries.ensure_run(s, self.run.name, str(self.run.root))
        self.restart()

    def restart(self) -> None:
        """A new daemon: nothing carried over but the database."""
        self.planner = Planner(self.scheduling, self.db, [self.watched], clock=self.clock, on_reset=self._arm)
        anchor = self.planner.anchors()[self.run.name]
        self._arm(self.run.name, anchor)

    @property
    def watched(self) -> WatchedRun:
        return WatchedRun(self.run, self.run_id, self.tasks)

    def _arm(self, _run: str, at: datetime) -> None:
        secs = self.scheduling.frequency_for(self.run).secs
        self.next_tick = None if secs is None else at + timedelta(seconds=secs)

    def record(
        self, step: int, state: CheckpointState = CheckpointState.READY, epoch: int | None = None
    ) -> int:
        with self.db.session() as s:
            return queries.record_checkpoint(
                s,
                run_id=self.run_id,
                path=f"{self.run.root}/step_{step}",
                name=f"step_{step}",
                step=step,
                epoch=epoch,
                layout="hf",
                state=state,
            )

    def ready(self, step: int, **kwargs: Any) -> int:
        self.record(step, **kwargs)
        return self.planner.plan()

    def advance(self, secs: float) -> None:
        """Move the clock, firing the time trigger wherever it falls due on the way (as APScheduler would)."""
        target = T0 + timedelta(seconds=secs)
        interval = self.scheduling.frequency_for(self.run).secs
        while self.next_tick is not None and interval is not None and self.next_tick <= target:
            self.clock.now = self.next_tick
            tick = self.next_tick
            self.planner.time_tick(self.run.name)
            if self.next_tick == tick:  # no reset: the interval job fires again one interval on
                self.next_tick = tick + timedelta(seconds=interval)
        self.clock.now = target

    def plans(self) -> dict[int | None, tuple[str, str | None]]:
        with self.db.session() as s:
            return {p.step: (p.plan, p.reason) for p in store.plan_rows(s, self.run.name)}

    def due(self) -> list[int | None]:
        return [step for step, (plan, _) in self.plans().items() if plan == "due"]

    def jobs(self) -> list[queries.JobRow]:
        with self.db.session() as s:
            return queries.job_rows(s, self.run.name)


@pytest.fixture
def bench(database: Database, tmp_path: Path) -> Callable[..., Bench]:
    def make(
        *,
        tasks: Sequence[str] = ("arith",),
        name: str = "r",
        scheduling: dict[str, Any] | None = None,
        **run: Any,
    ) -> Bench:
        return Bench(
            database,
            WallClock(),
            SchedulingConfig(**(scheduling or {})),
            RunConfig(name=name, root=tmp_path / name, **run),
            tuple(tasks),
        )

    return make


def test_checkpoints_every_10_steps_with_freq_steps_20(bench: Callable[..., Bench]) -> None:
    b = bench(freq_steps=20)
    for step in range(10, 130, 10):
        b.ready(step)
    assert b.due() == [20, 40, 60, 80, 100, 120]
    assert b.plans()[50] == ("skipped", "not due: 10 steps since step 40, freq_steps=20")
    assert sorted(j.step for j in b.jobs() if j.step is not None) == [20, 40, 60, 80, 100, 120]


def test_freq_secs_alone_takes_the_newest_checkpoint_at_each_tick(bench: Callable[..., Bench]) -> None:
    b = bench(freq_secs=600)
    for t, step in ((100, 10), (200, 20), (300, 30)):
        b.advance(t)
        b.ready(step)
    assert b.plans()[30][0] == "waiting"
    assert b.plans()[10] == ("skipped", "not due: superseded by step 20 (the time trigger takes the newest)")
    b.advance(600)
    assert b.due() == [30]
    assert b.plans()[30][1] == "time trigger: 600 s since the last evaluation, freq_secs=600"
    for t, step in ((700, 40), (1100, 50)):
        b.advance(t)
        b.ready(step)
    b.advance(1200)
    assert b.due() == [30, 50]
    b.advance(1900)  # a tick at 1800 found nothing waiting; the time is already up for the next one
    b.ready(60)
    assert b.due() == [30, 50, 60]
    assert b.plans()[60][1] == "700 s since the last evaluation, freq_secs=600"


def test_steps_and_time_together_evaluate_the_union_once_each(bench: Callable[..., Bench]) -> None:
    b = bench(freq_steps=40, freq_secs=450)
    arrivals = [(100, 10), (200, 20), (700, 30), (800, 40), (900, 50), (1000, 60), (1100, 70), (1200, 80)]
    for t, step in [*arrivals, (1300, 90)]:
        b.advance(t)
        b.ready(step)
    b.advance(2000)
    plans = b.plans()
    # The time trigger took 20, 40 and 90 (the newest at its ticks, 450 s after each reset); the step
    # trigger took 80, 40 steps after 40.
    assert b.due() == [20, 40, 80, 90]
    for step in (20, 40, 90):
        assert plans[step][1] == "time trigger: 450 s since the last evaluation, freq_secs=450"
    assert plans[80][1] == "40 steps since step 40, freq_steps=40"
    assert plans[50][1] == "not due: superseded by step 60 (the time trigger takes the newest)"
    steps = [j.step for j in b.jobs()]
    assert sorted(s for s in steps if s is not None) == [20, 40, 80, 90]  # one job each: nothing twice


@pytest.mark.parametrize("crash_after", range(0, 8))
def test_a_crash_between_any_two_checkpoints_changes_nothing(
    bench: Callable[..., Bench], crash_after: int
) -> None:
    """Kill -9 anywhere: after a checkpoint was recorded ready but before it was planned, or between
    two planned ones. The restarted planner picks the same checkpoints."""
    b = bench(freq_steps=20, scheduling={"freq_secs": 900})
    steps = list(range(10, 90, 10))
    for i, step in enumerate(steps):
        b.advance(100 * (i + 1))
        if i == crash_after:
            b.record(step)  # ready, then the daemon died before planning it
            b.restart()
            b.planner.plan()
        else:
            b.ready(step)
    b.advance(1000)
    assert b.due() == [20, 40, 60, 80]


def test_an_older_checkpoint_still_incomplete_holds_no_newer_one_back(bench: Callable[..., Bench]) -> None:
    """step_20 is still incomplete (a missing shard, a crashed save) when step_30 is ready: step_30 is
    planned at once, not after invalid_after_secs. When step_20 does become ready it is judged against
    the evaluated checkpoint before it (none: the run's start), as it would have been in step order."""
    b = bench(freq_steps=20)
    b.record(20, state=CheckpointState.DISCOVERED)
    assert b.ready(30) == 1
    assert b.plans()[30] == ("due", "30 steps since step 0, freq_steps=20")
    b.ready(40)
    assert b.plans()[40] == ("skipped", "not due: 10 steps since step 30, freq_steps=20")
    b.ready(20)
    assert b.due() == [20, 30]
    assert b.plans()[20] == ("due", "ready after step 30 was planned: 20 steps since step 0, freq_steps=20")
    b.ready(50)  # the newest evaluated step still counts for what comes next
    assert b.plans()[50] == ("due", "20 steps since step 30, freq_steps=20")


@pytest.mark.parametrize(
    ("run", "scheduling", "expected"),
    [
        ({}, {}, ("due", "ready after step 40 was planned: every checkpoint is due (no frequency set)")),
        (
            {"freq_steps": 20},
            {},
            ("skipped", "not due: ready after step 40 was planned: 10 steps since step 20, freq_steps=20"),
        ),
        (
            {"freq_secs": 600},
            {},
            ("skipped", "not due: ready after step 40 was planned (the time trigger takes the newest)"),
        ),
        (
            {},
            {"backlog": "newest_only"},
            ("skipped", "not due: ready after step 40 was planned (backlog = newest_only takes the newest)"),
        ),
    ],
)
def test_a_late_checkpoint_is_judged_by_the_run_policy(
    bench: Callable[..., Bench], run: dict[str, Any], scheduling: dict[str, Any], expected: tuple[str, str]
) -> None:
    b = bench(scheduling=scheduling, **run)
    b.record(30, state=CheckpointState.DISCOVERED)
    for step in (20, 40):
        b.ready(step)
    if "freq_secs" in run:
        b.advance(700)
    b.ready(30)
    assert b.plans()[30] == expected
    assert (30 in [j.step for j in b.jobs()]) is (expected[0] == "due")


def _claim_order(
    db: Database, oldest_first: frozenset[int] = frozenset()
) -> list[tuple[str, int | None, str]]:
    claimed: list[tuple[str, int | None, str]] = []
    while True:
        with db.session() as s:
            job = queries.claim_next_job(s, "test", oldest_first=oldest_first)
        if job is None:
            return claimed
        claimed.append((job.run, job.step, job.stage))
        with db.session() as s:
            queries.complete_job(
                s, job_id=job.id, owner="test", metrics=(), samples=(), duration_s=1, load_s=None
            )


@pytest.mark.parametrize(
    ("backlog", "expected", "skipped"),
    [
        ("newest_first", [60, 40, 20], []),
        ("oldest_first", [20, 40, 60], []),
        ("newest_only", [60], [20, 40]),
    ],
)
def test_backlog_policy(
    bench: Callable[..., Bench], backlog: str, expected: list[int], skipped: list[int]
) -> None:
    b = bench(freq_steps=20, backlog=backlog)
    for step in (10, 20, 30, 40, 50, 60):
        b.record(step)
    b.planner.plan()  # a restart finds them all at once
    assert [step for _, step, _ in _claim_order(b.db, b.planner.oldest_first)] == expected
    jobs = {j.step: j for j in b.jobs()}
    assert sorted(s for s, j in jobs.items() if j.state == "skipped" and s is not None) == skipped
    for step in skipped:
        newer = step + 20  # each due checkpoint supersedes the ones before it as it is planned
        assert jobs[step].wait_reason == f"superseded by step {newer} before it ran (backlog = newest_only)"
        assert b.plans()[step][0] == "skipped"


def test_a_busy_run_does_not_starve_the_others(bench: Callable[..., Bench]) -> None:
    busy = bench(name="busy")
    quiet = bench(name="quiet")
    for step in range(10, 60, 10):
        busy.ready(step)
    quiet.ready(10)
    order = _claim_order(busy.db)
    assert order[:2] == [("busy", 50, "full"), ("quiet", 10, "full")]
    assert len(order) == 6


def test_two_stage_quick_everywhere_full_now_and_then(bench: Callable[..., Bench]) -> None:
    stages = {"arith": TwoStageConfig(quick_size=8, full_every=3)}
    b = bench(scheduling={"two_stage": stages}, final_step=60)
    for step in range(10, 70, 10):
        b.ready(step)
    by_stage = {(j.step, j.stage) for j in b.jobs()}
    assert {s for s, stage in by_stage if stage == "quick"} == {10, 20, 30, 40, 50, 60}
    # The 1st and 4th evaluated checkpoints, and the final one.
    assert {s for s, stage in by_stage if stage == "full"} == {10, 40, 60}
    order = _claim_order(b.db)
    assert [stage for _, _, stage in order] == ["quick"] * 6 + ["full"] * 3


def _complete(db: Database, step: int, stage: str, value: float, stderr: float, planner: Planner) -> None:
    """Run the job for (step, stage) as a worker would and store its result through the planner."""
    with db.session() as s:
        job_id = s.scalars(
            update(EvalJob)
            .where(EvalJob.step == step, EvalJob.stage == stage, EvalJob.state == JobState.PENDING)
            .values(state=JobState.RUNNING, claimed_by="test", attempts=1)
            .returning(EvalJob.id)
        ).one()
    with db.session() as s:
        job = s.get(EvalJob, job_id)
        assert job is not None
        claimed = queries.ClaimedJob(
            job_id, "arith", stage, 1, job.checkpoint_id, "", "hf", step, "r", job.checkpoint.run_id
        )
        metrics = [queries.MetricRow("accuracy", value, 100, stderr)]
        assert queries.complete_job(
            s, job_id=job_id, owner="test", metrics=metrics, samples=(), duration_s=1, load_s=None
        )
        planner.after_result(s, claimed, metrics)


def test_quick_and_full_results_are_separate_and_quick_results_call_for_full(
    bench: Callable[..., Bench],
) -> None:
    stages = {"arith": TwoStageConfig(quick_size=8, full_every=100, anomaly_sigmas=3.0)}
    b = bench(scheduling={"two_stage": stages})
    for step in (10, 20, 30, 40):
        b.ready(step)
    _complete(b.db, 10, "quick", 0.40, 0.05, b.planner)
    _complete(b.db, 10, "full", 0.43, 0.01, b.planner)
    _complete(b.db, 20, "quick", 0.38, 0.05, b.planner)  # noise, not a best: no full
    _complete(b.db, 30, "quick", 0.45, 0.05, b.planner)  # a new best
    _complete(b.db, 40, "quick", 0.05, 0.02, b.planner)  # a cliff: an anomaly candidate
    fulls = sorted(j.step for j in b.jobs() if j.stage == "full" and j.step is not None)
    assert fulls == [10, 30, 40]
    with b.db.session() as s:
        rows = queries.result_rows(s, run="r", metric="accuracy")
    at_10 = {(r.stage, r.value) for r in rows if r.step == 10}
    assert at_10 == {("quick", 0.40), ("full", 0.43)}


def test_adaptive_interval_follows_the_metric(bench: Callable[..., Bench]) -> None:
    adaptive = AdaptiveConfig(task="arith", metric="accuracy", min_every_steps=10, max_every_steps=80)
    b = bench(freq_steps=20, adaptive=adaptive)
    b.ready(20)
    _complete(b.db, 20, "full", 0.20, 0.02, b.planner)
    b.ready(40)
    _complete(b.db, 40, "full", 0.40, 0.02, b.planner)  # moving fast: every 10 steps
    b.ready(50)
    assert b.due() == [20, 40, 50]
    _complete(b.db, 50, "full", 0.41, 0.02, b.planner)  # flat: every 20
    b.ready(60)
    b.ready(70)
    assert b.due() == [20, 40, 50, 70]
    with b.db.session() as s:
        summary = schedule_summary(b.scheduling, b.run, store.schedules(s)["r"])
    assert summary["adaptive"]["every_steps"] == 20
    assert summary["adaptive"]["reason"].startswith("accuracy flat: changed 0.01 (step 40 → 50)")
    assert summary["next_due"] == "step >= 90"


def test_eval_before_train_evaluates_the_base_model_as_step_0(
    bench: Callable[..., Bench], tmp_path: Path
) -> None:
    from tests.checkpoints import save_tiny_llama

    base = save_tiny_llama(tmp_path / "base")
    b = bench(freq_steps=20, eval_before_train=True, base_model=base)
    b.planner.register_base_models()
    b.planner.register_base_models()  # a restart does not add it twice
    b.planner.plan()
    b.ready(10)
    b.ready(20)
    assert b.due() == [0, 20]
    names = {j.checkpoint for j in b.jobs()}
    assert BASE_MODEL_NAME in names


def test_the_last_checkpoint_of_a_quiet_run_is_evaluated(bench: Callable[..., Bench]) -> None:
    b = bench(freq_steps=20, scheduling={"final_after_secs": 600})
    for step in (10, 20, 30):
        b.ready(step)
    assert b.planner.finalize_quiet_runs() == 0  # not quiet long enough
    b.clock.at(601)
    assert b.planner.finalize_quiet_runs() == 1
    assert b.due() == [20, 30]
    assert b.plans()[30][1] == "final: no newer checkpoint for 600 s"
    assert b.planner.finalize_quiet_runs() == 0


def test_status_summary_names_the_next_due_point(bench: Callable[..., Bench]) -> None:
    b = bench(freq_steps=20, freq_epochs=1, steps_per_epoch=100)
    b.ready(20)
    b.ready(30)
    with b.db.session() as s:
        summary = schedule_summary(b.scheduling, b.run, store.schedules(s)["r"])
    assert summary["frequency"] == "freq_steps=20, freq_epochs=1"
    assert summary["next_due"] == "step >= 40 or epoch >= 1"
    assert summary["last_reset"]["step"] == 20


def test_a_late_older_checkpoint_does_not_supersede_a_newer_waiting_one(bench: Callable[..., Bench]) -> None:
    b = bench(freq_secs=600)
    b.advance(100)
    b.ready(100)  # copied first (rsync sorts global_step100 before global_step90)
    b.ready(90)
    assert b.plans()[100][0] == "waiting"
    assert b.plans()[90][0] == "waiting"
    b.advance(600)
    assert b.due() == [100]
    assert b.plans()[90] == ("skipped", "not due: superseded by step 100 (the time trigger takes the newest)")


def test_the_final_step_is_due_whatever_the_frequency(bench: Callable[..., Bench]) -> None:
    b = bench(freq_steps=300, final_step=1000)
    for step in (300, 600, 900, 1000):
        b.ready(step)
    assert b.due() == [300, 600, 900, 1000]
    assert b.plans()[1000][1] == "final step (final_step=1000)"


def test_newest_only_never_supersedes_the_base_model(bench: Callable[..., Bench], tmp_path: Path) -> None:
    from tests.checkpoints import save_tiny_llama

    base = save_tiny_llama(tmp_path / "base")
    b = bench(backlog="newest_only", eval_before_train=True, base_model=base)
    b.planner.register_base_models()
    for step in (10, 20):
        b.record(step)
    b.planner.plan()  # a first start over a backlog: the base and both checkpoints in one pass
    states = {j.step: j.state for j in b.jobs()}
    assert states == {0: "pending", 10: "skipped", 20: "pending"}


def test_a_slow_run_is_not_finished_between_two_of_its_checkpoints(bench: Callable[..., Bench]) -> None:
    """Checkpoints two hours apart, final_after_secs an hour: quiet means three of its gaps."""
    b = bench(freq_steps=20, scheduling={"final_after_secs": 3600})
    for i, step in enumerate((10, 20, 30)):
        b.clock.at(i * 7200)
        b.ready(step)
    b.clock.at(2 * 7200 + 3601)
    assert b.planner.finalize_quiet_runs() == 0
    b.clock.at(2 * 7200 + 3 * 7200)
    assert b.planner.finalize_quiet_runs() == 1
    assert b.plans()[30][1] == "final: no newer checkpoint for 21600 s"


def test_a_failing_follow_up_never_loses_the_result(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
) -> None:
    stages = {"arith": TwoStageConfig(quick_size=8, full_every=100)}
    b = bench(scheduling={"two_stage": stages})
    b.ready(10)

    def broken(*_args: object) -> int:
        raise RuntimeError("a bug in a follow-up")

    monkeypatch.setattr(followups, "_full_after_quick", broken)
    _complete(b.db, 10, "quick", 0.4, 0.05, b.planner)
    with b.db.session() as s:
        rows = queries.result_rows(s, run="r", metric="accuracy")
    assert [(r.step, r.stage, r.value) for r in rows] == [(10, "quick", 0.4)]
