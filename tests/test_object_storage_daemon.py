"""``evald run`` with a run root in object storage: the toy trainer's checkpoints uploaded to a real S3 API
server on loopback give the same results as the same checkpoints on local disk, in one daemon."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from storage import queries
from tests.conftest import ToyRun
from tests.harness import all_jobs_done, running_daemon, upgraded, wait_for, write_config, write_dataset
from tests.raycluster import RayCluster, ray_cluster
from tests.s3server import S3Server, s3_server, upload
from tests.test_ray_daemon import ray_config

__all__ = ["ray_cluster", "s3_server"]  # the session fixtures, bound here

pytestmark = [pytest.mark.slow, pytest.mark.long]

#: Metrics that measure the machine rather than the model: they differ between any two runs.
TIMING = frozenset({"tokens_per_s", "wall_s", "load_s", "latency_p50_s", "latency_p95_s", "peak_memory_mb"})


def test_results_from_the_store_equal_those_from_local_disk(
    s3_server: S3Server, sqlite_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    dataset = write_dataset(tmp_path / "arith.jsonl", 20)
    bucket = s3_server.bucket()
    client = s3_server.client()
    steps = [toy_run.last_checkpoint.name]
    for name in steps:
        upload(client, bucket, toy_run.path / name, f"toy/{name}")
    run_extra = s3_server.run_section(bucket, tmp_path / "cache", extra="chunk_mb = 1")
    config = write_config(tmp_path, sqlite_url, dataset=dataset, run_extra=run_extra)
    for name in steps:
        shutil.copytree(toy_run.path / name, tmp_path / "run" / name)
    database = upgraded(sqlite_url)
    with running_daemon(config, tmp_path / "daemon.log", env=s3_server.env) as daemon:
        rows = wait_for(
            lambda: all_jobs_done(database, 2 * len(steps)), 240, "every job done", daemon.process
        )
        assert daemon.stop() == 0
    assert {(j.run, j.step, j.state) for j in rows} == {
        (run, int(name.removeprefix("step_")), "succeeded") for run in ("toy", "cloud") for name in steps
    }
    with database.session() as session:
        results = queries.result_rows(session)
    by_run: dict[str, dict[tuple[str, str], float]] = {"toy": {}, "cloud": {}}
    for row in results:
        if row.metric not in TIMING:
            by_run[row.run][(row.checkpoint, row.metric)] = row.value
    assert by_run["cloud"] == by_run["toy"]
    assert len(by_run["toy"]) >= 2 * len(steps)
    log = (tmp_path / "daemon.log").read_text()
    # Each checkpoint downloaded once, from the store's copy in the cache.
    assert log.count('"objects.copied"') == len(steps)
    database.dispose()


def test_an_s3_checkpoint_evaluated_through_ray_with_its_copy_gone_after(
    s3_server: S3Server, ray_cluster: RayCluster, sqlite_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    """The cloud platform's combination: checkpoints in object storage, evaluation on the Ray cluster. The
    probe checks that the Ray nodes see the cache the copy is downloaded into, the rank loads the copy,
    and the copy is evicted once the job is stored."""
    dataset = write_dataset(tmp_path / "arith.jsonl", 8)
    bucket = s3_server.bucket()
    upload(s3_server.client(), bucket, toy_run.last_checkpoint, "toy/step_30")
    cache = tmp_path / "cache"
    run_extra = s3_server.run_section(bucket, cache)
    daemon = ray_config(tmp_path, sqlite_url, ray_cluster, dataset=dataset, run_extra=run_extra)
    database = upgraded(sqlite_url)
    log_path = tmp_path / "daemon.log"
    with running_daemon(daemon.config, log_path, env={**s3_server.env, "HF_HUB_OFFLINE": "1"}) as process:
        rows = wait_for(lambda: all_jobs_done(database, 1), 240, "the cloud job", process.process)
        # The sweep after the job's end evicts its copy (the next pass after the result is stored).
        wait_for(lambda: '"objects.evicted"' in log_path.read_text(), 60, "the copy evicted", process.process)
        assert process.stop() == 0
    assert [(j.run, j.step, j.state, j.attempts) for j in rows] == [("cloud", 30, "succeeded", 1)]
    events = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    shared = [e for e in events if e["event"] == "executor.job_dir_shared"]
    assert len(shared) == 1 and shared[0]["also"] == [str(cache)]
    fetched = [e for e in events if e["event"] == "objects.fetched"]
    assert len(fetched) == 1 and Path(fetched[0]["path"]).is_relative_to(cache / "copies")
    evicted = [e for e in events if e["event"] == "objects.evicted"]
    assert [(e["reason"], Path(e["path"]).name) for e in evicted] == [("used", "step_30")]
    assert not list((cache / "copies").rglob("*.safetensors")) and not list((cache / "pins").iterdir())
    with database.session() as session:
        assert {r.metric for r in queries.result_rows(session)} >= {"accuracy"}
    database.dispose()
