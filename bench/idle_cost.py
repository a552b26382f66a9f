"""Idle cost of the daemon: CPU share and resident memory over a window (60 s default).

The daemon (``evald run``, SQLite, the default 30 s rescan and 0.2 s main-loop tick) watches ``--runs``
run folders, each holding ``--checkpoints`` settled checkpoints, and receives nothing new; ``--watch-mode``
is inotify or poll. The baseline, measured the same way at the same time, is an idle Python process that
imported the same modules and sleeps: the ratios say what the daemon's loop, watchers, rescans and
scheduler cost on top of its imports.

    python -m bench.idle_cost [--seconds 60] [--runs 1] [--checkpoints 0] [--watch-mode inotify|poll]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from storage import migrations, queries
from storage.database import Database
from storage.models import CheckpointState

CONFIG = """\
[database]
url = "sqlite:///{db}"

[[tasks]]
name = "arith"
dataset = "{dataset}"

[daemon]
state_dir = "{state}"
log_format = "json"
"""
RUN = """
[[runs]]
name = "{name}"
root = "{root}"
watch_mode = "{mode}"
layout = "hf"
"""

BASELINE = "import daemon.service, daemon.cli, time; time.sleep(1e6)"


def sample(processes: dict[str, psutil.Process], seconds: float) -> dict[str, tuple[float, float]]:
    """CPU share (% of one core) and peak RSS (MiB) of each process over ``seconds``."""
    start = {k: p.cpu_times() for k, p in processes.items()}
    peak = dict.fromkeys(processes, 0.0)
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        for key, process in processes.items():
            peak[key] = max(peak[key], process.memory_info().rss / 2**20)
        time.sleep(1.0)
    elapsed = time.monotonic() - began
    out = {}
    for key, process in processes.items():
        end = process.cpu_times()
        used = (end.user - start[key].user) + (end.system - start[key].system)
        out[key] = (100.0 * used / elapsed, peak[key])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--checkpoints", type=int, default=0, help="settled checkpoints per run")
    parser.add_argument("--watch-mode", choices=("inotify", "poll"), default="inotify")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evald-idle-") as tmp:
        work = Path(tmp)
        (work / "data.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
        config = work / "evald.toml"
        text = CONFIG.format(db=work / "e.db", dataset=work / "data.jsonl", state=work / "state")
        database = Database(f"sqlite:///{work / 'e.db'}")
        migrations.upgrade(database)
        for r in range(args.runs):
            root = work / "runs" / f"run{r:03d}"
            root.mkdir(parents=True)
            text += RUN.format(name=f"run{r:03d}", root=root, mode=args.watch_mode)
            with database.session() as session:
                run_id = queries.ensure_run(session, f"run{r:03d}", str(root))
                for c in range(args.checkpoints):
                    folder = root / f"step_{c}"
                    folder.mkdir()
                    (folder / "config.json").write_text("{}")
                    queries.record_checkpoint(
                        session,
                        run_id=run_id,
                        path=str(folder),
                        name=folder.name,
                        step=c,
                        epoch=None,
                        layout="hf",
                        state=CheckpointState.READY,
                    )
        config.write_text(text)
        database.dispose()
        log = (work / "daemon.log").open("wb")
        daemon = subprocess.Popen(
            [sys.executable, "-m", "daemon", "--config", str(config), "run"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        baseline = subprocess.Popen([sys.executable, "-c", BASELINE])
        try:
            while b"daemon.ready" not in (work / "daemon.log").read_bytes():
                time.sleep(0.1)
            time.sleep(2.0)  # let start-up work settle before the window opens
            result = sample(
                {"daemon": psutil.Process(daemon.pid), "baseline": psutil.Process(baseline.pid)}, args.seconds
            )
        finally:
            daemon.terminate()
            baseline.kill()
            daemon.wait(timeout=60)
            baseline.wait()
            log.close()
    (cpu, rss), (base_cpu, base_rss) = result["daemon"], result["baseline"]
    print(f"window {args.seconds:g} s, {args.runs} runs x {args.checkpoints} checkpoints, {args.watch_mode}")
    print(f"daemon    cpu {cpu:6.2f} % of a core   peak rss {rss:7.1f} MiB")
    print(
        f"baseline  cpu {base_cpu:6.2f} % of a core   peak rss {base_rss:7.1f} MiB   (same imports, asleep)"
    )
    print(
        f"ratio daemon/baseline: cpu {cpu / max(base_cpu, 0.01):.1f}x (baseline floored at 0.01 %), "
        f"rss {rss / base_rss:.2f}x"
    )


if __name__ == "__main__":
    main()
