"""What the MLflow sink keeps on a run besides its metric curves: one JSON file per evaluation and per
alert, and a bounded set of tags (pure: messages in, paths, JSON and tag values out).

A trainer's run stays readable after a week of checkpoints: its metrics are the plotted values only
(``eval/<task>/<metric>``, one key per metric), each evaluation's full record (value, stderr and n of each
metric, the checkpoint's path, the job and event ids) is a file under ``evald/evaluations/``, each alert's
latest event a file under ``evald/alerts/``, and evald sets four tags whatever the number of evaluations:
``evald.run``, ``evald.last_step``, ``evald.alerts.firing`` and ``evald.results`` (where the files are).
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from daemon.delivery.messages import AlertEvent, ResultMessage

RUN_TAG = "evald.run"
#: The highest checkpoint step evald has delivered to the run.
LAST_STEP_TAG = "evald.last_step"
#: The run's firing alerts: ``{"count": N, "alerts": {"<id>": "<title> (<severity>)"}}``.
FIRING_TAG = "evald.alerts.firing"
#: Says where evald's files on the run are.
RESULTS_TAG = "evald.results"
EVALUATIONS_DIR = "evald/evaluations/"
ALERTS_DIR = "evald/alerts/"
RESULTS_NOTE = (
    f"{EVALUATIONS_DIR}<task>/step_<step>_job_<id>.json: each evaluation's values, stderr, n and "
    f"checkpoint; {ALERTS_DIR}alert_<id>.json: each alert's latest event"
)


def evaluation_path(message: ResultMessage) -> str:
    """``evald/evaluations/<task>[/<stage>]/step_<step>_job_<id>.json``: the step zero-padded to 9 digits
    so that MLflow's artifact browser lists them in order; the job id keeps a re-evaluation of one
    checkpoint apart."""
    stage = "" if message.stage == "full" else f"/{message.stage}"
    return f"{EVALUATIONS_DIR}{message.task}{stage}/step_{message.step:09d}_job_{message.job_id}.json"


def evaluation_record(event_id: str, message: ResultMessage) -> dict[str, Any]:
    """One evaluation as its file holds it; JSON has no NaN, so a diverged value is null (the metric
    curve keeps its NaN)."""
    return {
        "run": message.run,
        "task": message.task,
        "stage": message.stage,
        "step": message.step,
        "checkpoint": message.checkpoint,
        "checkpoint_path": message.checkpoint_path,
        "job_id": message.job_id,
        "event_id": event_id,
        "finished_ms": message.finished_ms,
        "metrics": {
            m.name: {
                "key": message.key(m.name),
                "value": _finite(m.value),
                "stderr": _finite(m.stderr),
                "n": m.n,
            }
            for m in message.metrics
        },
    }


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def alert_path(event: AlertEvent) -> str:
    return f"{ALERTS_DIR}alert_{event.alert_id:09d}.json"


@dataclass
class RunRecord:
    """What the sink knows of one MLflow run's evald tags (read once from the run, kept up to date)."""

    last_step: int | None = None
    firing: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> RunRecord:
        record = cls()
        with contextlib.suppress(KeyError, ValueError):
            record.last_step = int(tags[LAST_STEP_TAG])
        try:
            alerts = json.loads(tags.get(FIRING_TAG) or "{}").get("alerts", {})
            record.firing = {str(k): str(v) for k, v in alerts.items()}
        except (ValueError, AttributeError):
            pass
        return record

    def apply(self, message: ResultMessage | AlertEvent) -> None:
        if isinstance(message, ResultMessage):
            self.last_step = max(message.step, self.last_step or message.step)
        elif message.state == "firing":
            self.firing[str(message.alert_id)] = f"{message.title} ({message.severity})"
        else:
            self.firing.pop(str(message.alert_id), None)

    def tags(self, limit: int) -> dict[str, str]:
        """The tags' values, each within ``limit`` characters (the firing list names the newest alerts
        that fit, and counts them all)."""
        out = {RESULTS_TAG: RESULTS_NOTE}
        if self.last_step is not None:
            out[LAST_STEP_TAG] = str(self.last_step)
        listed = dict(sorted(self.firing.items(), key=lambda item: int(item[0])))
        while True:
            value = json.dumps({"count": len(self.firing), "alerts": listed})
            if len(value) <= limit or not listed:
                break
            listed.pop(next(iter(listed)))
        out[FIRING_TAG] = value
        return out
