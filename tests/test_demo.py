"""`evald demo`, the README's first command, end to end: real trainer, daemon and workers on SQLite."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest

from daemon.demo import COLLAPSE_AT, DEMO_METRICS
from storage import queries
from storage.database import Database
from tests.deadlines import patient

pytestmark = pytest.mark.slow

#: The serving end of ``evald demo --serve`` on its own (no trainer, no daemon): the demo's workspace and
#: dashboard, then the wait for Ctrl-C; prints the signal that ended it.
SERVE_ONLY = """
import sys
from pathlib import Path
import signal
from daemon import demo
from storage import migrations
from storage.database import Database


workdir = Path(sys.argv[1])
config = demo.write_workspace(workdir)
database = Database(f"sqlite:///{workdir / 'evald.db'}")
migrations.upgrade(database)
database.dispose()
server = demo._serve(config, 0, sys.stderr)
try:
    got = demo.serve_until_interrupted(server.url, sys.stderr)
finally:
    server.stop()
print(signal.Signals(got).name)
"""
#: How long the demo may take to end once interrupted (it takes about 1 s: the web server's and the
#: webhook receiver's shutdown polls), generous for a loaded machine.
EXIT_WITHIN_S = 30


def _serve_until_interrupted(demo: subprocess.Popen[str]) -> tuple[str, str]:
    """Wait for the demo to say it serves until Ctrl-C, check its dashboard and API answer, press Ctrl-C;
    the demo's stdout and stderr."""
    assert demo.stderr is not None
    seen: list[str] = []
    url = None
    for line in demo.stderr:
        seen.append(line)
        match = re.search(r"dashboard: (\S+) \(serving until Ctrl-C\)", line)
        if match:
            url = match.group(1)
            break
    assert url is not None, "".join(seen)[-3000:]
    page = httpx.get(url, timeout=30)
    assert page.status_code == 200 and "<html" in page.text.lower()
    runs = httpx.get(f"{url.rstrip('/')}/api/v1/runs", timeout=30).json()
    assert "toy" in json.dumps(runs)
    # Still serving a moment later: it waits for Ctrl-C, not for the evaluation to end.
    assert demo.poll() is None
    demo.send_signal(signal.SIGINT)
    out, rest = demo.communicate(timeout=patient(60))
    return out, "".join(seen) + rest


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_serving_ends_on_ctrl_c_even_where_sigint_was_inherited_ignored(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """A shell without job control (``make test &``, CI) starts commands with SIGINT ignored; Python then
    raises no KeyboardInterrupt, and the demo used to serve on after Ctrl-C until it was killed. Here the
    dashboard also holds a browser's idle keep-alive connection, and the signal comes the moment the
    line is printed."""
    script = tmp_path / "serve_only.py"
    script.write_text(SERVE_ONLY)
    demo = subprocess.Popen(
        ["bash", "-c", 'trap "" INT; exec "$0" "$@"', sys.executable, str(script), str(tmp_path / "demo")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = threading.Timer(patient(120), demo.kill)
    deadline.start()
    try:
        assert demo.stderr is not None
        seen = []
        for line in demo.stderr:
            seen.append(line)
            match = re.search(r"dashboard: (\S+) \(serving until Ctrl-C\)", line)
            if match:
                break
        assert match, "".join(seen)[-3000:]
        with httpx.Client(timeout=30) as browser:
            assert browser.get(match.group(1)).status_code == 200
            demo.send_signal(sig)
            out, err = demo.communicate(timeout=patient(EXIT_WITHIN_S))
    finally:
        deadline.cancel()
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, "".join(seen) + err
    assert out.strip() == sig.name


@pytest.mark.long
def test_demo_json_shows_learning_with_every_checkpoint_evaluated_once(tmp_path: Path) -> None:
    """The demo with --serve: the report, then the dashboard until Ctrl-C."""
    workdir = tmp_path / "demo"
    demo = subprocess.Popen(
        [sys.executable, "-m", "daemon", "demo", "--workdir", str(workdir), "--json", "--serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # A demo that hangs before it serves is killed, which ends the read of its stderr.
    deadline = threading.Timer(patient(300), demo.kill)
    deadline.start()
    try:
        out, err = _serve_until_interrupted(demo)
    finally:
        deadline.cancel()
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, err[-3000:]
    report = json.loads(out)
    steps = [c["step"] for c in report["checkpoints"]]
    assert steps == sorted(steps) and len(steps) == 8
    for checkpoint in report["checkpoints"]:
        metrics = checkpoint["metrics"]
        # A mean over no samples says so (no number): the correct answers' length where none was right,
        # the wrong ones' where all were.
        undefined = {"response_length_correct"} if metrics["accuracy"] == 0 else set()
        undefined |= {"response_length_incorrect"} if metrics["accuracy"] == 1 else set()
        assert set(metrics) == set(DEMO_METRICS), checkpoint["step"]
        assert {name for name, v in metrics.items() if v is None} == undefined, checkpoint["step"]
    accuracy = [c["metrics"]["accuracy"] for c in report["checkpoints"]]
    learnt = steps.index(COLLAPSE_AT)
    assert accuracy[learnt] - accuracy[0] >= 0.5, accuracy
    # Then the learning rate jumps: the run collapses, and the collapse is an alert, delivered and verified.
    assert accuracy[learnt + 1] < accuracy[learnt] - 0.5, accuracy
    alerts = report["alerts"]
    collapse = [a for a in alerts if (a["rule"], a["metric"]) == ("drop_from_best", "accuracy")]
    assert collapse and collapse[0]["step"] == steps[learnt + 1] and collapse[0]["state"] == "firing"
    assert all(a["delivered"] and a["signature_verified"] for a in alerts), alerts
    # Nothing fired while the run was healthy.
    assert all(a["step"] > COLLAPSE_AT for a in alerts), alerts
    status = json.loads((workdir / "feedback" / "toy.json").read_text())
    assert status["best"]["step"] == COLLAPSE_AT and status["rollback_step"] == COLLAPSE_AT
    last = report["checkpoints"][learnt]["metrics"]
    # The built-in reward is the math grade; a model that learnt the task is sure of its tokens.
    assert last["reward"] == last["accuracy"]
    assert 0 < last["entropy"] < report["checkpoints"][0]["metrics"]["entropy"]
    # What the model answered at its best step, as a user reads it.
    config = str(workdir / "evald.toml")
    query = ("--run", "toy", "--step", str(COLLAPSE_AT), "--task", "arith", "--format", "json")
    shown = subprocess.run(
        [sys.executable, "-m", "daemon", "--config", config, "samples", *query],
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    assert shown.returncode == 0, shown.stderr
    samples = json.loads(shown.stdout)["samples"]
    assert len(samples) == 100
    assert {s["prompt_id"].split("/")[1] for s in samples} == {"arithmetic"}
    assert sum(s["correct"] for s in samples) == round(last["accuracy"] * 100)
    assert all(s["reward"] == float(s["correct"]) and s["entropy"] is not None for s in samples)
    database = Database(f"sqlite:///{workdir / 'evald.db'}")
    try:
        with database.session() as session:
            counts = Counter((r.checkpoint, r.metric) for r in queries.result_rows(session))
    finally:
        database.dispose()
    assert len(counts) == 8 * len(DEMO_METRICS) and set(counts.values()) == {1}
    # The daemon stopped on SIGTERM and said so.
    assert '"daemon.stopped"' in (workdir / "daemon.log").read_text()
