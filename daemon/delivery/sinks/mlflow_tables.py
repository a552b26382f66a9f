"""The MLflow sink's sample tables: their path, MLflow's table format, the run's list of tables, the upload.

One table per evaluation, ``evald/samples/<task>/step_<step>.json``, in the JSON ``MlflowClient.log_table``
writes (pandas' ``orient="split"`` without the index: ``{"columns": [...], "data": [[...], ...]}``), each
row naming its step, stage and checkpoint; listed in the run's ``mlflow.loggedArtifacts`` tag, which is what
makes MLflow's UI show a JSON artifact as a table and ``MlflowClient.load_table`` find it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from daemon.delivery.errors import SinkRefused, SinkUnavailable
from daemon.delivery.messages import ResultMessage

#: The run tag listing the artifacts MLflow's UI shows as tables (what ``MlflowClient.log_table`` sets).
LOGGED_ARTIFACTS = "mlflow.loggedArtifacts"
#: Where the sample tables go in a run's artifacts: ``<task>/step_<step>.json`` below it.
SAMPLES_DIR = "evald/samples/"
#: The sample table's columns: each row says which checkpoint it came from.
SAMPLE_COLUMNS = ("step", "stage", "checkpoint", "prompt", "response", "reference", "grade")
#: What is read of an artifact upload's answer: enough for the server's error text, never a 1 GB body.
MAX_ANSWER_BYTES = 64 * 1024


def sample_path(message: ResultMessage) -> str:
    """``evald/samples/<task>/step_<step>.json`` (``<task>/quick/`` for a two-stage task's quick subset),
    the step zero-padded to 9 digits so that MLflow's artifact browser lists them in order."""
    stage = "" if message.stage == "full" else f"/{message.stage}"
    return f"{SAMPLES_DIR}{message.task}{stage}/step_{message.step:09d}.json"


def sample_table(message: ResultMessage) -> dict[str, Any]:
    """The samples in MLflow's table format, which ``MlflowClient.load_table`` and the UI's table view
    read."""
    return {
        "columns": list(SAMPLE_COLUMNS),
        "data": [
            [
                message.step,
                message.stage,
                message.checkpoint_path,
                s.prompt,
                s.response,
                s.reference,
                None if s.correct is None else ("correct" if s.correct else "wrong"),
            ]
            for s in message.samples
        ],
    }


def listed_tables(current: str | None, paths: Sequence[str], limit: int) -> str | None:
    """The ``mlflow.loggedArtifacts`` value with ``paths`` added as tables, kept within ``limit``
    characters (MLflow's tag size) by dropping evald's oldest tables from the list (their files stay);
    None where nothing changes. Raises ValueError for a value that is not a JSON list (the trainer's:
    never overwritten)."""
    listed = json.loads(current) if current else []
    if not isinstance(listed, list):
        raise ValueError("not a JSON list")
    wanted = [{"path": p, "type": "table"} for p in paths]
    if all(entry in listed for entry in wanted):
        return None
    listed += [entry for entry in wanted if entry not in listed]
    ours = [e for e in listed if isinstance(e, dict) and str(e.get("path", "")).startswith(SAMPLES_DIR)]
    while len(json.dumps(listed)) > limit and ours:
        listed.remove(ours.pop(0))
    value = json.dumps(listed)
    return value if len(value) <= limit else None


def put_artifact(root: str, path: str, data: bytes, *, user: str | None, token: str | None) -> None:
    """One file PUT to an HTTP artifact store (the server's artifact proxy) with the sink's own
    credentials (MLflow's client would look for them in the environment, where the sink never puts them)."""
    from mlflow.utils.rest_utils import MlflowHostCreds, http_request

    creds = (
        MlflowHostCreds(root, username=user, password=token)  # type: ignore[no-untyped-call]
        if user is not None
        else MlflowHostCreds(root, token=token)  # type: ignore[no-untyped-call]
    )
    # Streamed, so that only the start of the answer is read (requests reads a plain one whole).
    answer = http_request(  # type: ignore[no-untyped-call]
        creds,
        f"/{path}",
        "PUT",
        data=data,
        extra_headers={"Content-Type": "application/json", "Accept-Encoding": "identity"},
        stream=True,
    )
    try:
        status = int(answer.status_code)
        # Read to its end (the proxy answers a few bytes), so that the connection goes back to the pool
        # for the next upload (an answer left unread closes it: one new connection per evaluation's file);
        # one longer than the limit is cut, and its connection closed.
        said = b""
        for chunk in answer.iter_content(8192):
            said += chunk
            if len(said) > MAX_ANSWER_BYTES:
                break
    finally:
        answer.close()
    if status in (401, 403):
        raise SinkRefused(f"artifact upload: credentials refused (HTTP {status})")
    if status >= 400:
        text = said.decode("utf-8", errors="replace")[:200]
        raise SinkUnavailable(f"artifact upload {path}: HTTP {status} {text}")
