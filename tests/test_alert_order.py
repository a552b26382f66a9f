"""Alerts follow the series in step order, whatever order its results are stored in (issue 31).

evald attached to a run in progress evaluates its backlog newest first (the default), then backfills; two
stages and retries interleave. One series stored oldest first, newest first and in a backfill order must
leave the same alerts with the same onsets, ends and resolutions (SQLite and PostgreSQL), and a late result
for an older step must neither re-open a resolved alert at the wrong step nor move its onset to itself.
"""

from __future__ import annotations

import random
from pathlib import Path

from sqlalchemy import delete

from daemon.alerts.episodes import latest_episodes
from daemon.alerts.lifecycle import Alerter
from daemon.anomaly import Finding
from storage import alerting
from storage.database import Database
from storage.models import Run
from tests.test_alerts import make_config, outbox, store

#: Accuracy of one GRPO run every 120 steps: it learns to 1.0, collapses to 0 at 840 and stays down at 960
#: (the issue's case), recovers from 1080, dips again at 1560 for two checkpoints, and recovers.
SERIES = {
    **{step: 1.0 for step in range(120, 840, 120)},
    840: 0.0,
    960: 0.0,
    **{step: 0.98 for step in range(1080, 1560, 120)},
    1560: 0.40,
    1680: 0.38,
    1800: 0.97,
    1920: 0.98,
}


def _backfill_order(steps: list[int]) -> list[int]:
    """The newest first, then the rest as a backfill meets them: every other step, then the gaps, shuffled
    within each half (a retry or a second daemon lands out of order)."""
    newest, rest = steps[-1], list(reversed(steps[:-1]))
    first, second = rest[::2], rest[1::2]
    random.Random(31).shuffle(first)
    random.Random(32).shuffle(second)
    return [newest, *first, *second]


def _alerts(database: Database) -> set[tuple[object, ...]]:
    """What a person reads of each alert: rule, state, onset, end, resolution, metric, severity and value."""
    with database.session() as s:
        rows = alerting.alert_rows(s)
    return {(*_episode(a), a.metric, a.severity, a.value, a.repeats) for a in rows}


def _episode(a: alerting.AlertRow) -> tuple[object, ...]:
    return (a.rule, a.state, a.first_step, a.last_step, a.resolved_step)


def _stored(database: Database, tmp_path: Path, order: list[int]) -> set[tuple[object, ...]]:
    tmp_path.mkdir()
    config = make_config(tmp_path)
    alerter = Alerter(config)
    for step in order:
        store(database, config, alerter, step, SERIES[step])
    return _alerts(database)


def test_one_series_in_three_orders_leaves_the_same_alerts(database: Database, tmp_path: Path) -> None:
    steps = sorted(SERIES)
    orders = {
        "oldest_first": steps,
        "newest_first": list(reversed(steps)),
        "backfill": _backfill_order(steps),
    }
    seen: dict[str, set[tuple[object, ...]]] = {}
    for name, order in orders.items():
        # Each order on an empty database of the same backend: the run and all it holds deleted between.
        with database.session() as s:
            s.execute(delete(Run))
        seen[name] = _stored(database, tmp_path / name, order)
    oldest = seen["oldest_first"]
    # Each alert holds its latest episode: the dip at 1560..1680, resolved at 1800 (the collapse at 840
    # before it is the newest-first test's).
    assert ("drop_from_best", "resolved", 1560, 1680, 1800) in {a[:5] for a in oldest}, oldest
    assert seen["newest_first"] == oldest
    assert seen["backfill"] == oldest


def test_newest_first_alerts_the_collapse_at_its_onset(database: Database, tmp_path: Path) -> None:
    """The issue's case: 960, 840, ... 120 evaluated in that order; accuracy went 1.0 → 0 at 840."""
    config = make_config(tmp_path)
    alerter = Alerter(config)
    for step in range(960, 0, -120):
        store(database, config, alerter, step, SERIES[step])
    with database.session() as s:
        rows = [a for a in alerting.alert_rows(s) if a.metric == "accuracy"]
    assert rows, "no alert for a collapse from 1.0 to 0"
    assert {(a.state, a.first_step, a.last_step) for a in rows} == {("firing", 840, 960)}
    # Sent once it could be judged: each alert's firing notice, none withdrawn or resolved.
    assert {state for _, _, state in outbox(database)} == {"firing"}


def test_a_late_older_result_does_not_reopen_a_resolved_alert(database: Database, tmp_path: Path) -> None:
    """Resolved 840..960 at 1080; then a backfilled 1020 (still down) and 800 (healthy) land. The onsets
    stay at 840 (they moved to the late step itself), drop_from_best's episode widens to 1020 and stays
    resolved at 1080, and every alert ends as the same points stored oldest first leave it."""
    late = {1020: 0.0, 800: 1.0}
    config = make_config(tmp_path)
    alerter = Alerter(config)
    for step in range(120, 1200, 120):
        store(database, config, alerter, step, SERIES[step])
    assert ("drop_from_best", "resolved", 840, 960, 1080) in {a[:5] for a in _alerts(database)}
    for step, value in late.items():
        store(database, config, alerter, step, value)
    backfilled = _alerts(database)
    assert ("drop_from_best", "resolved", 840, 1020, 1080) in {a[:5] for a in backfilled}
    assert {a[2] for a in backfilled} == {840}, backfilled

    with database.session() as s:
        s.execute(delete(Run))
    points = {**{step: SERIES[step] for step in range(120, 1200, 120)}, **late}
    (tmp_path / "again").mkdir()
    config = make_config(tmp_path / "again")
    alerter = Alerter(config)
    for step in sorted(points):
        store(database, config, alerter, step, points[step])
    assert _alerts(database) == backfilled


def test_episodes_are_read_in_step_order() -> None:
    def finding(step: int) -> Finding:
        return Finding("robust_z", "accuracy", step, 0.1, 0.9, "warning", f"at {step}")

    judged = {100: [], 200: [finding(200)], 300: [finding(300)], 400: [], 500: [finding(500)]}
    [episode] = latest_episodes(judged).values()
    assert (episode.first_step, episode.last_step, episode.resolved_step, episode.repeats) == (
        500,
        500,
        None,
        1,
    )
    judged[600] = []
    [episode] = latest_episodes(judged).values()
    assert (episode.first_step, episode.resolved_step, episode.latest.message) == (500, 600, "at 500")
    del judged[500], judged[600]
    [episode] = latest_episodes(judged).values()
    assert (episode.first_step, episode.last_step, episode.resolved_step, episode.repeats) == (
        200,
        300,
        400,
        2,
    )
