"""Object storage: the cost of a rescan of an ``s3://`` run, and the download of a due checkpoint.

Against a real S3 API server on loopback (moto's server mode, as the tests use), in one process:

* **Rescan.** ``--checkpoints`` HF checkpoints (config, a small safetensors file, a tokenizer file: 3
  objects each) settled in the database. A rescan of the ``s3://`` run (listing the prefix page by page,
  bringing the mirror in step, judging the mirror) is timed against a rescan of the same checkpoints on
  local disk (the baseline), alternating, ``--repeats`` times; medians and the requests made.
* **Download.** One checkpoint of ``--shards`` shards of ``--shard-mb`` MB: evald's local copy (parallel
  ranged GETs across all files, size and ETag checked; and with ``verify_etags = false``) against
  boto3's own transfer manager (s3transfer, what ``aws s3 cp --recursive`` uses: one manager, every file
  submitted at once) with the same concurrency and chunk size (it checks no digest), alternating;
  throughput and the ratios.

    python -m bench.object_storage [--checkpoints 1000] [--repeats 5] [--shards 4] [--shard-mb 64]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from daemon.config import RunConfig, SchedulingConfig
from daemon.watching import Discovery, WatchedRun, object_cache
from storage import migrations, queries
from storage.database import Database
from tests.s3server import ACCESS_ENV, SECRET_ENV, S3Server, _start

CONCURRENCY = 8
CHUNK_MB = 16


def _safetensors(size: int) -> bytes:
    header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + os.urandom(size)


def _checkpoint_files() -> dict[str, bytes]:
    return {
        "config.json": json.dumps({"model_type": "llama"}).encode(),
        "model.safetensors": _safetensors(256),
        "tokenizer.model": b"x" * 64,
    }


def _discovery(database: Database, config: RunConfig) -> Discovery:
    with database.session() as session:
        run_id = queries.ensure_run(session, config.name, str(config.root))
    run = WatchedRun(config, run_id, ("t",))
    return Discovery(database, [run], SchedulingConfig(quiet_secs=0.0, invalid_after_secs=600.0))


def rescans(server: S3Server, work: Path, checkpoints: int, repeats: int) -> dict[str, Any]:
    client, bucket = server.client(), server.bucket()
    files = _checkpoint_files()
    local = work / "local"
    jobs = []
    for step in range(checkpoints):
        for name, data in files.items():
            path = local / f"step_{step}" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            jobs.append((f"run/step_{step}/{name}", data))
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda j: client.put_object(Bucket=bucket, Key=j[0], Body=j[1]), jobs))
    database = Database(f"sqlite:///{work / 'bench.db'}")
    migrations.upgrade(database)
    s3 = RunConfig.model_validate(
        {"name": "s3", "root": f"s3://{bucket}/run", "s3": server.settings(work / "cache")}
    )
    disk = RunConfig(name="disk", root=local)
    object_discovery, local_discovery = _discovery(database, s3), _discovery(database, disk)
    started = time.monotonic()
    object_discovery.scan()
    object_discovery.scan()  # the quiet period (0 s) passed: settled
    first = time.monotonic() - started
    local_discovery.scan()
    local_discovery.scan()
    with database.session() as session:
        ready = sum(1 for c in queries.checkpoint_rows(session) if c.state == "ready")
    assert ready == 2 * checkpoints, ready
    times: dict[str, list[float]] = {"s3": [], "disk": []}
    for _ in range(repeats):
        for name, discovery in (("disk", local_discovery), ("s3", object_discovery)):
            started = time.monotonic()
            discovery.scan()
            times[name].append(time.monotonic() - started)
    database.dispose()
    s3_median, disk_median = statistics.median(times["s3"]), statistics.median(times["disk"])
    return {
        "checkpoints": checkpoints,
        "objects": len(jobs),
        "list_requests_per_rescan": -(-len(jobs) // 1000) + 1,
        "first_pass_s": round(first, 3),
        "rescan_s3_s": round(s3_median, 3),
        "rescan_disk_s": round(disk_median, 3),
        "ratio": round(s3_median / disk_median, 2),
    }


def downloads(server: S3Server, work: Path, shards: int, shard_mb: int, repeats: int) -> dict[str, Any]:
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    client, bucket = server.client(), server.bucket()
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    for name in names:
        client.put_object(Bucket=bucket, Key=f"run/step_1/{name}", Body=_safetensors(shard_mb * 1024 * 1024))
    client.put_object(Bucket=bucket, Key="run/step_1/config.json", Body=b"{}")
    size = sum(o["Size"] for o in client.list_objects_v2(Bucket=bucket, Prefix="run/step_1/")["Contents"])
    config = RunConfig.model_validate(
        {
            "name": "dl",
            "root": f"s3://{bucket}/run",
            "s3": server.settings(
                work / "dlcache", max_concurrency=CONCURRENCY, chunk_mb=CHUNK_MB, timeout_secs=60.0
            ),
        }
    )
    transfer = TransferConfig(
        max_concurrency=CONCURRENCY,
        multipart_chunksize=CHUNK_MB * 1024 * 1024,
        multipart_threshold=CHUNK_MB * 1024 * 1024,
    )
    unverified = RunConfig.model_validate(
        {
            "name": "dl",
            "root": f"s3://{bucket}/run",
            "s3": server.settings(
                work / "dlcache",
                max_concurrency=CONCURRENCY,
                chunk_mb=CHUNK_MB,
                timeout_secs=60.0,
                verify_etags=False,
            ),
        }
    )
    times: dict[str, list[float]] = {"evald": [], "evald_unverified": [], "s3transfer": []}
    # Both with a warm client and connection pool (the daemon keeps its client between jobs); the first
    # round is not counted.
    for repeat in range(repeats + 1):
        shutil.rmtree(work / "dlcache", ignore_errors=True)
        started = time.monotonic()
        copy = object_cache.local_copy(config, config.root / "step_1")
        if repeat:
            times["evald"].append(time.monotonic() - started)
        assert sum(p.stat().st_size for p in copy.iterdir()) == size
        shutil.rmtree(work / "dlcache", ignore_errors=True)
        started = time.monotonic()
        copy = object_cache.local_copy(unverified, unverified.root / "step_1")
        if repeat:
            times["evald_unverified"].append(time.monotonic() - started)
        target = work / "s3transfer"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        started = time.monotonic()
        with TransferManager(client, transfer) as manager:
            futures = [
                manager.download(bucket, f"run/step_1/{name}", str(target / name))
                for name in [*names, "config.json"]
            ]
            for future in futures:
                future.result()
        if repeat:
            times["s3transfer"].append(time.monotonic() - started)
    evald_s, baseline_s = statistics.median(times["evald"]), statistics.median(times["s3transfer"])
    plain_s = statistics.median(times["evald_unverified"])
    return {
        "bytes": size,
        "evald_mb_s": round(size / 1e6 / evald_s, 1),
        "evald_unverified_mb_s": round(size / 1e6 / plain_s, 1),
        "s3transfer_mb_s": round(size / 1e6 / baseline_s, 1),
        "ratio": round(baseline_s / evald_s, 2),
        "ratio_unverified": round(baseline_s / plain_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mb", type=int, default=64)
    args = parser.parse_args(argv)
    server = _start()
    os.environ.update({ACCESS_ENV: server.access_key, SECRET_ENV: server.secret_key})
    try:
        with tempfile.TemporaryDirectory(prefix="evald-bench-s3-") as tmp:
            work = Path(tmp)
            listing = rescans(server, work, args.checkpoints, args.repeats)
            print(json.dumps({"rescan": listing}))
            download = downloads(server, work, args.shards, args.shard_mb, args.repeats)
            print(json.dumps({"download": download}))
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)
    print(
        f"rescan of {listing['checkpoints']} checkpoints ({listing['objects']} objects): "
        f"s3 {listing['rescan_s3_s']} s vs local disk {listing['rescan_disk_s']} s ({listing['ratio']}x)"
    )
    print(
        f"download of {download['bytes'] / 1e6:.0f} MB: evald {download['evald_mb_s']} MB/s (ETags checked;"
        f" {download['evald_unverified_mb_s']} MB/s unchecked) vs s3transfer {download['s3transfer_mb_s']}"
        f" MB/s: ratio {download['ratio']} ({download['ratio_unverified']} unchecked), >1 is faster"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
