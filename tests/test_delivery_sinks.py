"""The sink contract and the relay's one machine.

Every sink (the in-memory twin, a webhook to a real signed receiver on loopback, TensorBoard's event
files, W&B's offline run files, a real MLflow server) delivers a batch in order, takes a message sent again
without logging it twice, says where a run's messages went, and answers a destination that is down with
the error that has it tried again. The relay's decisions (deliver and mark, back off, pause, give up, find
the one bad message of a batch, disable a gone endpoint) run on the in-memory sink over a real database.
"""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from daemon.config import Secret, TrackerConfig, WebhookConfig
from daemon.delivery.alert_notice import notice_body
from daemon.delivery.base import Route
from daemon.delivery.errors import SinkGone, SinkRefused, SinkRejected, SinkUnavailable
from daemon.delivery.memory import Memory, MemoryRoute
from daemon.delivery.messages import MetricValue, ResultMessage, event_id
from daemon.delivery.receiver import WebhookReceiver
from daemon.delivery.relay import Lane, Relay
from daemon.delivery.sinks.webhook import Endpoint
from daemon.delivery.trackers import TrackerRoute
from storage import outbox, queries
from storage.database import Database
from storage.models import Delivery, OutboxMessage, OutboxState, WebhookEndpoint, utcnow
from tests.harness import wait_for
from tests.mlflowserver import MlflowServer, mlflow_server_fixture

mlflow_server = mlflow_server_fixture()

RUN = "grpo"
STEPS = (10, 20, 30)
SECRET = Secret(bytes(range(32)))


def result(step: int, root: Path) -> ResultMessage:
    return ResultMessage(
        run=RUN,
        run_root=str(root),
        job_id=step,
        task="gsm8k",
        stage="full",
        step=step,
        checkpoint=f"step_{step}",
        checkpoint_path=str(root / f"step_{step}"),
        metrics=(MetricValue("accuracy", step / 100, 0.01, 50),),
        finished_ms=1_700_000_000_000 + step,
    )


class FakeAlert:
    """The fields of a stored alert a notice reads."""

    def __init__(self, step: int) -> None:
        self.fingerprint = f"fp-{step}"
        self.checkpoint = f"step_{step}"
        self.first_step = self.last_step = step
        self.resolved_step = None
        self.task, self.metric, self.rule = "gsm8k", "accuracy", "drop"
        self.value, self.baseline, self.best_step, self.rollback_step = 0.1, 0.6, 10, 10
        self.severity, self.message = "critical", f"accuracy fell at step {step}"
        self.fired_at = utcnow()


@dataclass
class Case:
    """One sink under the contract: its route, the messages it takes, and what reached the destination
    (the steps, in the order they arrived)."""

    route: Route[Any]
    items: list[tuple[str, Any]]
    reached: Callable[[], list[int]]
    #: Whether the sink knows a message it took before (False: the destination drops it, by its id).
    knows_its_own: bool = True
    #: Makes the destination unreachable, if the case can.
    down: Callable[[], None] | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install 'evald[{module}]')")


def memory_case(tmp_path: Path) -> Iterator[Case]:
    memory = Memory()
    route = MemoryRoute("twin", memory, batch=10)

    def down() -> None:
        memory.failing = SinkUnavailable("the twin is down")

    items = [(f"mem_{step}", result(step, tmp_path).to_json()) for step in STEPS]
    steps = {event: step for (event, _), step in zip(items, STEPS, strict=True)}
    yield Case(route, items, lambda: [steps[i] for i in memory.ids()], down=down)


def webhook_case(tmp_path: Path) -> Iterator[Case]:
    with WebhookReceiver(SECRET) as receiver:
        hook = WebhookConfig(name="hook", url=receiver.url, timeout_secs=5.0)
        route = Endpoint(hook, SECRET)
        bodies = [notice_body(RUN, FakeAlert(step), ends_at=None, links={}) for step in STEPS]  # type: ignore[arg-type]
        items = [
            (f"evt_{step}", route.read(f"evt_{step}", _json(body)))
            for step, body in zip(STEPS, bodies, strict=True)
        ]
        steps = {f"evt_{step}": step for step in STEPS}

        def reached() -> list[int]:
            return [steps[a.webhook_id or ""] for a in receiver.deliveries]

        def down() -> None:
            route.config = hook.model_copy(update={"url": f"http://127.0.0.1:{free_port()}/hook"})

        yield Case(route, items, reached, knows_its_own=False, down=down)


def _json(body: dict[str, Any]) -> str:
    import json

    return json.dumps(body, default=str)


def tracker_items(config: TrackerConfig, root: Path) -> list[tuple[str, Any]]:
    return [(event_id(config.endpoint, step), result(step, root)) for step in STEPS]


def tensorboard_case(tmp_path: Path) -> Iterator[Case]:
    _needs("tensorboard")
    config = TrackerConfig(kind="tensorboard", name="tb", dir=tmp_path / "tb")

    def reached() -> list[int]:
        from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
            EventAccumulator,
        )

        events = EventAccumulator(str(tmp_path / "tb" / RUN))
        events.Reload()
        return [e.step for e in events.Scalars("eval/gsm8k/accuracy")]

    yield Case(TrackerRoute(config, {}), tracker_items(config, tmp_path), reached)


def wandb_case(tmp_path: Path) -> Iterator[Case]:
    _needs("wandb")
    from tests.test_trackers_offline import history

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        config = TrackerConfig(
            kind="wandb", name="wb", project="team/grpo", mode="offline", dir=tmp_path / "wb", attach="own"
        )

        def reached() -> list[int]:
            rows = history(sorted((tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")))
            return [int(row["eval/step"]) for row in rows if "eval/gsm8k/accuracy" in row]

        yield Case(TrackerRoute(config, {}), tracker_items(config, tmp_path), reached)


def mlflow_case(tmp_path: Path, server: MlflowServer) -> Iterator[Case]:
    experiment = f"contract-{tmp_path.name}"
    config = TrackerConfig(
        kind="mlflow", name="ml", tracking_uri=server.uri, experiment=experiment, attach="own", timeout_secs=5
    )
    route = TrackerRoute(config, {})

    def reached() -> list[int]:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(server.uri)
        found = client.get_experiment_by_name(experiment)
        assert found is not None
        (run,) = client.search_runs([found.experiment_id])
        return [m.step for m in client.get_metric_history(run.info.run_id, "eval/gsm8k/accuracy")]

    def down() -> None:
        route.config = config.model_copy(update={"tracking_uri": f"http://127.0.0.1:{free_port()}"})

    # MLflow's delivery is idempotent rather than remembered: sent again, each value repeats its key,
    # step and timestamp, which the store keeps once (``reached`` checks each step once).
    yield Case(route, tracker_items(config, tmp_path), reached, knows_its_own=False, down=down)


@pytest.fixture(params=["memory", "webhook", "tensorboard", "wandb", "mlflow"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    if request.param == "mlflow":
        _needs("mlflow")
        made = mlflow_case(tmp_path, request.getfixturevalue("mlflow_server"))
    else:
        made = {
            "memory": memory_case,
            "webhook": webhook_case,
            "tensorboard": tensorboard_case,
            "wandb": wandb_case,
        }[str(request.param)](tmp_path)
    yield from made


def test_every_sink_delivers_in_order_and_a_message_sent_again_once(case: Case) -> None:
    sink = case.route.open()
    try:
        first = sink.deliver_many(case.items[:2])
        assert (first.fresh, first.error) == ((True, True), None)
        assert isinstance(sink.where(RUN), str) and sink.where(RUN)
    finally:
        sink.close()
    # A new sink (the daemon restarted after a crash before the outbox's mark): all three again.
    sink = case.route.open()
    try:
        again = sink.deliver_many(case.items)
        assert again.error is None and len(again.fresh) == 3 and again.fresh[2]
        if case.knows_its_own:
            assert again.fresh[:2] == (False, False)
    finally:
        sink.close()
    # W&B writes its run file from a process of its own: read until it has caught up.
    wait_for(lambda: case.reached() == list(STEPS) or None, 30, f"the steps {STEPS}, each once, in order")


def test_a_sink_whose_destination_is_down_says_try_again(case: Case) -> None:
    if case.down is None:
        pytest.skip("this destination cannot be down (files on a local disk)")
    case.down()
    sink = case.route.open()
    try:
        batch = sink.deliver_many(case.items[:1])
    except SinkUnavailable:
        return
    finally:
        sink.close()
    assert batch.fresh == () and isinstance(batch.error, SinkUnavailable), batch


# The relay's decisions, on the in-memory sink over a real database (SQLite and PostgreSQL).


def queue(
    database: Database,
    route: MemoryRoute,
    bodies: Sequence[str],
    runs: Sequence[str] = (RUN,),
    prefix: str = "m",
) -> None:
    with database.session() as s:
        run_ids = [queries.ensure_run(s, run, f"/{run}") for run in runs]
        for i, body in enumerate(bodies):
            assert outbox.enqueue_message(
                s,
                run_id=run_ids[i % len(run_ids)],
                endpoint=route.endpoint,
                event_id=f"{prefix}{i}",
                body=body,
            )


def states(database: Database) -> dict[str, str]:
    with database.session() as s:
        return {e: st.value for e, st in s.execute(select(OutboxMessage.event_id, OutboxMessage.state))}


def due_now(database: Database) -> None:
    with database.session() as s:
        s.execute(update(OutboxMessage).values(next_attempt_at=utcnow() - timedelta(seconds=1)))


def test_a_batch_goes_in_one_call_and_every_attempt_is_recorded(database: Database) -> None:
    memory = Memory()
    route = MemoryRoute("twin", memory, batch=10)
    queue(database, route, ["a", "b", "c", "d"], runs=("r1", "r2"))
    lane = Lane(database, route)
    sent = lane.send(lane.claim())
    assert (sent.delivered, sent.fresh, sent.stopped) == (4, 4, False)
    assert memory.calls == [4]
    assert memory.ids() == ["m0", "m1", "m2", "m3"]
    assert set(states(database).values()) == {"delivered"}
    with database.session() as s:
        assert len(s.scalars(select(Delivery)).all()) == 4


def test_down_backs_off_and_nothing_is_lost(database: Database) -> None:
    memory = Memory(failing=SinkUnavailable("down"))
    route = MemoryRoute("twin", memory, batch=10, max_backoff_secs=30)
    queue(database, route, ["a", "b"])
    lane = Lane(database, route)
    sent = lane.send(lane.claim())
    assert sent.stopped and not sent.paused and sent.delivered == 0
    assert lane.claim() == []  # backing off
    with database.session() as s:
        assert {m.last_error for m in s.scalars(select(OutboxMessage))} == {"down"}
    memory.failing = None
    due_now(database)
    assert lane.send(lane.claim()).delivered == 2
    assert memory.ids() == ["m0", "m1"]


def test_refused_credentials_pause_the_route(database: Database) -> None:
    memory = Memory(failing=SinkRefused("401"))
    route = MemoryRoute("twin", memory, batch=10, pause_secs=600)
    queue(database, route, ["a"])
    lane = Lane(database, route)
    sent = lane.send(lane.claim())
    assert sent.paused and lane.paused_until is not None
    with database.session() as s:
        (row,) = s.scalars(select(OutboxMessage))
        assert row.state is OutboxState.PENDING and row.next_attempt_at > utcnow() + timedelta(seconds=500)


def test_the_one_bad_message_of_a_batch_is_found_and_given_up(database: Database) -> None:
    memory = Memory(rejects={"m1": SinkRejected("malformed")})
    route = MemoryRoute("twin", memory, batch=10)
    queue(database, route, ["a", "b", "c"])
    lane = Lane(database, route)
    sent = lane.send(lane.claim())
    assert sent.delivered == 2
    assert states(database) == {"m0": "delivered", "m1": "failed", "m2": "delivered"}


def test_a_message_refused_n_times_is_given_up_then(database: Database) -> None:
    memory = Memory(rejects={"m0": SinkRejected("HTTP 400", after=3, status=400)})
    route = MemoryRoute("twin", memory, one_per_run=True)
    queue(database, route, ["a", "b"])
    lane = Lane(database, route)
    for _ in range(2):
        lane.send(lane.claim())
        assert states(database)["m0"] == "pending"
        due_now(database)
    lane.send(lane.claim())
    with database.session() as s:
        row = s.scalar(select(OutboxMessage).where(OutboxMessage.event_id == "m0"))
        assert row is not None and (row.state, row.last_error) == (OutboxState.FAILED, "HTTP 400 3 times")
        # Its answer's status is kept, not an error text.
        assert {d.status_code for d in s.scalars(select(Delivery))} == {400}
    # It stops blocking its run.
    assert lane.send(lane.claim()).delivered == 1


def test_a_gone_endpoint_is_disabled_with_its_messages(database: Database) -> None:
    memory = Memory(failing=SinkGone("answered 410 Gone to m0", status=410))
    route = MemoryRoute("twin", memory, one_per_run=True)
    queue(database, route, ["a", "b"])
    lane = Lane(database, route)
    lane.send(lane.claim())
    assert states(database) == {"m0": "disabled", "m1": "disabled"}
    with database.session() as s:
        assert s.get(WebhookEndpoint, route.endpoint) is not None
        assert outbox.disabled(s, route.endpoint) == "answered 410 Gone to m0"


def test_an_unreadable_body_is_given_up(database: Database) -> None:
    route = MemoryRoute("twin", Memory(), batch=10)
    queue(database, route, ["", "b"])
    lane = Lane(database, route)
    assert lane.send(lane.claim()).delivered == 1
    with database.session() as s:
        row = s.scalar(select(OutboxMessage).where(OutboxMessage.event_id == "m0"))
        assert row is not None and row.last_error == "cannot be read: an empty body"


def test_the_relay_threads_deliver_when_woken_and_close_their_sinks(database: Database) -> None:
    memories = [Memory(), Memory()]
    routes = [MemoryRoute(f"twin{i}", m, batch=5) for i, m in enumerate(memories)]
    relay = Relay(database, routes).start()
    try:
        for route in routes:
            queue(database, route, ["a", "b", "c"], prefix=f"{route.name}-")
        relay.wake()
        wait_for(lambda: all(len(m.ids()) == 3 for m in memories) or None, 10, "both twins to have all three")
    finally:
        relay.stop()
    assert set(states(database).values()) == {"delivered"}
