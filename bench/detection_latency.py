"""Detection latency: from the moment a checkpoint is complete to its job entering ``running``.

Runs the real daemon (``evald run`` in its own process, SQLite) over a run folder into which checkpoints
are written one at a time, the way ``save_pretrained`` writes them (config, then weights), each after the
previous one's job started. Four set-ups: quiet period or marker file, each with inotify events or with
the periodic rescan alone. The baseline is the rescan alone; the ratio is its p95 over inotify's.

The worker is replaced by ``/bin/true`` (``inference.python``): it exits at once, so evaluation time never
gates the next checkpoint. What is measured is the daemon's own work: notice, check, wait out the quiet
period, record, enqueue, claim.

    python -m bench.detection_latency [--n 20] [--quiet 1.0] [--rescan 5.0]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from storage import migrations
from storage.database import Database
from storage.models import Checkpoint, EvalJob

CONFIG = """\
[database]
url = "sqlite:///{db}"

[[runs]]
name = "bench"
root = "{root}"
watch_mode = "{watch}"
{marker}

[[tasks]]
name = "arith"
dataset = "{dataset}"

[inference]
python = "/bin/true"

[scheduling]
quiet_secs = {quiet}
rescan_secs = {rescan}

[daemon]
state_dir = "{state}"
log_format = "json"
"""


def _toy_checkpoint(directory: Path) -> list[tuple[str, bytes]]:
    """The files of a real (untrained) toy checkpoint, in the order save_pretrained writes them."""
    from inference.toy.tokenizer import build_tokenizer
    from inference.toy.trainer import build_model

    tokenizer = build_tokenizer()
    build_model(tokenizer).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    order = {"config.json": 0, "generation_config.json": 1, "model.safetensors": 2}
    files = sorted(directory.iterdir(), key=lambda p: (order.get(p.name, 3), p.name))
    return [(p.name, p.read_bytes()) for p in files]


def _started_at(database: Database, name: str) -> datetime | None:
    with database.session() as session:
        return session.scalar(
            select(EvalJob.started_at).join(Checkpoint).where(Checkpoint.name == name, EvalJob.attempts >= 1)
        )


def measure(
    workdir: Path,
    files: list[tuple[str, bytes]],
    *,
    n: int,
    watch: str,
    marker: bool,
    quiet: float,
    rescan: float,
) -> list[float]:
    workdir.mkdir(parents=True)
    root, dataset = workdir / "run", workdir / "data.jsonl"
    root.mkdir()
    dataset.write_text('{"problem": "1+1", "answer": "2"}\n')
    config = workdir / "evald.toml"
    config.write_text(
        CONFIG.format(
            db=workdir / "evald.db",
            root=root,
            watch=watch,
            marker='marker = "COMPLETE"' if marker else "",
            dataset=dataset,
            quiet=quiet,
            rescan=rescan,
            state=workdir / "state",
        )
    )
    database = Database(f"sqlite:///{workdir / 'evald.db'}")
    migrations.upgrade(database)
    log = (workdir / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "daemon", "--config", str(config), "run"], stdout=log, stderr=subprocess.STDOUT
    )
    latencies = []
    try:
        while b"daemon.ready" not in (workdir / "daemon.log").read_bytes():
            time.sleep(0.05)
        for step in range(1, n + 1):
            target = root / f"step_{step}"
            target.mkdir()
            for name, data in files:
                (target / name).write_bytes(data)
            if marker:
                (target / "COMPLETE").touch()
            complete = datetime.now(UTC)
            deadline = time.monotonic() + rescan + quiet * 3 + 30
            while (started := _started_at(database, target.name)) is None:
                if time.monotonic() > deadline or daemon.poll() is not None:
                    raise RuntimeError(f"step {step} was never claimed; see {workdir / 'daemon.log'}")
                time.sleep(0.02)
            latencies.append((started - complete).total_seconds())
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        log.close()
        database.dispose()
    return latencies


def _p(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20, help="checkpoints per set-up")
    parser.add_argument("--quiet", type=float, default=1.0, help="quiet period, seconds")
    parser.add_argument("--rescan", type=float, default=5.0, help="rescan interval, seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evald-bench-") as tmp:
        files = _toy_checkpoint(Path(tmp) / "source")
        rows = {}
        for watch in ("inotify", "poll"):
            for marker in (False, True):
                label = f"{'marker' if marker else 'quiet ' + format(args.quiet, 'g') + ' s'}, {watch}"
                values = measure(
                    Path(tmp) / f"{watch}-{marker}",
                    files,
                    n=args.n,
                    watch=watch,
                    marker=marker,
                    quiet=args.quiet,
                    rescan=args.rescan,
                )
                rows[(watch, marker)] = values
                p50, p95 = _p(values, 50), _p(values, 95)
                worst = max(values)
                print(f"{label:<22} n={len(values):<3} p50={p50:6.3f} s  p95={p95:6.3f} s  max={worst:.3f} s")
        for marker in (False, True):
            ratio = _p(rows[("poll", marker)], 95) / _p(rows[("inotify", marker)], 95)
            what = "marker" if marker else "quiet period"
            print(f"ratio p95 rescan-only / inotify ({what}): {ratio:.1f}x")
        target = 1.0 + args.quiet
        print(
            f"target p95 < {target:g} s (1 s + quiet period) with inotify: "
            f"{'met' if _p(rows[('inotify', False)], 95) < target else 'NOT met'}"
        )


if __name__ == "__main__":
    main()
