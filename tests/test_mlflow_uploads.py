"""The MLflow sink's parallel uploads keep each file's last version: two events of one alert in one batch
(fired, then resolved) are two uploads of its one file, and the resolved one must be what stays."""

from __future__ import annotations

import threading

from daemon.delivery.sinks.mlflow_uploads import Uploads


def test_uploads_of_one_file_end_in_the_order_begun_others_run_beside_them() -> None:
    stored: dict[tuple[str, str], bytes] = {}
    order: list[bytes] = []
    first_held = threading.Event()
    release = threading.Event()
    other_done = threading.Event()

    def upload(run_id: str, path: str, data: bytes) -> None:
        if data == b"firing":
            first_held.set()
            # Held until the test has seen the other file written: a slow PUT.
            assert release.wait(30)
        order.append(data)
        stored[(run_id, path)] = data
        if path == "other.json":
            other_done.set()

    uploads = Uploads("t", upload, lambda run_id: None)
    try:
        begun = uploads.start(
            [
                ("r", "alert_1.json", b"firing"),
                ("r", "other.json", b"other"),
                ("r", "alert_1.json", b"resolved"),
            ]
        )
        assert first_held.wait(30)
        # A different file is not held behind the slow one.
        assert other_done.wait(30)
        assert b"resolved" not in order
        release.set()
        assert uploads.wait(begun) == [None, None, None]
    finally:
        release.set()
        uploads.close()
    assert order.index(b"firing") < order.index(b"resolved")
    assert stored[("r", "alert_1.json")] == b"resolved"
    # Begun again later, after these ended: nothing left to wait on.
    assert uploads.run([("r", "alert_1.json", b"again")]) == [None]
    assert stored[("r", "alert_1.json")] == b"again"
