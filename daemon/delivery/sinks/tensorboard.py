"""The TensorBoard sink: live event files, one writer per evald run, beside (not inside) the trainer's.

``<dir>/<run>/`` (default ``<run root>/evald_tensorboard/``) gets each value as a scalar at the
checkpoint's training step under ``eval/<task>/<metric>`` (``/stderr``, ``/n`` beside it), and the sample
table as text, each alert event as text under ``eval/alerts``. Event files are append-only, so delivered
ids are kept in a ledger beside them, appended once the writer flushed: a message sent again is not
written twice. Point TensorBoard at the trainer's log folder and this one
(``--logdir_spec trainer:...,evald:...``) to see both.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from daemon.config import TrackerConfig
from daemon.delivery.base import Batch, Sink
from daemon.delivery.errors import SinkError, SinkUnavailable
from daemon.delivery.messages import AlertEvent, Message, ResultMessage

log = structlog.get_logger("daemon.delivery.sinks.tensorboard")

LEDGER = "evald-delivered.txt"
#: Alert events as text at their step.
ALERTS_TAG = "eval/alerts"


class TensorBoardSink(Sink[Message]):
    def __init__(self, config: TrackerConfig) -> None:
        # Loaded here, in the lane's thread as it starts, not when the first result is sent.
        import torch.utils.tensorboard  # noqa: F401

        self.name = config.name
        self._config = config
        self._writers: dict[str, tuple[Any, Path, set[str]]] = {}

    def folder(self, run: str, root: str) -> Path:
        base = self._config.dir if self._config.dir is not None else Path(root) / "evald_tensorboard"
        return base / run

    def where(self, run: str) -> str:
        known = self._writers.get(run)
        return f"TensorBoard event files in {known[1]}" if known else "TensorBoard event files"

    def _writer(self, message: Message) -> tuple[Any, Path, set[str]]:
        known = self._writers.get(message.run)
        if known is not None:
            return known
        from torch.utils.tensorboard import SummaryWriter

        folder = self.folder(message.run, message.run_root)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            ledger = folder / LEDGER
            done = set(ledger.read_text(encoding="utf-8").split()) if ledger.exists() else set()
            writer = SummaryWriter(log_dir=str(folder))
        except OSError as exc:
            raise SinkUnavailable(f"{folder}: {exc.strerror or exc}") from exc
        self._writers[message.run] = (writer, folder, done)
        return self._writers[message.run]

    def deliver_many(self, items: Sequence[tuple[str, Message]]) -> Batch:
        fresh: list[bool] = []
        try:
            for event_id, message in items:
                fresh.append(self._deliver(event_id, message))
        except SinkError as exc:
            return Batch(tuple(fresh), exc)
        return Batch(tuple(fresh))

    def _deliver(self, event_id: str, message: Message) -> bool:
        writer, folder, done = self._writer(message)
        if event_id in done:
            return False
        try:
            if isinstance(message, AlertEvent):
                writer.add_text(
                    ALERTS_TAG,
                    f"**{message.title}** ({message.severity}): {message.message}",
                    global_step=message.step or 0,
                )
            else:
                self._write(writer, message)
            # One flush and ledger line per message: a crash between them repeats one message at most.
            writer.flush()
            with (folder / LEDGER).open("a", encoding="utf-8") as out:
                out.write(event_id + "\n")
        except OSError as exc:
            raise SinkUnavailable(f"{folder}: {exc.strerror or exc}") from exc
        done.add(event_id)
        return True

    @staticmethod
    def _write(writer: Any, message: ResultMessage) -> None:
        for key, value in message.scalars():
            writer.add_scalar(key, value, global_step=message.step)
        if message.samples:
            lines = ["| grade | prompt | response | reference |", "|---|---|---|---|"]
            for s in message.samples:
                grade = "not graded" if s.correct is None else ("correct" if s.correct else "wrong")
                cells = [grade, s.prompt, s.response, s.reference]
                escaped = (c.replace("|", "\\|").replace("\n", " ") for c in cells)
                lines.append("| " + " | ".join(escaped) + " |")
            writer.add_text(message.key("samples"), "\n".join(lines), global_step=message.step)

    def close(self) -> None:
        writers, self._writers = self._writers, {}
        for writer, _, _ in writers.values():
            writer.close()
