"""Idle cost of the daemon watching one run: CPU share and resident memory over a window (60 s default).

The daemon (``evald run``, SQLite, inotify plus the default 30 s rescan, the default 0.2 s main-loop tick)
watches a run folder that already holds one evaluated checkpoint and receives nothing new. The baseline,
measured the same way at the same time, is an idle Python process that imported the same modules and
sleeps: the ratios say what the daemon's loop, watcher and scheduler cost on top of its imports.

    python -m bench.idle_cost [--seconds 60]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from storage import migrations
from storage.database import Database

CONFIG = """\
[database]
url = "sqlite:///{db}"

[[runs]]
name = "idle"
root = "{root}"

[[tasks]]
name = "arith"
dataset = "{dataset}"

[daemon]
state_dir = "{state}"
log_format = "json"
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evald-idle-") as tmp:
        work = Path(tmp)
        (work / "run").mkdir()
        (work / "data.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
        config = work / "evald.toml"
        config.write_text(
            CONFIG.format(
                db=work / "e.db", root=work / "run", dataset=work / "data.jsonl", state=work / "state"
            )
        )
        database = Database(f"sqlite:///{work / 'e.db'}")
        migrations.upgrade(database)
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
    print(f"window {args.seconds:g} s")
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
