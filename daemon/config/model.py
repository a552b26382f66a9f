"""The whole config file: the sections composed, and the checks that span several of them."""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from daemon.config.alerts import AlertsConfig, WebhookConfig
from daemon.config.base import Section
from daemon.config.daemon import DaemonConfig
from daemon.config.database import DatabaseConfig
from daemon.config.executor import ExecutorConfig
from daemon.config.inference import InferenceConfig
from daemon.config.runs import RunConfig
from daemon.config.scheduling import SchedulingConfig
from daemon.config.tasks import TaskConfig
from daemon.config.trackers import TrackerConfig, tracker_problems
from daemon.config.web import WebConfig

#: The sections whose scalar fields ``EVALD_<SECTION>_<FIELD>`` variables override.
ENV_SECTIONS = ("database", "inference", "scheduling", "daemon", "alerts", "web", "executor")


class Config(Section):
    """The whole config file: its sections, and the checks across them (names, tasks, secrets)."""

    database: DatabaseConfig = DatabaseConfig()
    runs: tuple[RunConfig, ...]
    tasks: tuple[TaskConfig, ...]
    inference: InferenceConfig = InferenceConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    daemon: DaemonConfig = DaemonConfig()
    alerts: AlertsConfig = AlertsConfig()
    webhooks: tuple[WebhookConfig, ...] = ()
    #: Experiment trackers results are also logged to (MLflow, W&B, TensorBoard event files).
    trackers: tuple[TrackerConfig, ...] = ()
    web: WebConfig = WebConfig()
    #: Where evaluations run: on this node (``local``, the default) or through Slurm.
    executor: ExecutorConfig = ExecutorConfig()

    @model_validator(mode="before")
    @classmethod
    def _sections(cls, data: Any) -> Any:
        # An absent section is validated like an empty one, so its defaults see the config's folder.
        if isinstance(data, dict):
            return {**{name: {} for name in ENV_SECTIONS}, **data}
        return data

    @model_validator(mode="after")
    def _cross_references(self) -> Config:
        problems: list[str] = []
        for kind, items in (("runs", self.runs), ("tasks", self.tasks)):
            if not items:
                problems.append(f"{kind}: at least one is needed ([[{kind}]] tables)")
        groups = (
            ("runs", [r.name for r in self.runs]),
            ("tasks", [t.name for t in self.tasks]),
            ("webhooks", [w.name for w in self.webhooks]),
        )
        for kind, names in groups:
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                problems.append(f"{kind}: duplicate name {', '.join(dupes)}")
        known = {t.name for t in self.tasks}
        for i, run in enumerate(self.runs):
            for j, task in enumerate(run.tasks):
                if task not in known:
                    problems.append(
                        f"runs[{i}].tasks[{j}]: unknown task {task!r} (defined: {', '.join(sorted(known))})"
                    )
        for name, stages in self.scheduling.two_stage.items():
            staged = self.task(name)
            if staged is None:
                problems.append(
                    f"scheduling.two_stage.{name}: unknown task {name!r} "
                    f"(defined: {', '.join(sorted(known))})"
                )
            elif stages.watch_metric not in staged.metrics:
                problems.append(
                    f"scheduling.two_stage.{name}.watch_metric: task {name!r} does not compute "
                    f"{stages.watch_metric!r} (its metrics: {', '.join(staged.metrics)})"
                )
        for i, run in enumerate(self.runs):
            if run.adaptive is not None:
                problems.extend(self._adaptive_problems(f"runs[{i}].adaptive", run))
        secrets = (
            {self.web.token_env: "web.token_env"}
            | {w.secret_env: f"webhooks[{j}].secret_env" for j, w in enumerate(self.webhooks) if w.secret_env}
            | {t.token_env: f"trackers[{j}].token_env" for j, t in enumerate(self.trackers) if t.token_env}
        )
        problems.extend(tracker_problems(self.trackers, {r.name for r in self.runs}))
        for i, name in enumerate(self.inference.worker_env):
            if name in secrets:
                problems.append(
                    f"inference.worker_env[{i}]: {name} holds the daemon's secret ({secrets[name]}): "
                    "a worker must not inherit it"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _adaptive_problems(self, where: str, run: RunConfig) -> list[str]:
        assert run.adaptive is not None
        names = [t.name for t in self.tasks_for(run)]
        task = self.task(run.adaptive.task)
        if task is None or task.name not in names:
            return [
                f"{where}.task: {run.adaptive.task!r} is not a task of this run "
                f"(its tasks: {', '.join(names)})"
            ]
        if run.adaptive.metric not in task.metrics:
            return [
                f"{where}.metric: task {task.name!r} does not compute {run.adaptive.metric!r} "
                f"(its metrics: {', '.join(task.metrics)})"
            ]
        return []

    def tasks_for(self, run: RunConfig) -> tuple[TaskConfig, ...]:
        return tuple(t for t in self.tasks if not run.tasks or t.name in run.tasks)

    def task(self, name: str) -> TaskConfig | None:
        return next((t for t in self.tasks if t.name == name), None)

    def run(self, name: str) -> RunConfig | None:
        return next((r for r in self.runs if r.name == name), None)
