"""What every route reads: the read-only database, the config, and which way each metric is better."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy.orm import Session
from starlette.requests import Request

from daemon.alerts.lifecycle import Alerter
from daemon.config import Config
from storage.database import Database


@dataclass(frozen=True)
class WebContext:
    config: Config
    database: Database
    #: The bearer token every request must carry; None: no token required.
    token: str | None = None

    def direction(self, metric: str) -> bool | None:
        """True: higher is better; False: lower; None: no good direction (no best point is marked).
        The detectors' own rule (``[alerts] directions`` over the metric registry), as ``evald plot``."""
        return Alerter(self.config).direction(metric)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.database.session() as session:
            yield session


def context(request: Request) -> WebContext:
    web: WebContext = request.app.state.web
    return web
