"""One scenario's world: a folder, a config, a database, a supervised daemon, a webhook receiver.

Every scenario runs the real daemon (``python -m daemon run``) under :class:`Supervisor`, with a real
webhook endpoint (a loopback :class:`WebhookReceiver` that verifies signatures) and alerts that fire on
every stored result, so results and alerts are counted in every scenario. :meth:`Workspace.finish`
stops the daemon, counts, checks that every injected fault left a log line naming it, and greps every
output of the run for the secrets it configured.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from sqlalchemy import func, select

from daemon.config import Secret
from daemon.delivery.receiver import Attempt, WebhookReceiver
from reliability.figures import Expected, Figures, count_alerts, count_results
from reliability.supervisor import Supervisor
from storage import migrations
from storage.database import Database
from storage.models import EvalJob, JobState, OutboxMessage, OutboxState

T = TypeVar("T")

SECRET_ENV = "EVALD_RELIABILITY_WEBHOOK_SECRET"
TASK = "arith"

#: Quick settings so that faults meet a busy daemon: a short quiet period, fast ticks, a short lease.
SCHEDULING = """\
quiet_secs = {quiet}
invalid_after_secs = 30.0
rescan_secs = 2.0
tick_secs = 0.05
heartbeat_secs = 1.0
lease_secs = 5.0
shutdown_grace_secs = 5.0
housekeeping_secs = 5.0
"""


@dataclass(frozen=True)
class RunSpec:
    name: str
    root: Path
    extra: str = ""


@dataclass
class Fault:
    """One injected fault and what names it in a log line at or after ``at``: one of ``events``, or a line
    holding one of ``words`` (an error message quoted in any event)."""

    kind: str
    at: datetime
    events: frozenset[str]
    words: tuple[str, ...] = ()


def write_dataset(path: Path, n: int) -> Path:
    subprocess.run(
        [sys.executable, "-m", "inference.toy.problems", "--out", str(path), "--n", str(n), "--seed", "3"],
        check=True,
    )
    return path


def wait_for(check: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value is not None and value is not False:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


@dataclass
class Workspace:
    name: str
    folder: Path
    url: str
    #: Variables the daemon gets beyond this process's (the webhook secret; a database URL with its password).
    env: dict[str, str]
    secrets: list[str]
    secret: Secret
    receiver: WebhookReceiver
    #: What earlier receivers on this port saw (the receiver is closed and started again as a fault).
    past_attempts: list[Attempt] = field(default_factory=list)
    receiver_open: bool = True
    faults: list[Fault] = field(default_factory=list)
    supervisor: Supervisor | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def config_path(self) -> Path:
        return self.folder / "evald.toml"

    @property
    def state_dir(self) -> Path:
        return self.folder / "state"

    @property
    def logs(self) -> Path:
        return self.folder / "logs"

    def daemon_env(self) -> dict[str, str]:
        return {**os.environ, **self.env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}

    def write_config(
        self,
        runs: Sequence[RunSpec],
        *,
        dataset: Path,
        quiet: float = 0.5,
        inference: str = "",
        engine: str = "hf",
        scheduling: str = "",
        state_dir: Path | None = None,
        config_url: str | None = None,
        tasks: str = "",
        max_attempts: int = 100,
    ) -> Path:
        """The config: ``runs``, the arith task (then ``tasks``, more ``[[tasks]]`` tables), one webhook to
        the receiver and an alert on every result. ``max_attempts`` is high by default, so that no job
        runs out of tries under injected kills."""
        run_blocks = "".join(f'[[runs]]\nname = "{r.name}"\nroot = "{r.root}"\n{r.extra}\n\n' for r in runs)
        text = (
            f'[database]\nurl = "{config_url or self.url}"\n\n{run_blocks}'
            f'[[tasks]]\nname = "{TASK}"\ndataset = "{dataset}"\nprompt_field = "problem"\nid_field = "id"\n'
            f'prompt_template = "{{prompt}}="\nmax_new_tokens = 12\nbatch_size = 16\n\n{tasks}'
            f'[inference]\nengine = "{engine}"\nthreads = 1\nmax_attempts = {max_attempts}\n{inference}\n\n'
            f"[scheduling]\n{SCHEDULING.format(quiet=quiet)}{scheduling}\n\n"
            f'[daemon]\nstate_dir = "{state_dir or self.state_dir}"\nlog_format = "json"\n\n'
            # A threshold every result crosses, no cooldown: every stored result sends one notification.
            f'[alerts]\ncooldown_secs = 0\nfeedback_dir = "{self.folder / "feedback"}"\n'
            "[alerts.thresholds.wall_s]\nmin = 1000000\n\n"
            f'[[webhooks]]\nname = "receiver"\nurl = "{self.receiver.url}"\nsecret_env = "{SECRET_ENV}"\n'
            "timeout_secs = 1.0\nconnect_timeout_secs = 0.5\nmax_backoff_secs = 1.0\n"
        )
        self.config_path.write_text(text, encoding="utf-8")
        return self.config_path

    def receiver_down(self) -> None:
        """Nothing listens on the webhook's port any more (connection refused)."""
        self.past_attempts.extend(self.receiver.attempts)
        self.receiver.close()
        self.receiver_open = False

    def receiver_up(self) -> None:
        port = int(self.receiver.url.rsplit(":", 1)[1].split("/")[0])
        self.receiver = WebhookReceiver(self.secret, port=port).start()
        self.receiver_open = True

    @property
    def attempts(self) -> list[Attempt]:
        return [*self.past_attempts, *self.receiver.attempts]

    def database(self) -> Database:
        return Database(self.env.get("EVALD_DATABASE_URL", self.url))

    def upgrade(self) -> None:
        database = self.database()
        try:
            migrations.upgrade(database)
        finally:
            database.dispose()

    def start_daemon(self, restart_secs: float = 0.5) -> Supervisor:
        self.supervisor = Supervisor(self.config_path, self.logs, self.daemon_env(), restart_secs).start()
        self.supervisor.wait_ready()
        return self.supervisor

    def fault(self, kind: str, *events: str, words: tuple[str, ...] = ()) -> Fault:
        fault = Fault(kind, datetime.now(UTC), frozenset(events), words)
        self.faults.append(fault)
        return fault

    def jobs_settled(self, expected_jobs: int) -> bool:
        """At least ``expected_jobs`` jobs, none waiting or running, and the outbox drained."""
        database = self.database()
        try:
            with database.session() as session:
                states = session.scalars(select(EvalJob.state)).all()
                pending = session.scalar(
                    select(func.count())
                    .select_from(OutboxMessage)
                    .where(OutboxMessage.state == OutboxState.PENDING)
                )
        except Exception:
            return False  # the database may be the fault under test
        finally:
            database.dispose()
        open_states = {JobState.PENDING, JobState.DEFERRED, JobState.RUNNING}
        return len(states) >= expected_jobs and not any(s in open_states for s in states) and pending == 0

    def finish(self, figures: Figures, expected: Expected) -> Figures:
        supervisor = self.supervisor
        if supervisor is not None:
            supervisor.stop()
            figures.daemon_starts = supervisor.starts
            figures.daemon_crashes = len(supervisor.unplanned_exits)
        for kind in sorted({f.kind for f in self.faults}):
            figures.faults[kind] = sum(1 for f in self.faults if f.kind == kind)
        database = self.database()
        try:
            count_results(figures, database, expected, self.state_dir)
            count_alerts(figures, database, self.attempts)
        finally:
            database.dispose()
        figures.faults_unlogged = len(unlogged(self.faults, self.log_lines()))
        self.save_cli_outputs()
        figures.secret_leaks.extend(find_secrets(self.folder, self.secrets, skip=self.skipped_paths()))
        figures.seconds = time.monotonic() - self.started
        (self.folder / "figures.json").write_text(json.dumps(figures.as_dict(), indent=1, default=str))
        return figures

    def skipped_paths(self) -> list[Path]:
        """Not outputs: checkpoints and the database itself."""
        return [p for p in self.folder.iterdir() if p.name.startswith(("runs", "evald.db"))]

    def log_lines(self) -> list[tuple[datetime, str, str]]:
        """(time, event, the raw line) of every JSON log line of the daemons and the supervisor."""
        lines = []
        for path in sorted(self.logs.glob("*.log")):
            for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    parsed = json.loads(raw)
                except ValueError:
                    continue
                stamp = parsed.get("timestamp") if isinstance(parsed, dict) else None
                if isinstance(stamp, str):
                    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
                    lines.append((when, str(parsed.get("event")), raw))
        return sorted(lines)

    def save_cli_outputs(self) -> None:
        """What an operator reads (``evald status``, ``alerts``, ``history``), kept to grep for secrets."""
        out = self.folder / "outputs"
        out.mkdir(exist_ok=True)
        commands = {
            "status.json": ["status", "--format", "json"],
            "status.txt": ["status"],
            "alerts.json": ["alerts", "--format", "json"],
            "history-1.txt": ["history", "1"],
        }
        for name, args in commands.items():
            done = subprocess.run(
                [sys.executable, "-m", "daemon", "--config", str(self.config_path), *args],
                capture_output=True,
                text=True,
                timeout=120,
                env=self.daemon_env(),
            )
            (out / name).write_text(done.stdout + done.stderr, encoding="utf-8")


def unlogged(faults: Sequence[Fault], lines: Sequence[tuple[datetime, str, str]]) -> list[Fault]:
    """Faults with no log line naming them: each fault takes the first unused line at or after it that
    names it."""
    used: set[int] = set()
    missing = []
    for fault in sorted(faults, key=lambda f: f.at):
        for index, (when, event, raw) in enumerate(lines):
            names = event in fault.events or any(word in raw for word in fault.words)
            if index not in used and when >= fault.at and names:
                used.add(index)
                break
        else:
            missing.append(fault)
    return missing


def _files_outside(folder: Path, skip: Sequence[Path]) -> list[Path]:
    """The files under ``folder``, never walking into ``skip`` (the checkpoints: a scenario's trees may be
    thousands of folders deep, which ``rglob`` recurses into once per level)."""
    found, stack = [], [folder]
    while stack:
        current = stack.pop()
        try:
            entries = list(current.iterdir())
        except OSError:
            continue
        for path in entries:
            if any(path == s or path.is_relative_to(s) for s in skip):
                continue
            if path.is_dir() and not path.is_symlink():
                stack.append(path)
            elif path.is_file():
                found.append(path)
    return found


def find_secrets(folder: Path, secrets: Sequence[str], *, skip: Sequence[Path] = ()) -> list[str]:
    """``FILE: secret #i`` for every file under ``folder`` (outside ``skip``) holding a secret."""
    needles = [s.encode() for s in secrets if s]
    found = []
    for path in sorted(_files_outside(folder, skip)):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        for i, needle in enumerate(needles):
            if needle in data:
                found.append(f"{path.relative_to(folder)}: secret #{i}")
    return found


def environ_secrets(pid: int, secrets: Sequence[str]) -> list[str]:
    """Secrets readable in ``/proc/PID/environ`` (a worker does not need the webhook secret)."""
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return []
    return [f"/proc/{pid}/environ: secret #{i}" for i, s in enumerate(secrets) if s and s.encode() in data]


def secret_forms(secret: Secret) -> list[str]:
    """The webhook secret as configured (``whsec_...``) and its bare key, in both base64 alphabets."""
    key = secret.reveal()
    return [
        secret.reveal_text(),
        base64.b64encode(key).decode(),
        base64.urlsafe_b64encode(key).decode().rstrip("="),
    ]


@contextmanager
def workspace(
    name: str, root: Path | None, url: str | None = None, extra_env: Mapping[str, str] | None = None
) -> Iterator[Workspace]:
    """A fresh folder (under ``root``, kept; else a temporary one, removed) and a started receiver."""
    folder = Path(tempfile.mkdtemp(prefix=f"evald-reliability-{name}-", dir=root))
    (folder / "logs").mkdir()
    secret = Secret.generate()
    space = Workspace(
        name=name,
        folder=folder,
        url=url or f"sqlite:///{folder / 'evald.db'}",
        env={SECRET_ENV: secret.reveal_text(), **(extra_env or {})},
        secrets=secret_forms(secret),
        secret=secret,
        receiver=WebhookReceiver(secret).start(),
    )
    try:
        yield space
    finally:
        if space.supervisor is not None:
            space.supervisor.stop()
        if space.receiver_open:
            space.receiver.close()
        if root is None:
            shutil.rmtree(folder, ignore_errors=True)
