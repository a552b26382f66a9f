"""The webhook receiver down, hanging, answering 500 and answering 410 while alerts are raised.

Each checkpoint's result raises one alert notification. In turn: nothing listens on the webhook's port
(connection refused) while two checkpoints are evaluated, then it listens again; it holds two requests
for 3 s (the sender's timeout is 1 s, so the sender re-sends the same ``webhook-id``); it answers 500
three times; it answers 410 Gone (the endpoint is disabled, the alert is not sent by design, and an
operator's ``evald webhook test`` enables it again); then a last checkpoint's alert must go through.
``--short`` evaluates one checkpoint during the outage and sends one alert into both the hang and the 500s.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from reliability import checkpoints
from reliability.figures import Expected, Figures
from reliability.scenarios.base import Options
from reliability.workspace import TASK, RunSpec, Workspace, wait_for, workspace, write_dataset


def run(options: Options) -> Figures:
    figures = Figures("webhook down / hang / 500 / 410")
    with workspace("webhooks", options.workdir) as ws:
        root = ws.folder / "runs" / "toy"
        root.mkdir(parents=True)
        ws.write_config([RunSpec("toy", root)], dataset=write_dataset(ws.folder / "arith.jsonl", 4))
        ws.upgrade()
        checkpoints.toy_checkpoint()
        ws.start_daemon()
        steps: list[int] = []

        def evaluate(count: int, settled: Callable[[], bool] | None = None) -> None:
            for _ in range(count):
                steps.append(len(steps) + 1)
                checkpoints.write(root, steps[-1])
            wait_for(
                lambda: ws.jobs_settled(len(steps)) or (settled is not None and settled()), 300, "the jobs"
            )

        try:
            ws.fault("receiver down", "webhook.retry")
            ws.receiver_down()
            during = options.pick(short=1, full=2)
            evaluate(during, settled=lambda: jobs_done(ws, len(steps)) and retried(ws, 2))
            ws.receiver_up()
            wait_for(lambda: ws.jobs_settled(len(steps)), 120, "the alerts held during the outage")

            ws.fault("receiver hang", "webhook.retry")
            ws.receiver.hang(3.0, times=2)
            if not options.short:  # the short run sends one alert into the hang and the 500s
                evaluate(1)

            ws.fault("receiver 500", "webhook.retry")
            ws.receiver.respond(500, times=3)
            evaluate(1)

            ws.fault("receiver 410", "webhook.disabled")
            ws.receiver.respond(410)
            evaluate(1)
            command = ["--config", str(ws.config_path), "webhook", "test", "receiver"]
            test = subprocess.run(
                [sys.executable, "-m", "daemon", *command],
                capture_output=True,
                text=True,
                timeout=120,
                env=ws.daemon_env(),
            )
            (ws.folder / "outputs").mkdir(exist_ok=True)
            (ws.folder / "outputs" / "webhook-test.txt").write_text(test.stdout + test.stderr)
            if test.returncode != 0:
                figures.notes.append(
                    f"evald webhook test exited {test.returncode}: {test.stderr.strip()[-300:]}"
                )
            evaluate(1)
        except TimeoutError as exc:
            figures.notes.append(str(exc))
        figures.written = len(steps)
        expected = Expected(due=frozenset(f"toy/step_{s}" for s in steps), tasks=(TASK,))
        return ws.finish(figures, expected)


def jobs_done(ws: Workspace, count: int) -> bool:
    from sqlalchemy import select

    from storage.models import EvalJob, JobState

    database = ws.database()
    try:
        with database.session() as session:
            states = session.scalars(select(EvalJob.state)).all()
    finally:
        database.dispose()
    return len(states) >= count and all(s == JobState.SUCCEEDED for s in states)


def retried(ws: Workspace, attempts: int) -> bool:
    """The relay tried the first queued alert ``attempts`` times (each refused: nothing listened)."""
    from sqlalchemy import select

    from storage.models import OutboxMessage

    database = ws.database()
    try:
        with database.session() as session:
            tries = session.scalars(select(OutboxMessage.attempts).order_by(OutboxMessage.id)).first()
    finally:
        database.dispose()
    return tries is not None and tries >= attempts
