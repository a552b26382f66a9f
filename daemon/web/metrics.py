"""Prometheus metrics: a custom collector that reads the database on every scrape.

No second copy of state: each scrape runs a handful of aggregate queries in one read transaction and
turns their rows into metric families, so what Prometheus sees is what ``evald results``, ``evald status``
and ``evald alerts`` show at that moment. Families (names and labels by Prometheus' conventions):

``evald_metric_value{run,task,stage,metric}``
    gauge: the value stored at the newest evaluated step of each series (NaN stays NaN).
``evald_checkpoint_step{run}``
    gauge: the newest step a job of the run succeeded on.
``evald_jobs{state}``
    gauge: jobs by state (pending, deferred, running, succeeded, failed, skipped), zeros included so a
    queue that empties reads 0 rather than vanishing.
``evald_alerts_firing{run}``
    gauge: alerts firing now, every known run listed (0 when none).
``evald_job_duration_seconds{task,state}``
    histogram of finished jobs' durations (succeeded and failed), its cumulative buckets counted in SQL.

A scrape that cannot read the database raises; the route answers 503, and Prometheus records the target
as down (``up == 0``) rather than stale numbers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from storage import alerting, queries
from storage.database import Database

#: Upper bounds (seconds) of the job duration buckets: from a quick subset on a small model to a full
#: evaluation of a large one.
DURATION_BUCKETS: tuple[float, ...] = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)


class DatabaseCollector(Collector):
    """Reads the families above from ``database`` on each :meth:`collect`."""

    def __init__(self, database: Database, buckets: Sequence[float] = DURATION_BUCKETS) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"duration buckets must be increasing and distinct, got {list(buckets)}")
        self._database = database
        self._buckets = tuple(float(b) for b in buckets)

    def describe(self) -> Iterator[Metric]:
        # Nothing to describe up front: registering must not query the database.
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._database.session() as session:
            latest = queries.latest_results(session)
            runs = queries.run_rows(session)
            states = queries.job_state_counts(session)
            firing = alerting.firing_counts(session)
            durations = queries.job_durations(session, self._buckets)

        value = GaugeMetricFamily(
            "evald_metric_value",
            "Value of each metric at the newest step evaluated for it",
            labels=["run", "task", "stage", "metric"],
        )
        for row in latest:
            value.add_metric([row.run, row.task, row.stage, row.metric], row.value)
        yield value

        step = GaugeMetricFamily(
            "evald_checkpoint_step", "Newest checkpoint step a job of the run succeeded on", labels=["run"]
        )
        for run in runs:
            if run.evaluated_step is not None:
                step.add_metric([run.name], run.evaluated_step)
        yield step

        jobs = GaugeMetricFamily("evald_jobs", "Evaluation jobs by state", labels=["state"])
        for state, count in states.items():
            jobs.add_metric([state], count)
        yield jobs

        alerts = GaugeMetricFamily("evald_alerts_firing", "Alerts firing now, by run", labels=["run"])
        for name, count in sorted(firing.items()):
            alerts.add_metric([name], count)
        yield alerts

        duration = HistogramMetricFamily(
            "evald_job_duration_seconds",
            "Wall time of finished evaluation jobs (claim to result)",
            labels=["task", "state"],
        )
        for found in durations:
            buckets = [(_bound(b), c) for b, c in zip(self._buckets, found.cumulative, strict=True)]
            buckets.append(("+Inf", found.count))
            duration.add_metric([found.task, found.state], buckets, sum_value=found.total_s)
        yield duration


def _bound(value: float) -> str:
    return f"{value:g}" if value != int(value) else f"{int(value)}.0"


def registry(database: Database) -> CollectorRegistry:
    """A registry of its own (not the process-wide default) holding only the database collector."""
    found = CollectorRegistry(auto_describe=False)
    found.register(DatabaseCollector(database))
    return found
