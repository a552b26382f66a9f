"""Downloading an ``s3://`` checkpoint off the daemon's loop, and its copy's life: pinned while a job uses
it, evicted after use unless another job of the same checkpoint still waits.

Against a real S3 API server (moto's, tests/s3server.py) and the real runner with real worker processes
on the toy model: the store is paused (SIGSTOP) under a claimed job's download, and the loop's passes
stay short, its lease stays fresh and another run's job is claimed and evaluated meanwhile; the job goes
back to the queue without spending an attempt and is evaluated once the store answers.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from daemon.config import Config, DaemonConfig, InferenceConfig, RunConfig, SchedulingConfig, TaskConfig
from daemon.running.fetches import parse_pin, pin_key
from daemon.running.runner import JobRunner
from daemon.watching import object_cache
from inference.toy.problems import PROMPT_TEMPLATE, held_out_problems, write_jsonl
from storage import queries
from storage.database import Database
from storage.models import CheckpointState
from tests.conftest import ToyRun
from tests.deadlines import Deadline
from tests.forkserver import worker_python
from tests.s3server import S3Server, s3_server, upload
from tests.test_object_storage import MB, _credentials, big_checkpoint, s3_run

__all__ = ["_credentials", "big_checkpoint", "s3_server"]  # the fixtures, bound here (credentials autouse)


def test_pin_names_round_trip() -> None:
    job = queries.ClaimedJob(
        id=41, task="t", stage="full", attempts=3, checkpoint_id=1, checkpoint_path="/x",
        layout="hf", step=1, run="r", run_id=1,
    )  # fmt: skip
    assert parse_pin(pin_key(job)) == (41, 3)
    assert parse_pin("job-41") is None and parse_pin("other-1-2") is None and parse_pin("job-x-1") is None


def test_a_pinned_copy_is_never_evicted_for_room(
    s3_server: S3Server, big_checkpoint: Path, tmp_path: Path
) -> None:
    client, bucket = s3_server.client(), s3_server.bucket()
    # Room for one such checkpoint (about 6 MB): the second needs the first's room.
    run = s3_run(s3_server, bucket, tmp_path / "cache", chunk_mb=1, cache_max_gb=10 / 1024)
    assert run.s3 is not None
    cache = run.s3.cache_dir
    for step in (100, 200):
        upload(client, bucket, big_checkpoint, f"s3run/step_{step}")
    first = object_cache.local_copy(run, run.root / "step_100", pin="job-1-1")
    assert object_cache.pins(cache) == [object_cache.Pin("job-1-1", first, str(run.root / "step_100"))]
    with pytest.raises(object_cache.CopyFailed, match="copies that running jobs use") as caught:
        object_cache.local_copy(run, run.root / "step_200", pin="job-2-1")
    assert caught.value.transient
    assert first.is_dir() and object_cache.manifest_path(first).is_file()
    assert object_cache.evict_unused(cache, first) == "held"
    object_cache.release(cache, "job-1-1")
    object_cache.release(cache, "job-2-1")
    with capture_logs() as logs:
        second = object_cache.local_copy(run, run.root / "step_200", pin="job-2-1")
    assert [(e["event"], e.get("reason")) for e in logs] == [
        ("objects.evicted", "room"),
        ("objects.copied", None),
    ]
    assert not first.exists() and second.is_dir()
    # The loop never waits for the cache: while a download holds it, eviction says so and is tried later.
    object_cache.release(cache, "job-2-1")
    with object_cache._locked(cache / "copies.lock"):
        assert object_cache.evict_unused(cache, second) == "busy"
    assert object_cache.evict_unused(cache, second) == "evicted"
    assert not second.exists() and not object_cache.manifest_path(second).exists()


def test_a_stopped_download_ends_within_a_chunk(
    s3_server: S3Server, big_checkpoint: Path, tmp_path: Path
) -> None:
    client, bucket = s3_server.client(), s3_server.bucket()
    run = s3_run(s3_server, bucket, tmp_path / "cache", chunk_mb=1)
    upload(client, bucket, big_checkpoint, "s3run/step_100")
    stop = threading.Event()
    stop.set()
    with pytest.raises(object_cache.CopyFailed, match="stopped") as caught:
        object_cache.local_copy(run, run.root / "step_100", stop=stop)
    assert caught.value.transient
    copies = run.s3.copy_root(run.url) if run.s3 is not None and run.url is not None else None
    assert copies is not None and not any(copies.iterdir())  # no partial copy left


# --- the runner -------------------------------------------------------------------------------------------


def _config(tmp_path: Path, cloud: RunConfig) -> Config:
    dataset = tmp_path / "data.jsonl"
    write_jsonl(held_out_problems(4, seed=1), dataset)
    tasks = tuple(
        TaskConfig(
            name=name, dataset=dataset, prompt_template=PROMPT_TEMPLATE, id_field="id", max_new_tokens=8
        )
        for name in ("arith", "arith2")
    )
    return Config(
        runs=(RunConfig(name="loc", root=tmp_path / "run"), cloud),
        tasks=tasks,
        inference=InferenceConfig.model_validate(
            {"threads": 1, "engine": "hf", "max_attempts": 1, "python": worker_python()}
        ),
        scheduling=SchedulingConfig(heartbeat_secs=0.5, lease_secs=30.0),
        daemon=DaemonConfig(state_dir=tmp_path / "state"),
    )


def _enqueue(database: Database, run: RunConfig, path: Path, step: int, tasks: list[str]) -> None:
    with database.session() as s:
        run_id = queries.ensure_run(s, run.name, str(run.root))
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=str(path),
            name=path.name,
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=tasks)


def _jobs(database: Database) -> dict[tuple[str, str], queries.JobRow]:
    with database.session() as s:
        return {(j.run, j.task): j for j in queries.job_rows(s)}


def _heartbeat(database: Database, run: str) -> object:
    from sqlalchemy import select

    from storage.models import Checkpoint, EvalJob, Run

    with database.session() as s:
        return s.execute(
            select(EvalJob.heartbeat_at)
            .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
            .join(Run, Checkpoint.run_id == Run.id)
            .where(Run.name == run, EvalJob.state == "running")
        ).scalar_one_or_none()


@pytest.mark.slow
def test_a_download_never_holds_the_loop_and_its_copy_goes_after_use(
    s3_server: S3Server, database: Database, toy_run: ToyRun, tmp_path: Path
) -> None:
    client, bucket = s3_server.client(), s3_server.bucket()
    upload(client, bucket, toy_run.last_checkpoint, "toy/step_30")
    cloud = s3_run(s3_server, bucket, tmp_path / "cache", name="toy", chunk_mb=1, timeout_secs=1.0)
    assert cloud.s3 is not None
    config = _config(tmp_path, cloud)
    (tmp_path / "run").mkdir()
    _enqueue(database, cloud, cloud.root / "step_30", 30, ["arith", "arith2"])
    runner = JobRunner(config, database, "test:1")
    longest, passes = 0.0, 0
    with capture_logs() as events:
        with s3_server.paused():
            assert runner.claim_and_start()
            (fetching,) = runner.fetching
            assert not runner.running and not runner.has_capacity()  # the download holds the slot
            (row,) = [r for r in _jobs(database).values() if r.id == fetching]
            url = f"{cloud.url}/step_30"
            assert (row.state, row.executor_state) == ("running", f"downloading its checkpoint from {url}")
            beats = set()
            # The store hangs under the download (1 s a try): the loop's passes stay short, the lease fresh.
            deadline = Deadline(60)
            while runner.fetching and not deadline.expired():
                started = time.monotonic()
                runner.poll()
                longest, passes = max(longest, time.monotonic() - started), passes + 1
                beats.add(_heartbeat(database, "toy"))
                time.sleep(0.05)
            assert not runner.fetching, "the download never gave up on the paused store"
            rows = _jobs(database)
            deferred = [r for r in rows.values() if r.error_kind == "store_unavailable"]
            assert [(r.state, r.attempts) for r in deferred] == [("pending", 0)]
            assert len(beats - {None}) >= 2, "the lease was not renewed while the download waited"
            # Its run rests; another run's checkpoint is claimed and evaluated meanwhile.
            local = tmp_path / "run" / "step_15"
            shutil.copytree(toy_run.path / "step_15", local)
            _enqueue(database, config.runs[0], local, 15, ["arith"])
            assert runner.claim_and_start()
            (claimed,) = runner.running.values()
            assert claimed.job.run == "loc"
            while runner.running and not deadline.expired():
                runner.poll()
                time.sleep(0.05)
            assert _jobs(database)[("loc", "arith")].state == "succeeded"
        # The store answers again: both tasks of the cloud checkpoint are evaluated from one copy, kept
        # while the second still waits and evicted after it.
        kept_between = None
        deadline = Deadline(240)
        while not deadline.expired():
            runner.poll()
            rows = _jobs(database)
            done = [rows[("toy", t)].state == "succeeded" for t in ("arith", "arith2")]
            if all(done):
                break
            copies = object_cache.copies_in(cloud.s3.cache_dir / "copies")
            if any(done) and kept_between is None:
                kept_between = [c[2].name for c in copies]
            if runner.has_capacity():
                runner.claim_and_start()
            time.sleep(0.05)
        runner.poll()  # the sweep after the last job's end
    rows = _jobs(database)
    assert {k: (r.state, r.attempts) for k, r in rows.items()} == {
        ("toy", "arith"): ("succeeded", 1),
        ("toy", "arith2"): ("succeeded", 1),
        ("loc", "arith"): ("succeeded", 1),
    }
    # The loop kept turning while the download waited on the paused store: a pass held by the download
    # would last its whole try (1 s a try, three tries), so the passes would be a handful. Counted, not
    # timed: a loaded machine stretched one pass to 2.4 s, and the loop still turned dozens of times.
    assert passes >= 10, f"{passes} loop passes during the download (the longest {longest:.2f} s)"
    assert kept_between == ["step_30"], "the copy was not kept for the checkpoint's other job"
    assert object_cache.copies_in(cloud.s3.cache_dir / "copies") == []
    assert object_cache.pins(cloud.s3.cache_dir) == []
    names = [e["event"] for e in events]
    assert names.count("objects.copy_deferred") == 1 and names.count("objects.copied") == 1
    assert names.count("objects.fetched") == 2 and names.count("objects.copy_reused") == 1
    evicted = [e for e in events if e["event"] == "objects.evicted"]
    assert [(e["reason"], Path(e["path"]).name) for e in evicted] == [("used", "step_30")]
    assert fetching in {r.id for r in rows.values()}
    runner.shutdown(1.0)


def _uneven_multipart(client: object, bucket: str, key: str) -> None:
    """An object uploaded in parts of 5, 6 and 1 MB: S3 takes parts of any size but the last's, and its
    ETag is then no digest a reader can recompute from the first part's size (as with a store whose ETags
    are not MD5s): every download of it mismatches."""
    data = bytes(range(256)) * (12 * MB // 256)
    started = client.create_multipart_upload(Bucket=bucket, Key=key)  # type: ignore[attr-defined]
    parts = []
    for number, (start, end) in enumerate(((0, 5 * MB), (5 * MB, 11 * MB), (11 * MB, 12 * MB)), start=1):
        part = client.upload_part(  # type: ignore[attr-defined]
            Bucket=bucket, Key=key, UploadId=started["UploadId"], PartNumber=number, Body=data[start:end]
        )
        parts.append({"PartNumber": number, "ETag": part["ETag"]})
    client.complete_multipart_upload(  # type: ignore[attr-defined]
        Bucket=bucket, Key=key, UploadId=started["UploadId"], MultipartUpload={"Parts": parts}
    )


def test_a_persistent_etag_mismatch_spends_attempts_and_names_both_hashes(
    s3_server: S3Server, database: Database, toy_run: ToyRun, tmp_path: Path
) -> None:
    """It was a transient failure: the checkpoint was downloaded again and again, for ever, no attempt
    spent."""
    client, bucket = s3_server.client(), s3_server.bucket()
    upload(client, bucket, toy_run.last_checkpoint, "toy/step_30")
    _uneven_multipart(client, bucket, "toy/step_30/extra.bin")
    etag = client.head_object(Bucket=bucket, Key="toy/step_30/extra.bin")["ETag"].strip('"')
    cloud = s3_run(s3_server, bucket, tmp_path / "cache", name="toy", chunk_mb=1)
    assert cloud.s3 is not None
    base = _config(tmp_path, cloud)
    config = base.model_copy(update={"inference": base.inference.model_copy(update={"max_attempts": 2})})
    (tmp_path / "run").mkdir()
    _enqueue(database, cloud, cloud.root / "step_30", 30, ["arith"])
    runner = JobRunner(config, database, "test:1")
    deadline = Deadline(240)
    with capture_logs() as events:
        while _jobs(database)[("toy", "arith")].state != "failed" and not deadline.expired():
            runner.poll()
            if runner.has_capacity():
                runner.claim_and_start()
            time.sleep(0.05)
    row = _jobs(database)[("toy", "arith")]
    assert (row.state, row.attempts, row.error_kind) == ("failed", 2, "checkpoint_invalid")
    assert f"the store's ETag is {etag}" in (
        row.error or ""
    ) and "extra.bin: the downloaded bytes hash to" in (row.error or "")
    names = [e["event"] for e in events]
    assert names.count("job.retrying") == 1 and names.count("job.failed") == 1
    assert "objects.copied" not in names and "objects.copy_deferred" not in names
    assert object_cache.copies_in(cloud.s3.cache_dir / "copies") == []
    runner.shutdown(1.0)
