"""``systemctl reload`` (SIGHUP) with a run root in object storage: one real daemon beside a real S3 API
server on loopback, an ``s3://`` run added to its config, changed, broken, mended and removed again while
a local run goes on, and a ``[runs.s3]`` that does not validate refused with the old config kept."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from storage.database import Database
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import (
    DaemonProcess,
    checkpoints,
    jobs,
    log_events,
    running_daemon,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)
from tests.s3server import ACCESS_ENV, SECRET_ENV, S3Server, s3_server, upload

__all__ = ["s3_server"]  # the session fixture, bound here

pytestmark = [pytest.mark.slow, pytest.mark.long]

#: harness.CONFIG's rescan interval: an s3:// run is listed once per rescan.
RESCAN_SECS = 2.0
#: Long enough for a job of the toy model on the small dataset, with the daemon's own passes around it.
JOB_SECS = 120


def _nth_event(daemon: DaemonProcess, name: str, count: int) -> dict[str, object]:
    """The ``count``-th ``name`` event of the daemon's log, once it is there."""
    found = wait_for(
        lambda: e if len(e := log_events(daemon.log, name)) >= count else None,
        30,
        f"{name} number {count}",
        daemon.process,
    )
    return found[count - 1]


def _succeeded(database: Database, run: str, step: int) -> bool:
    return any(j.run == run and j.step == step and j.state == "succeeded" for j in jobs(database))


def _recorded(database: Database, run: str) -> set[int | None]:
    return {c.step for c in checkpoints(database) if c.run == run}


def _cloud_run(bucket: str, s3_server: S3Server, cache: Path, **fields: str | int) -> str:
    settings = {
        "endpoint_url": s3_server.endpoint,
        "access_key_env": ACCESS_ENV,
        "secret_key_env": SECRET_ENV,
        "cache_dir": str(cache),
        "chunk_mb": 1,
        "timeout_secs": 2.0,
        **fields,
    }
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in settings.items())
    return f'[[runs]]\nname = "cloud"\nroot = "s3://{bucket}/toy"\n[runs.s3]\n{lines}\n\n'


def test_an_s3_run_added_changed_broken_mended_and_removed_by_reloads(
    s3_server: S3Server, sqlite_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(sqlite_url)
    config = write_config(tmp_path, sqlite_url, dataset=write_dataset(tmp_path / "arith.jsonl", 4))
    # Debug: each listing of the store is an ``objects.listed`` line, so "no more listing" can be seen.
    local_only = config.read_text().replace('log_format = "json"', 'log_format = "json"\nlog_level = "debug"')
    config.write_text(local_only)
    bucket, client, cache = s3_server.bucket(), s3_server.client(), tmp_path / "cache"
    mirror = cache / "mirror" / bucket / "toy"
    checkpoint = toy_run.last_checkpoint

    def with_cloud(**fields: str | int) -> str:
        return local_only.replace(
            "[[tasks]]", _cloud_run(bucket, s3_server, cache, **fields) + "[[tasks]]", 1
        )

    def reload(text: str, event: str, count: int) -> dict[str, object]:
        config.write_text(text)
        daemon.process.send_signal(signal.SIGHUP)
        return _nth_event(daemon, event, count)

    with running_daemon(config, tmp_path / "daemon.log", env=s3_server.env) as daemon:
        # Added: the store's checkpoint is found and evaluated, beside the local run's.
        copy_checkpoint(checkpoint, tmp_path / "run" / "step_10")
        upload(client, bucket, checkpoint, "toy/step_10")
        assert reload(with_cloud(), "config.reloaded", 1)["runs"] == ["toy", "cloud"]
        wait_for(
            lambda: _succeeded(database, "toy", 10) and _succeeded(database, "cloud", 10),
            JOB_SECS,
            "step 10 of both runs",
            daemon.process,
        )

        # A [runs.s3] that does not validate is refused, naming the field; the s3 run goes on as it was.
        bad_bucket = with_cloud().replace(f"s3://{bucket}/toy", "s3://Not_A_Bucket/toy")
        problems = reload(bad_bucket, "config.reload_refused", 1)["problems"]
        assert isinstance(problems, list) and any(
            "'Not_A_Bucket' is not a bucket name" in p for p in problems
        )
        pasted = with_cloud(access_key_env=s3_server.access_key + " x")
        problems = reload(pasted, "config.reload_refused", 2)["problems"]
        assert isinstance(problems, list) and any(
            "s3.access_key_env" in p and "not an environment variable name" in p for p in problems
        ), problems
        assert s3_server.access_key not in str(problems)  # what was pasted may be a credential
        upload(client, bucket, checkpoint, "toy/step_20")
        wait_for(lambda: _succeeded(database, "cloud", 20), JOB_SECS, "cloud step 20", daemon.process)
        assert len(log_events(daemon.log, "config.reloaded")) == 1

        # Credentials swapped: the s3 run pauses with one line naming it; the local run goes on.
        swapped = with_cloud(access_key_env=SECRET_ENV, secret_key_env=ACCESS_ENV)
        reload(swapped, "config.reloaded", 2)
        upload(client, bucket, checkpoint, "toy/step_30")
        copy_checkpoint(checkpoint, tmp_path / "run" / "step_20")
        wait_for(lambda: _succeeded(database, "toy", 20), JOB_SECS, "local step 20", daemon.process)
        [refused] = log_events(daemon.log, "objects.refused")
        assert refused["run"] == "cloud" and refused["level"] == "error"
        assert refused["credentials"] == f"{SECRET_ENV}, {ACCESS_ENV}"
        assert "InvalidAccessKeyId" in str(refused["error"])
        assert 30 not in _recorded(database, "cloud") and not (mirror / "step_30").exists()

        # Mended, with another chunk size: the run resumes and what was uploaded meanwhile is evaluated.
        reload(with_cloud(chunk_mb=2), "config.reloaded", 3)
        wait_for(lambda: _succeeded(database, "cloud", 30), JOB_SECS, "cloud step 30", daemon.process)
        # Said as after a pause mended in the store: the line that answers objects.refused.
        [recovered] = log_events(daemon.log, "objects.recovered")
        assert recovered["run"] == "cloud" and "InvalidAccessKeyId" in str(recovered["was"])
        assert len(log_events(daemon.log, "objects.refused")) == 1

        # Removed: nothing more is listed from the store; the local run goes on.
        removed = reload(local_only, "config.reloaded", 4)
        removed_at = time.monotonic()
        assert removed["runs"] == ["toy"]
        listings = len([e for e in log_events(daemon.log, "objects.listed") if e["run"] == "cloud"])
        assert listings > 0
        upload(client, bucket, checkpoint, "toy/step_40")
        copy_checkpoint(checkpoint, tmp_path / "run" / "step_30")
        wait_for(
            lambda: _succeeded(database, "toy", 30) and time.monotonic() - removed_at > 2 * RESCAN_SECS,
            JOB_SECS,
            "local step 30, and two rescans",
            daemon.process,
        )
        assert len([e for e in log_events(daemon.log, "objects.listed") if e["run"] == "cloud"]) == listings
        assert not (mirror / "step_40").exists() and 40 not in _recorded(database, "cloud")
        assert daemon.stop() == 0

    log = (tmp_path / "daemon.log").read_text()
    assert s3_server.secret_key not in log
    assert '"scheduler.pass_failed"' not in log
    assert {(j.run, j.step, j.state, j.attempts) for j in jobs(database)} == {
        (run, step, "succeeded", 1) for run in ("toy", "cloud") for step in (10, 20, 30)
    }
    database.dispose()
