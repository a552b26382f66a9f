"""The W&B sink: each evaluation logged beside the trainer's curves, against its own step metric.

``eval/step`` is the training step of the checkpoint, and every ``eval/*`` key is defined with it as its
step metric (``define_metric``), so a late or out-of-order checkpoint still plots at its step, whatever
W&B's own ``_step`` counter says. Values are ``eval/<task>/<metric>`` with ``/stderr`` beside them (as
lm-eval's W&B logger logs them); n and the job id, a number per task rather than a curve, go in the run's
summary; and a bounded sample table ``eval/<task>/samples`` (step, checkpoint path, prompt, response,
reference, grade); the evaluations of one step that arrive together (a backlog, several tasks) go in one
``log``. An alert is a W&B alert (``run.alert``: W&B sends it on to Slack or e-mail where the user set
that up) and its event in the summary, ``evald/alerts/<id>``.

The run is the trainer's where its id is found (``run_ids`` in the tracker's config, else W&B's
``wandb/latest-run`` link under the run root or one folder below it), resumed by id; else one own run
per evald run, its id derived from the run's name so a restart resumes it. Offline, always the own run
(naming the trainer's in its config), each row given a ``_step`` one past the last this sink logged:
offline, W&B starts a resumed run's ``_step`` at 0, and ``wandb sync`` sends each row with the ``_step``
it was written with, which the server drops when it is below the run's last one. W&B keeps no record a
second process can read of what was logged, so delivered ids (and offline, their ``_step``) are kept in a
ledger file beside W&B's files, appended once W&B took the row: a message sent again is not logged again.
``wandb`` is imported here only: it is an optional extra.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from daemon.config import TrackerConfig
from daemon.delivery.base import Batch, Sink
from daemon.delivery.errors import SinkError, SinkRefused, SinkUnavailable
from daemon.delivery.messages import AlertEvent, Message, ResultMessage

log = structlog.get_logger("daemon.delivery.sinks.wandb")

STEP_KEY = "eval/step"
LEDGER_DIR = "evald-delivered"
#: Each alert's latest event in the run's summary: ``evald/alerts/<alert id>``.
ALERT_KEY = "evald/alerts"


def own_run_id(run: str) -> str:
    """A W&B run id for evald run ``run``: the same at every start (so it is resumed, not doubled)."""
    slug = re.sub(r"[^a-z0-9]+", "-", run.lower()).strip("-")[:40] or "run"
    return f"evald-{slug}-{hashlib.sha256(run.encode()).hexdigest()[:8]}"


_RUN_FOLDER = re.compile(r"(?:offline-)?run-\d{8}_\d{6}-([A-Za-z0-9_-]+)")


def _latest_run_links(root: Path) -> list[Path]:
    return [root / "wandb" / "latest-run", *root.glob("*/wandb/latest-run")]


def trainer_run_on_disk(root: Path) -> str | None:
    """The trainer's W&B run id from ``wandb/latest-run`` (``run-<time>-<id>`` or ``offline-run-...``)
    under ``root`` or a folder below it (verl and OpenRLHF write W&B's folder where they were started)."""
    for link in _latest_run_links(root):
        try:
            target = link.resolve(strict=True)
        except OSError:
            continue
        match = _RUN_FOLDER.fullmatch(target.name)
        if match:
            return match.group(1)
    return None


def vanished_trainer_run(root: Path) -> tuple[Path, str] | None:
    """A ``latest-run`` link under ``root`` whose run folder is gone (the trainer's W&B files deleted or
    moved), and the run id it names: the trainer's run no longer exists where W&B keeps it."""
    for link in _latest_run_links(root):
        if link.is_symlink() and not link.exists():
            match = _RUN_FOLDER.fullmatch(link.readlink().name)
            if match:
                return link, match.group(1)
    return None


def _is_missing_run(error: Exception) -> bool:
    """Whether ``wandb.init(resume="must")`` refused because the run does not exist: W&B's wording is
    ``resume='must' but run (<id>) doesn't exist``."""
    text = str(error).lower()
    return "resume" in text and any(w in text for w in ("doesn't exist", "does not exist", "not found"))


class WandbSink(Sink[Message]):
    def __init__(self, config: TrackerConfig, environ: Mapping[str, str]) -> None:
        # Loaded here, in the lane's thread as it starts, not when the first result is sent.
        import wandb  # noqa: F401

        self.name = config.name
        self._config = config
        self._api_key = (environ.get(config.token_env, "") if config.token_env else "") or None
        self._runs: dict[str, Any] = {}
        self._ledgers: dict[str, set[str]] = {}
        #: Offline: each run's next W&B ``_step`` (the last one this sink logged, plus one).
        self._steps: dict[str, int] = {}

    def _dir(self) -> Path:
        return self._config.dir if self._config.dir is not None else Path.cwd()

    def _ledger_path(self, run_id: str) -> Path:
        return self._dir() / LEDGER_DIR / f"{run_id}.txt"

    def where(self, run: str) -> str:
        handle = self._runs.get(run)
        if self._config.mode == "offline":
            return f"W&B offline run files under {self._dir() / 'wandb'} (send them with `wandb sync`)"
        url = getattr(handle, "url", None) if handle is not None else None
        return f"W&B {url}" if url else f"W&B project {self._config.project}"

    def _after_any_folder_of_this_second(self, run_id: str) -> None:
        """W&B names an offline run's folder by the second it starts (``offline-run-%Y%m%d_%H%M%S-<id>``,
        local time): a run resumed in the same second as an earlier start of its id (a relay restarted at
        once) writes into that folder's file again, and W&B's reader never reaches the later records. So
        it starts in a second that has no folder of its id yet."""
        folders = self._dir() / "wandb"
        while True:
            now = time.time()
            stamp = datetime.fromtimestamp(now).strftime("%Y%m%d_%H%M%S")
            if not (folders / f"offline-run-{stamp}-{run_id}").exists():
                return
            time.sleep(1.0 - now % 1.0 + 0.01)

    def _open(self, message: Message) -> Any:
        handle = self._runs.get(message.run)
        if handle is not None:
            return handle
        trainer = self._trainer_run(message) if self._config.attach == "trainer" else None
        handle = None
        if trainer is not None and self._config.mode == "offline":
            # Offline, W&B's `_step` restarts at 0 in a resumed run, and `wandb sync` sends each row with
            # the `_step` it was written with: the server drops those below the trainer's last step. So
            # offline, an own run (which names the trainer's run in its config) whose steps go on.
            log.info(
                "tracker.wandb_offline_own_run",
                tracker=self.name,
                run=message.run,
                trainer_run=trainer,
                detail="offline: logged to an own run, since wandb sync would drop rows appended to the "
                "trainer's run below its last _step",
            )
        elif trainer is not None:
            handle = self._init(message, trainer, attached=True)
        if handle is None:
            handle = self._init(message, own_run_id(message.run), attached=False, trainer=trainer)
        assert handle is not None
        handle.define_metric(STEP_KEY)
        handle.define_metric("eval/*", step_metric=STEP_KEY)
        self._runs[message.run] = handle
        self._ledgers[handle.id], last = self._read_ledger(handle.id)
        self._steps[handle.id] = last + 1
        log.info(
            "tracker.wandb_run",
            tracker=self.name,
            run=message.run,
            wandb_run=handle.id,
            attached=handle.id == trainer,
        )
        return handle

    def _trainer_run(self, message: Message) -> str | None:
        found = self._config.run_ids.get(message.run) or trainer_run_on_disk(Path(message.run_root))
        if found is not None:
            return found
        vanished = vanished_trainer_run(Path(message.run_root))
        if vanished is not None:
            link, run_id = vanished
            self._say_missing(message, run_id, f"{link} points to a W&B run folder that is gone")
        return None

    def _say_missing(self, message: Message, run_id: str, why: str, **extra: str) -> None:
        log.warning(
            "tracker.trainer_run_missing",
            tracker=self.name,
            run=message.run,
            trainer_run=run_id,
            detail=f"{why}: logging to an own run",
            **extra,
        )

    def _init(self, message: Message, run_id: str, *, attached: bool, trainer: str | None = None) -> Any:
        """``wandb.init`` of ``run_id``; None where the trainer's run (``attached``) does not exist on the
        server (online: ``resume = "must"`` refused), which is said once."""
        import wandb

        self._dir().mkdir(parents=True, exist_ok=True)
        if self._config.mode == "offline":
            self._after_any_folder_of_this_second(run_id)
        settings = wandb.Settings(
            mode=self._config.mode,
            api_key=self._api_key,
            base_url=self._config.tracking_uri or "https://api.wandb.ai",
            silent=True,
            console="off",
            x_disable_stats=True,
            init_timeout=max(30.0, self._config.timeout_secs * 3),
        )
        try:
            handle = wandb.init(
                project=self._config.wandb_project,
                entity=self._config.entity,
                id=run_id,
                # Online, the trainer's run must exist: "allow" would create an empty run under its id.
                # Offline there is no server to ask; `wandb sync` later appends to the run of that id.
                resume="must" if attached and self._config.mode == "online" else "allow",
                dir=str(self._dir()),
                name=None if attached else f"evald-{message.run}",
                tags=None if attached else ["evald"],
                config=None
                if attached
                else {"evald_run": message.run, "evald_root": message.run_root, "trainer_run": trainer},
                settings=settings,
                reinit="create_new",
            )
        except Exception as exc:
            text = str(exc)
            if "401" in text or "403" in text or "API key" in text or "api_key" in text:
                raise SinkRefused(f"wandb.init: credentials refused: {text[:300]}") from exc
            if attached and _is_missing_run(exc):
                why = f"W&B has no run {run_id} in {self._config.project}"
                self._say_missing(message, run_id, why, error=text[:300])
                return None
            raise SinkUnavailable(f"wandb.init: {type(exc).__name__}: {text[:300]}") from exc
        if attached:
            log.info("tracker.attached", tracker=self.name, run=message.run, trainer_run=run_id)
        return handle

    def _read_ledger(self, run_id: str) -> tuple[set[str], int]:
        """The ids logged to ``run_id`` and the highest W&B step this sink gave a row (-1: none); a line is
        ``<event id> [<step>]``."""
        try:
            lines = self._ledger_path(run_id).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return set(), -1
        ids, last = set(), -1
        for line in lines:
            parts = line.split()
            if parts:
                ids.add(parts[0])
            if len(parts) > 1 and parts[1].isdigit():
                last = max(last, int(parts[1]))
        return ids, last

    def deliver_many(self, items: Sequence[tuple[str, Message]]) -> Batch:
        """One ``log`` per step: consecutive evaluations of one run at one step go in one row (the tasks'
        keys differ); an alert is ``run.alert`` and its facts in the summary. The ledger is appended once
        W&B took each row."""
        fresh: list[bool] = []
        group: list[tuple[str, ResultMessage]] = []
        try:
            for event_id, message in items:
                handle = self._open(message)
                if event_id in self._ledgers[handle.id]:
                    fresh += self._log_row(group)
                    group = []
                    fresh.append(False)
                    continue
                if isinstance(message, AlertEvent):
                    fresh += self._log_row(group)
                    group = []
                    self._alert(handle, event_id, message)
                    fresh.append(True)
                    continue
                same_row = bool(group) and (
                    group[0][1].run == message.run
                    and group[0][1].step == message.step
                    # A second evaluation of one task at one step (a re-run) is a row of its own.
                    and all((m.task, m.stage) != (message.task, message.stage) for _, m in group)
                )
                if group and not same_row:
                    fresh += self._log_row(group)
                    group = []
                group.append((event_id, message))
            fresh += self._log_row(group)
        except SinkError as exc:
            return Batch(tuple(fresh), exc)
        return Batch(tuple(fresh))

    def _log_row(self, group: list[tuple[str, ResultMessage]]) -> list[bool]:
        """One ``log`` of ``group`` (one run, one step); [] for none."""
        if not group:
            return []
        import wandb

        handle = self._open(group[0][1])
        row: dict[str, Any] = {STEP_KEY: group[0][1].step}
        # n (the samples a value was computed over) and the job go in the summary, not a curve each.
        summary: dict[str, Any] = {}
        for _, message in group:
            row.update(message.scalars(n=False))
            summary[message.key("job_id")] = message.job_id
            summary.update((message.key(m.name, "n"), m.n) for m in message.metrics if m.n is not None)
            if message.samples:
                table = wandb.Table(
                    columns=["step", "checkpoint", "prompt", "response", "reference", "grade"]
                )
                for s in message.samples:
                    grade = "not graded" if s.correct is None else ("correct" if s.correct else "wrong")
                    table.add_data(
                        message.step, message.checkpoint_path, s.prompt, s.response, s.reference, grade
                    )
                row[message.key("samples")] = table
        # Offline, each row's `_step` is given: one past the last this sink logged to the run, kept in the
        # ledger, so a resumed offline run's rows go on from its earlier files' (W&B would start at 0).
        step = self._steps[handle.id] if self._config.mode == "offline" else None
        try:
            handle.log(row, step=step)
            handle.summary.update(summary)
        except Exception as exc:
            raise SinkUnavailable(f"log: {type(exc).__name__}: {str(exc)[:300]}") from exc
        self._remember(handle.id, [event_id for event_id, _ in group], step)
        if step is not None:
            self._steps[handle.id] = step + 1
        return [True] * len(group)

    def _alert(self, handle: Any, event_id: str, message: AlertEvent) -> None:
        """``run.alert`` (W&B's own alerts: Slack or e-mail where the user set them up) and the event in
        the summary under ``evald/alerts/<id>``, so the run's page shows it."""
        level = {"critical": "ERROR", "warning": "WARN"}.get(message.severity, "INFO")
        if message.state == "resolved":
            level = "INFO"
        try:
            # W&B holds back an alert whose title it sent within ``wait_duration`` (a minute by default);
            # each event's title names its step and state, and each is its own.
            if not message.backfilled:
                # A backfilled event is history: kept in the summary, not sent on to Slack or e-mail.
                handle.alert(title=message.title, text=message.message, level=level, wait_duration=1)
            handle.summary[f"{ALERT_KEY}/{message.alert_id}"] = message.facts(event_id)
        except Exception as exc:
            raise SinkUnavailable(f"alert: {type(exc).__name__}: {str(exc)[:300]}") from exc
        self._remember(handle.id, [event_id])

    def _remember(self, run_id: str, event_ids: list[str], step: int | None = None) -> None:
        path = self._ledger_path(run_id)
        at = "" if step is None else f" {step}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as out:
                out.write("".join(f"{e}{at}\n" for e in event_ids))
        except OSError as exc:
            raise SinkUnavailable(f"ledger {path}: {exc.strerror or exc}") from exc
        self._ledgers[run_id].update(event_ids)

    def close(self) -> None:
        runs, self._runs = self._runs, {}
        for handle in runs.values():
            handle.finish()
