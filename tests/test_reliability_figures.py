"""The reliability suite's own counting: fault log lines, alert duplicates against re-sends, secret grep."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from daemon.delivery.receiver import Attempt
from reliability.figures import Figures, count_alerts
from reliability.workspace import Fault, find_secrets, unlogged
from storage import migrations
from storage.database import Database
from storage.models import Alert, AlertState, OutboxMessage, OutboxState, Run

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_each_fault_needs_its_own_log_line_at_or_after_it() -> None:
    faults = [
        Fault("daemon SIGKILL", T0, frozenset({"supervisor.daemon_exited"})),
        Fault("daemon SIGKILL", T0 + timedelta(seconds=5), frozenset({"supervisor.daemon_exited"})),
        Fault("disk full", T0 + timedelta(seconds=9), frozenset(), ("No space left on device",)),
    ]
    lines = [
        (T0 - timedelta(seconds=1), "supervisor.daemon_exited", "{}"),  # before any fault: names none
        (T0 + timedelta(seconds=1), "supervisor.daemon_exited", "{}"),
        (T0 + timedelta(seconds=10), "job.failed", '{"error": "[Errno 28] No space left on device"}'),
    ]
    assert [f.at for f in unlogged(faults, lines)] == [T0 + timedelta(seconds=5)]


def attempt(webhook_id: str, at: float, *, status: int = 200, delay_s: float = 0.0) -> Attempt:
    return Attempt(webhook_id, "/hook", {}, b"{}", at, status, None, False, delay_s)


def test_a_resend_after_a_held_answer_is_not_a_duplicate_but_a_second_accepted_answer_is(
    tmp_path: Path,
) -> None:
    database = Database(f"sqlite:///{tmp_path / 'e.db'}")
    migrations.upgrade(database)
    with database.session() as session:
        run = Run(name="r", root="/r")
        session.add(run)
        session.flush()
        alert = Alert(
            fingerprint="f", run_id=run.id, rule="threshold", severity="warning",
            state=AlertState.FIRING, message="m",
        )  # fmt: skip
        session.add(alert)
        session.flush()
        for event_id, state in (("a", OutboxState.DELIVERED), ("b", OutboxState.DELIVERED),
                                ("c", OutboxState.DISABLED), ("d", OutboxState.PENDING)):  # fmt: skip
            session.add(OutboxMessage(alert_id=alert.id, run_id=run.id, endpoint="x", event_id=event_id,
                                      state=state, body="{}"))  # fmt: skip
    attempts = [
        attempt("a", 1.0, status=500),
        attempt("a", 2.0, delay_s=3.0),  # held past the sender's timeout
        attempt("a", 6.0),  # its re-send: expected
        attempt("b", 7.0),
        attempt("b", 8.0),  # accepted again after an answer the sender got: a duplicate
        attempt("c", 9.0, status=410),
    ]
    figures = Figures("t")
    count_alerts(figures, database, attempts)
    database.dispose()
    assert (figures.alerts_fired, figures.alerts_delivered, figures.alerts_disabled) == (4, 2, 1)
    assert (figures.alerts_lost, figures.alerts_duplicated, figures.alerts_resent) == (1, 1, 1)
    assert not figures.passed


def test_secrets_are_found_in_any_output_but_not_in_skipped_folders(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "daemon-1.log").write_text('{"event": "x", "url": "postgresql://u:hunter22@h/db"}\n')
    (tmp_path / "logs" / "clean.log").write_text("nothing here\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "weights.bin").write_bytes(b"hunter22")
    found = find_secrets(tmp_path, ["whsec_abc", "hunter22"], skip=[tmp_path / "runs"])
    assert found == ["logs/daemon-1.log: secret #1"]


def test_poison_late_and_discarded_results_each_fail_a_scenario() -> None:
    assert Figures("clean", poison=6).passed
    for counter in ("poison_unrefused", "poison_misnamed", "late", "discarded"):
        figures = Figures("t", poison=6)
        setattr(figures, counter, 1)
        assert not figures.passed, counter


def test_a_poison_folder_is_named_by_its_own_name_only() -> None:
    from reliability.scenarios.poison_items import POISON_FOLDERS

    patterns = {item.name: item.pattern for item in POISON_FOLDERS}
    line = '{"event": "checkpoint.invalid", "path": "/r/runs/toy/step_-1", "reason": "negative step"}'
    assert patterns["step_-1"].search(line)
    assert not patterns["step_-1"].search(line.replace("step_-1", "step_-10"))
    assert not patterns["step_6400"].search('{"path": "/r/runs/toy/step_64000/l1"}')
    assert patterns["step_6400"].search('{"path": "/r/runs/toy/step_6400/l1"}')
