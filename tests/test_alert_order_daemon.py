"""A real daemon attached to runs already on disk alerts the collapse whatever its backlog order (issue 31).

The demo's trainer learns for 720 steps, then its learning rate jumps. Its eight checkpoints are on disk
before evald starts, as when evald is attached to a run in progress, twice: one run root evaluated newest
first (the default, which used to raise no alert at all), one oldest first. Both must end with the same
alerts, the collapse among them at the first checkpoint after 720.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from daemon.config import Secret
from daemon.demo import COLLAPSE_AT, SECRET_ENV, TRAIN_STEPS, write_workspace
from storage import alerting
from storage.database import Database
from tests.deadlines import wait_process
from tests.harness import all_jobs_done, running_daemon, start_trainer, upgraded, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.long]

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_newest_first_and_oldest_first_alert_the_same_collapse(tmp_path: Path) -> None:
    trained = tmp_path / "trained"
    trainer = start_trainer(
        trained, tmp_path / "trainer.log", "--steps", str(TRAIN_STEPS), "--collapse-at", str(COLLAPSE_AT)
    )
    assert wait_process(trainer, 600) == 0, (tmp_path / "trainer.log").read_text()[-2000:]
    steps = sorted(int(p.name.split("_")[-1]) for p in trained.iterdir() if p.is_dir())
    assert len(steps) == 8 and COLLAPSE_AT in steps
    onset = steps[steps.index(COLLAPSE_AT) + 1]

    config = write_workspace(tmp_path)
    one_run = f'[[runs]]\nname = "toy"\nroot = "{tmp_path / "run"}"\nlayout = "auto"\n'
    text = config.read_text(encoding="utf-8")
    assert one_run in text
    runs = "".join(
        f'[[runs]]\nname = "{order}"\nroot = "{tmp_path / order}"\nlayout = "auto"\nbacklog = "{order}"\n\n'
        for order in ("newest_first", "oldest_first")
    )
    config.write_text(text.replace(one_run, runs), encoding="utf-8")
    for order in ("newest_first", "oldest_first"):
        shutil.copytree(trained, tmp_path / order, symlinks=True)

    url = f"sqlite:///{tmp_path / 'evald.db'}"
    database: Database = upgraded(url)
    Secret.parse(SECRET)
    env = {**os.environ, SECRET_ENV: SECRET}
    with running_daemon(config, tmp_path / "daemon.log", env=env) as daemon:
        wait_for(lambda: all_jobs_done(database, 2 * len(steps)), 900, "both runs evaluated", daemon.process)
        assert daemon.stop() == 0
    with database.session() as s:
        rows = {run: alerting.alert_rows(s, run=run) for run in ("newest_first", "oldest_first")}
    database.dispose()
    # Judged before the older results came, newest first may fire (and resolve) on a short series what
    # the whole series does not show: such alerts end withdrawn, saying so. Oldest first never does.
    withdrawn = {
        run: [a for a in alerts if a.state == "resolved" and a.resolved_step is None]
        for run, alerts in rows.items()
    }
    assert withdrawn["oldest_first"] == []
    assert all(a.message.startswith("withdrawn: ") for a in withdrawn["newest_first"])
    seen = {
        run: {
            (a.rule, a.metric, a.state, a.first_step, a.last_step, a.resolved_step)
            for a in alerts
            if a not in withdrawn[run]
        }
        for run, alerts in rows.items()
    }
    assert ("drop_from_best", "accuracy") in {(a[0], a[1]) for a in seen["oldest_first"]}, seen
    collapse = [a for a in seen["newest_first"] if a[:2] == ("drop_from_best", "accuracy")]
    assert [a[3] for a in collapse] == [onset], seen
    # The alerts that stand are the same, whatever the order.
    assert seen["newest_first"] == seen["oldest_first"]
