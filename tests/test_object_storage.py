"""Run roots in S3-compatible object storage, against a real S3 API server on loopback (moto's server).

Discovery is driven in this process with a controlled clock (as in tests/test_discovery.py); the store,
its listing, its multipart uploads, its refusals and its outage are real HTTP.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from daemon.config import RunConfig, SchedulingConfig
from daemon.scheduling.planner import Planner
from daemon.watching import Discovery, WatchedRun, mirror, object_cache, object_runs
from daemon.watching.object_runs import WAIT_SECS
from daemon.watching.objects import ObjectInfo, Store
from storage import queries
from storage.database import Database
from tests.checkpoints import save_tiny_llama
from tests.deadlines import Deadline
from tests.harness import Clock, upgraded
from tests.s3server import S3Server, s3_server, upload

__all__ = ["s3_server"]  # the session fixture, bound here

MB = 1024 * 1024


@pytest.fixture(autouse=True)
def _credentials(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)


#: How long a pass of these tests waits for the listing it starts: they judge one pass at a time, so each
#: pass takes up what its listing found, however slow a loaded machine makes it (the daemon waits 2 s, then
#: takes it up at a later pass; ``test_a_hung_store_never_holds_the_other_runs_pass`` keeps that).
TEST_WAIT_SECS = 120.0


@pytest.fixture(autouse=True)
def _listings_waited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(object_runs, "WAIT_SECS", TEST_WAIT_SECS)


@pytest.fixture(scope="module")
def big_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sharded ``save_pretrained``-style checkpoint whose second shard (6 MB) needs a multipart upload."""
    import torch
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("big") / "step_100"
    save_tiny_llama(folder)
    (folder / "model.safetensors").unlink()
    shards = {
        "model-00001-of-00002.safetensors": {"small": torch.ones(64)},
        "model-00002-of-00002.safetensors": {"big": torch.arange(6 * MB // 4, dtype=torch.float32)},
    }
    weight_map = {}
    for shard, tensors in shards.items():
        save_file(tensors, str(folder / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
    index = {"metadata": {"total_size": 6 * MB + 256}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def s3_run(server: S3Server, bucket: str, cache: Path, name: str = "s3run", **s3: object) -> RunConfig:
    return RunConfig.model_validate(
        {"name": name, "root": f"s3://{bucket}/{name}", "s3": server.settings(cache, **s3)}
    )


def discovery_for(
    database: Database, configs: list[RunConfig], clock: Clock, quiet: float = 2.0
) -> Discovery:
    runs = []
    for config in configs:
        with database.session() as s:
            run_id = queries.ensure_run(s, config.name, str(config.root))
        runs.append(WatchedRun(config, run_id, ("arith",)))
    scheduling = SchedulingConfig(quiet_secs=quiet, invalid_after_secs=60.0)
    planner = Planner(scheduling, database, runs)
    return Discovery(database, runs, scheduling, clock=clock, after_ready=planner.plan)


def states(database: Database) -> dict[str, str]:
    with database.session() as s:
        return {f"{c.run}/{c.name}": c.state for c in queries.checkpoint_rows(s)}


def job_steps(database: Database) -> list[tuple[str, int | None]]:
    with database.session() as s:
        return sorted((j.run, j.step) for j in queries.job_rows(s))


def settle(discovery: Discovery, clock: Clock, secs: float = 3.0) -> None:
    """A rescan, then the quiet period passed and the candidates looked at again."""
    discovery.scan()
    clock.now += secs
    discovery.tick()


# --- the trainer's uploads --------------------------------------------------------------------------------


@pytest.mark.parametrize("index_order", ["index_first", "index_last"])
def test_a_slow_multipart_upload_is_never_read_early(
    s3_server: S3Server, database: Database, big_checkpoint: Path, tmp_path: Path, index_order: str
) -> None:
    client, bucket, clock = s3_server.client(), s3_server.bucket(), Clock()
    config = s3_run(s3_server, bucket, tmp_path / "cache")
    discovery = discovery_for(database, [config], clock)
    prefix = "s3run/step_100"
    index, big = "model.safetensors.index.json", "model-00002-of-00002.safetensors"
    skip = (big,) if index_order == "index_first" else (big, index)
    upload(client, bucket, big_checkpoint, prefix, skip=skip)
    settle(discovery, clock, 20.0)
    assert job_steps(database) == []

    data = (big_checkpoint / big).read_bytes()
    started = client.create_multipart_upload(Bucket=bucket, Key=f"{prefix}/{big}")
    parts = []
    for number, offset in enumerate((0, 5 * MB), start=1):
        part = client.upload_part(
            Bucket=bucket,
            Key=f"{prefix}/{big}",
            UploadId=started["UploadId"],
            PartNumber=number,
            Body=data[offset : offset + 5 * MB],
        )
        parts.append({"PartNumber": number, "ETag": part["ETag"]})
        # Far past the quiet period (2 s) between parts: the shard being uploaded is not listed at all,
        # and its parts keep the checkpoint changing (invalid_after_secs is 60 s; 40 s pass here).
        settle(discovery, clock, 20.0)
        assert job_steps(database) == []
        assert not (config.root / "step_100" / big).exists()
        uploading = config.root / "step_100" / f".{big}.uploading"
        assert uploading.stat().st_size == min(len(data), number * 5 * MB)
    client.complete_multipart_upload(
        Bucket=bucket, Key=f"{prefix}/{big}", UploadId=started["UploadId"], MultipartUpload={"Parts": parts}
    )
    if index_order == "index_last":
        settle(discovery, clock, 20.0)
        assert job_steps(database) == []  # the shards are there, but nothing names them yet
        client.put_object(Bucket=bucket, Key=f"{prefix}/{index}", Body=(big_checkpoint / index).read_bytes())
    discovery.scan()
    assert job_steps(database) == []  # just changed: the quiet period starts now
    clock.now += 1.0
    discovery.tick()
    assert job_steps(database) == []
    clock.now += 1.5
    discovery.tick()
    assert job_steps(database) == [("s3run", 100)]
    with database.session() as s:
        print([(c.path, c.state) for c in queries.checkpoint_rows(s)])
    assert not uploading.exists()
    # Mirrored sparse: the 6 MB shard has its header and size, not its data.
    mirrored = config.root / "step_100" / big
    assert mirrored.stat().st_size == len(data)
    assert mirrored.stat().st_blocks * 512 < 2 * MB
    settle(discovery, clock)
    assert job_steps(database) == [("s3run", 100)]  # once

    copy = object_cache.local_copy(config, config.root / "step_100")
    for path in big_checkpoint.iterdir():
        assert (copy / path.name).read_bytes() == path.read_bytes(), path.name


def test_a_truncated_shard_in_the_store_is_refused_not_evaluated(
    s3_server: S3Server, database: Database, big_checkpoint: Path, tmp_path: Path
) -> None:
    client, bucket, clock = s3_server.client(), s3_server.bucket(), Clock()
    config = s3_run(s3_server, bucket, tmp_path / "cache")
    discovery = discovery_for(database, [config], clock)
    upload(client, bucket, big_checkpoint, "s3run/step_100")
    shard = "model-00001-of-00002.safetensors"
    cut = (big_checkpoint / shard).read_bytes()[:-10]
    client.put_object(Bucket=bucket, Key=f"s3run/step_100/{shard}", Body=cut)
    settle(discovery, clock)
    assert job_steps(database) == []
    clock.now += 61.0
    discovery.tick()
    assert states(database)["s3run/step_100"] == "invalid"
    assert job_steps(database) == []


def test_a_checkpoint_deleted_from_the_store_is_vanished(
    s3_server: S3Server, database: Database, big_checkpoint: Path, tmp_path: Path
) -> None:
    client, bucket, clock = s3_server.client(), s3_server.bucket(), Clock()
    config = s3_run(s3_server, bucket, tmp_path / "cache")
    discovery = discovery_for(database, [config], clock)
    upload(client, bucket, big_checkpoint, "s3run/step_100", skip=("model-00002-of-00002.safetensors",))
    discovery.scan()
    assert states(database) == {"s3run/step_100": "discovered"}
    for item in client.list_objects_v2(Bucket=bucket)["Contents"]:
        client.delete_object(Bucket=bucket, Key=item["Key"])
    settle(discovery, clock)
    assert states(database) == {"s3run/step_100": "vanished"}


def test_a_moved_cache_dir_evaluates_nothing_again(
    s3_server: S3Server, database: Database, big_checkpoint: Path, tmp_path: Path
) -> None:
    """The mirror lives under ``cache_dir``: moving it (a reload, a restart) moves every checkpoint's local
    path, and each must stay the one checkpoint it was, with its one job."""
    client, bucket, clock = s3_server.client(), s3_server.bucket(), Clock()
    upload(client, bucket, big_checkpoint, "s3run/step_100")
    before = s3_run(s3_server, bucket, tmp_path / "cache-a")
    settle(discovery_for(database, [before], clock), clock, 20.0)
    assert job_steps(database) == [("s3run", 100)]
    moved = s3_run(s3_server, bucket, tmp_path / "cache-b")
    with capture_logs() as logs:
        settle(discovery_for(database, [moved], clock), clock, 20.0)
    assert job_steps(database) == [("s3run", 100)]
    (again,) = [e for e in logs if e["event"] == "checkpoint.alternate"]
    assert (
        again["reason"]
        == "step_100 again, recorded at another path before the run's root moved: evaluated once"
    )
    with database.session() as s:
        assert [(c.path, c.state) for c in queries.checkpoint_rows(s)] == [
            (str(before.root / "step_100"), "ready")
        ]
    # The job still names the old mirror's path; its copy is downloaded into the new cache_dir.
    copy = object_cache.local_copy(moved, before.root / "step_100")
    assert copy.is_relative_to(tmp_path / "cache-b") and (copy / "model.safetensors.index.json").is_file()
    # A path in no mirror of the run's URL is refused by name, not downloaded.
    with pytest.raises(object_cache.CopyFailed, match="in no mirror of"):
        object_cache.local_copy(moved, tmp_path / "elsewhere" / "step_100")


# --- the store away, refusing, or very large --------------------------------------------------------------


def test_the_store_away_holds_only_its_run_and_loses_nothing(
    s3_server: S3Server, database: Database, big_checkpoint: Path, tmp_path: Path
) -> None:
    client, bucket, clock = s3_server.client(), s3_server.bucket(), Clock()
    config = s3_run(s3_server, bucket, tmp_path / "cache")
    local_root = tmp_path / "local"
    local_root.mkdir()
    local = RunConfig(name="local", root=local_root)
    discovery = discovery_for(database, [config, local], clock)
    upload(client, bucket, big_checkpoint, "s3run/step_100")
    discovery.scan()  # seen, still inside its quiet period
    with capture_logs() as logs, s3_server.paused():
        save_tiny_llama(local_root / "step_5")
        # Three rescans of the away store (counted, not timed: a loaded machine makes fewer per second).
        for _ in range(3):
            held = Deadline(5.0)
            settle(discovery, clock, 5.0)
            # One try per rescan while it is away: a pass is held about one timeout (1 s here), not five
            # (in quiet-machine seconds: a loaded machine stretches both).
            assert not held.expired(), f"a pass was held {held.waited():.1f} s"
    assert job_steps(database) == [("local", 5)]  # the other run went on
    assert states(database)["s3run/step_100"] == "discovered"  # not ready, not vanished: untouched
    unavailable = [e for e in logs if e["event"] == "objects.unavailable"]
    assert len(unavailable) == 1 and unavailable[0]["run"] == "s3run"
    with capture_logs() as logs:
        settle(discovery, clock)
        clock.now += 3.0
        discovery.tick()
    assert [e["event"] for e in logs].count("objects.recovered") == 1
    assert job_steps(database) == [("local", 5), ("s3run", 100)]


def test_a_hung_store_never_holds_the_other_runs_pass(
    s3_server: S3Server,
    database: Database,
    big_checkpoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stopped endpoint with the default timeout (10 s, three tries) held every run's rescan for the
    whole listing, about 30 s: a local checkpoint's readiness waited on another run's store."""
    client, bucket, clock = s3_server.client(), s3_server.bucket(), Clock()
    config = s3_run(s3_server, bucket, tmp_path / "cache", timeout_secs=10.0)
    local_root = tmp_path / "local"
    local_root.mkdir()
    discovery = discovery_for(database, [config, RunConfig(name="local", root=local_root)], clock)
    upload(client, bucket, big_checkpoint, "s3run/step_100")
    # The store's checkpoint is found while the store answers, however long a loaded machine takes to list
    # it (the tests' wait); the passes during the outage then wait as the daemon does.
    discovery.scan()
    assert "s3run/step_100" in states(database)
    monkeypatch.setattr(object_runs, "WAIT_SECS", WAIT_SECS)  # the daemon's own wait
    with s3_server.paused():
        save_tiny_llama(local_root / "step_5")
        bound = Deadline(3 * WAIT_SECS + 10.0)
        for _ in range(3):
            settle(discovery, clock, 5.0)
        late, took = bound.expired(), bound.waited()
        assert job_steps(database) == [("local", 5)]
        assert not discovery._objects.judged("s3run")  # its listing still hangs on its own thread
    # One listing's first try alone is 10 s: three passes that waited for it would take 30 s and more.
    # In seconds of a quiet machine (tests/deadlines.py): a loaded one stretches the bound.
    assert not late, f"took {took:.1f} s"
    assert states(database)["s3run/step_100"] == "discovered"
    for _ in range(20):  # the hung listing ends by its timeouts; a later pass starts one that answers
        settle(discovery, clock, 5.0)
        if ("s3run", 100) in job_steps(database):
            break
        time.sleep(1.0)
    assert job_steps(database) == [("local", 5), ("s3run", 100)]


@pytest.mark.long
def test_a_minute_without_the_store(
    s3_server: S3Server, sqlite_url: str, big_checkpoint: Path, tmp_path: Path
) -> None:
    database = upgraded(sqlite_url)  # one backend: the outage is the store's, not the database's
    client, bucket, clock = s3_server.client(), s3_server.bucket(), Clock()
    config = s3_run(s3_server, bucket, tmp_path / "cache")
    discovery = discovery_for(database, [config], clock)
    upload(client, bucket, big_checkpoint, "s3run/step_100")
    discovery.scan()
    with capture_logs() as logs, s3_server.paused():
        ends = time.monotonic() + 60.0
        while time.monotonic() < ends:
            settle(discovery, clock, 5.0)
    assert [e["event"] for e in logs].count("objects.unavailable") == 1
    assert states(database) == {"s3run/step_100": "discovered"}
    settle(discovery, clock)
    clock.now += 3.0
    discovery.tick()
    assert job_steps(database) == [("s3run", 100)]


@pytest.mark.parametrize("wrong", ["secret", "unset"])
def test_wrong_credentials_pause_their_run_with_one_line(
    s3_server: S3Server,
    database: Database,
    big_checkpoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    wrong: str,
) -> None:
    client, bucket, clock = s3_server.client(), s3_server.bucket(), Clock()
    good = s3_run(s3_server, bucket, tmp_path / "cache", name="good")
    bad_env = "EVALD_TEST_S3_WRONG_SECRET"
    if wrong == "secret":
        monkeypatch.setenv(bad_env, "not-the-secret")
    else:
        monkeypatch.delenv(bad_env, raising=False)
    bad = s3_run(s3_server, bucket, tmp_path / "cache", name="bad", secret_key_env=bad_env)
    for name in ("good", "bad"):
        upload(client, bucket, big_checkpoint, f"{name}/step_100")
    discovery = discovery_for(database, [bad, good], clock)
    with capture_logs() as logs:
        for _ in range(3):
            settle(discovery, clock)
    refused = [e for e in logs if e["event"] == "objects.refused"]
    assert len(refused) == 1, logs
    assert refused[0]["run"] == "bad" and bad_env in refused[0]["credentials"]
    assert refused[0]["log_level"] == "error"
    expected = "SignatureDoesNotMatch" if wrong == "secret" else f"environment variable {bad_env} is not set"
    assert expected in refused[0]["error"]
    assert "not-the-secret" not in json.dumps(logs, default=str)
    assert job_steps(database) == [("good", 100)]
    assert "bad/step_100" not in states(database)


@pytest.mark.long
def test_ten_thousand_objects_are_listed_in_seconds(
    s3_server: S3Server, sqlite_url: str, tmp_path: Path
) -> None:
    """1,000 checkpoints of 10 objects each (DCP shards): listed in 10 pages, mirrored without a GET."""
    database = upgraded(sqlite_url)  # one backend: what is measured is the store's listing
    client, bucket = s3_server.client(), s3_server.bucket()
    keys = [f"big/step_{i}/__{j}_0.distcp" for i in range(1000) for j in range(10)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=k, Body=b"x"), keys))
    # A page of 1,000 keys takes moto ~0.5 s; the tests' 1 s timeout (for their outages) is too tight
    # for it on a loaded machine, and the bound below is on the whole listing anyway.
    settings = s3_server.settings(tmp_path / "cache", timeout_secs=10.0)
    config = RunConfig.model_validate({"name": "big", "root": f"s3://{bucket}/big", "s3": settings})
    store = Store(config.s3, f"s3://{bucket}/big")  # type: ignore[arg-type]
    started = time.monotonic()
    listed = store.listing()
    list_secs = time.monotonic() - started
    assert len(listed) == 10_000
    discovery = discovery_for(database, [config], Clock())
    started = time.monotonic()
    discovery.scan()
    first_secs = time.monotonic() - started
    started = time.monotonic()
    discovery.scan()
    rescan_secs = time.monotonic() - started
    structlog.get_logger("tests").info(
        "objects.timing", list_secs=list_secs, first_scan_secs=first_secs, rescan_secs=rescan_secs
    )
    # Stated bounds: 10,000 objects listed (10 pages) in under 15 s; measured 5.3 s against moto on two
    # shared cores, listing and an unchanged rescan (see BENCHMARKS.md for the per-rescan figure).
    assert list_secs < 15.0
    assert rescan_secs < 30.0
    with database.session() as s:
        assert len(queries.checkpoint_rows(s)) == 1000


# --- the local copy ---------------------------------------------------------------------------------------


def test_the_copy_is_downloaded_once_checked_and_evicted_for_room(
    s3_server: S3Server, big_checkpoint: Path, tmp_path: Path
) -> None:
    client, bucket = s3_server.client(), s3_server.bucket()
    # chunk_mb=1: the 6 MB shard comes in six ranged GETs; the cache holds one such checkpoint.
    config = s3_run(s3_server, bucket, tmp_path / "cache", chunk_mb=1, cache_max_gb=10 / 1024)
    for step in (100, 200):
        upload(client, bucket, big_checkpoint, f"s3run/step_{step}")
    client.put_object(Bucket=bucket, Key="s3run/latest", Body=b"step_200")
    with capture_logs() as logs:
        first = object_cache.local_copy(config, config.root / "step_100")
        again = object_cache.local_copy(config, config.root / "step_100")
    assert first == again
    assert [e["event"] for e in logs] == ["objects.copied", "objects.copy_reused"]
    assert (first.parent / "latest").read_bytes() == b"step_200"
    with capture_logs() as logs:
        second = object_cache.local_copy(config, config.root / "step_200")
    assert [e["event"] for e in logs] == ["objects.evicted", "objects.copied"]
    assert not first.exists() and second.is_dir()
    # Replaced in the store since: the copy is not reused, but downloaded again.
    client.put_object(Bucket=bucket, Key="s3run/step_200/config.json", Body=b"{}")
    with capture_logs() as logs:
        third = object_cache.local_copy(config, config.root / "step_200")
    assert [e["event"] for e in logs] == ["objects.copied"]
    assert (third / "config.json").read_bytes() == b"{}"


def test_a_copy_while_the_store_is_away_fails_as_transient(
    s3_server: S3Server, big_checkpoint: Path, tmp_path: Path
) -> None:
    """The runner puts such a job back in the queue without spending an attempt (objects.copy_deferred)."""
    client, bucket = s3_server.client(), s3_server.bucket()
    config = s3_run(s3_server, bucket, tmp_path / "cache")
    upload(client, bucket, big_checkpoint, "s3run/step_100")
    with s3_server.paused(), pytest.raises(object_cache.CopyFailed, match="cannot list") as caught:
        object_cache.local_copy(config, config.root / "step_100")
    assert caught.value.transient and not caught.value.vanished
    for item in client.list_objects_v2(Bucket=bucket)["Contents"]:
        client.delete_object(Bucket=bucket, Key=item["Key"])
    with pytest.raises(object_cache.CopyFailed, match="holds no objects any more") as caught:
        object_cache.local_copy(config, config.root / "step_100")
    assert caught.value.vanished and not caught.value.transient


def test_a_copy_larger_than_the_cache_is_refused_by_name(
    s3_server: S3Server, big_checkpoint: Path, tmp_path: Path
) -> None:
    client, bucket = s3_server.client(), s3_server.bucket()
    config = s3_run(s3_server, bucket, tmp_path / "cache", cache_max_gb=1 / 1024)
    upload(client, bucket, big_checkpoint, "s3run/step_100")
    with pytest.raises(
        object_cache.CopyFailed, match=r"is 0.01 GB, more than cache_max_gb = 0.00097"
    ) as caught:
        object_cache.local_copy(config, config.root / "step_100")
    assert not caught.value.transient


def test_multipart_etags_are_checked(s3_server: S3Server, tmp_path: Path) -> None:
    client, bucket = s3_server.client(), s3_server.bucket()
    data = bytes(range(256)) * (6 * MB // 256)
    started = client.create_multipart_upload(Bucket=bucket, Key="blob")
    parts = []
    for number, offset in enumerate((0, 5 * MB), start=1):
        part = client.upload_part(
            Bucket=bucket,
            Key="blob",
            UploadId=started["UploadId"],
            PartNumber=number,
            Body=data[offset : offset + 5 * MB],
        )
        parts.append({"PartNumber": number, "ETag": part["ETag"]})
    client.complete_multipart_upload(
        Bucket=bucket, Key="blob", UploadId=started["UploadId"], MultipartUpload={"Parts": parts}
    )
    etag = client.head_object(Bucket=bucket, Key="blob")["ETag"].strip('"')
    assert etag.endswith("-2")
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert object_cache.etag_digest(path, etag, 5 * MB) is True
    path.write_bytes(data[:-1] + b"\x00")
    assert object_cache.etag_digest(path, etag, 5 * MB) is False
    assert object_cache.etag_digest(path, etag, None) is None


# --- config and the pure parts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("root", "s3", "message"),
    [
        ("s3://Bad_Bucket/x", {}, "is not a bucket name"),
        ("s3://bucket/a//b", {}, "empty, '.' or '..' part"),
        ("/tmp/local", {"region": "x"}, "s3 is set but root is not an s3://bucket/prefix URL"),
        (
            "s3://bucket/x",
            {"secret_key_env": "wJalrXUtnFEMI/K7MDENG+bPxRfiCY"},
            "not an environment variable",
        ),
        ("s3://bucket/x", {"endpoint_url": "ftp://host"}, "should match pattern"),
    ],
)
def test_bad_object_roots_are_refused_at_load(root: str, s3: dict[str, Any], message: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message) as caught:
        RunConfig.model_validate({"name": "r", "root": root, "s3": s3})
    assert "wJalrXUtnFEMI/K7MDENG+bPxRfiCY" not in "\n".join(e["msg"] for e in caught.value.errors())


def test_an_object_root_is_watched_through_its_mirror(tmp_path: Path) -> None:
    config = RunConfig.model_validate(
        {"name": "r", "root": "s3://bucket/runs/a/", "s3": {"cache_dir": str(tmp_path)}}
    )
    assert config.url == "s3://bucket/runs/a"
    assert config.root == tmp_path / "mirror" / "bucket" / "runs" / "a"
    assert config.watch_mode == "poll"
    assert RunConfig(name="l", root=tmp_path).url is None


def test_a_checkpoints_name_is_read_from_any_mirror_of_its_url(tmp_path: Path) -> None:
    config = RunConfig.model_validate(
        {"name": "r", "root": "s3://bucket/runs/a", "s3": {"cache_dir": str(tmp_path / "new")}}
    )
    assert config.s3 is not None and config.url is not None
    s3, url = config.s3, config.url
    assert s3.name_in_mirror(url, config.root / "step_1") == "step_1"
    # Recorded under an earlier cache_dir (itself under a folder called mirror): still its name.
    old = tmp_path / "mirror" / "old" / "mirror" / "bucket" / "runs" / "a"
    assert s3.name_in_mirror(url, old / "step_1" / "actor") == "step_1/actor"
    assert s3.name_in_mirror(url, old) == "."
    # Another URL's mirror, or no mirror at all: not this run's checkpoint.
    assert s3.name_in_mirror(url, tmp_path / "new" / "mirror" / "bucket" / "runs" / "b" / "step_1") is None
    assert s3.name_in_mirror(url, tmp_path / "step_1") is None


def _info(key: str, size: int = 1, mtime: int = 1) -> ObjectInfo:
    return ObjectInfo(key, size, mtime, "e")


def test_the_mirror_plan_writes_changes_deletes_the_gone_and_refuses_unsafe_keys() -> None:
    listed = [
        _info("step_1/config.json"),
        _info("step_1/model.safetensors", 10, 5),
        _info("step_2/", 0),  # a console's folder marker
        _info("step_3/../../etc/passwd"),
        _info("a"),
        _info("a/b"),
    ]
    local = {"step_1/config.json": (1, 1), "step_1/model.safetensors": (10, 4), "step_0/x": (1, 1)}
    plan = mirror.plan(listed, local)
    assert [i.relkey for i in plan.write] == ["a/b", "step_1/model.safetensors"]
    assert plan.delete == ("step_0/x",)
    assert dict(plan.refused) == {
        "step_3/../../etc/passwd": "its key has an empty, '.' or '..' part",
        "a": "it is also the folder of other objects",
    }
