"""Prometheus metrics: a custom collector that reads the database on every scrape.

No second copy of state: each scrape runs a handful of aggregate queries in one read transaction and
turns their rows into metric families, so what Prometheus sees is what ``evald results``, ``evald status``
and ``evald alerts`` show at that moment. Families (names and labels by Prometheus' conventions):

``evald_metric_value{run,task,stage,metric}``
    gauge: the value stored at the newest evaluated step of each series, in the metric's own unit (the
    README's metric table: fractions 0..1 for accuracy and rates, seconds for ``*_s``, tokens for
    lengths); NaN stays NaN, a metric with no samples (n = 0, or no value) is left out.
``evald_last_result_timestamp_seconds{run,task}``
    gauge: Unix time the results of the run's task at its newest evaluated step were stored (for "no new
    evaluation in N hours": ``time() - evald_last_result_timestamp_seconds > 3 * 3600``). Read from the
    rows ``evald_metric_value`` already reads: a second scan of every job cost 0.5 s per scrape at 100 k
    jobs; an older checkpoint evaluated later (a backfill) does not count as new.
``evald_checkpoint_step{run}``
    gauge: the newest step a job of the run succeeded on.
``evald_jobs{state}``
    gauge: jobs by state (pending, deferred, running, succeeded, failed, skipped), zeros included so a
    queue that empties reads 0 rather than vanishing.
``evald_alerts_firing{run}``
    gauge: alerts firing now, every known run listed (0 when none).
``evald_job_duration_seconds{task,state}``
    histogram of finished jobs' durations (succeeded and failed), its cumulative buckets counted in SQL.
``evald_webhook_failures_total{endpoint}``
    counter: delivery attempts that failed (no answer, or a status other than 2xx), every configured
    endpoint listed (0 when none failed).
``evald_webhook_messages{endpoint,state}``
    gauge: outbox messages by state: ``pending`` (not yet delivered, retried), ``failed`` (given up),
    ``disabled`` (its endpoint answered 410), ``delivered``.

Runs: the families labelled by run list the configured runs and any other whose newest result is at most
``[web] metrics_window_secs`` old (default 7 days), so the label does not grow with every run the
database keeps; ``evald_jobs`` and the histogram count every job.

A scrape that cannot read the database raises; the route answers 503, and Prometheus records the target
as down (``up == 0``) rather than stale numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from storage import alerting, queries
from storage.database import Database
from storage.queries import monitoring

#: Upper bounds (seconds) of the job duration buckets: from a quick subset on a small model to a full
#: evaluation of a large one.
DURATION_BUCKETS: tuple[float, ...] = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)


@dataclass(frozen=True)
class Scope:
    """Which runs the run-labelled families list, and which webhook endpoints are always listed."""

    #: The configured (watched) runs: always listed.
    watched: frozenset[str] = frozenset()
    #: Other runs are listed while their newest result is at most this old; None: every run.
    window_secs: float | None = None
    #: The configured webhook endpoints: listed with zeros before anything failed.
    endpoints: tuple[str, ...] = ()

    def runs(self, last: Mapping[tuple[str, str], datetime], now: datetime) -> set[str] | None:
        """The runs to list (None: all): the watched ones and those with a result inside the window."""
        if self.window_secs is None:
            return None
        since = now - timedelta(seconds=self.window_secs)
        return set(self.watched) | {run for (run, _), at in last.items() if at >= since}


class DatabaseCollector(Collector):
    """Reads the families above from ``database`` on each :meth:`collect`."""

    def __init__(
        self, database: Database, buckets: Sequence[float] = DURATION_BUCKETS, scope: Scope | None = None
    ) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"duration buckets must be increasing and distinct, got {list(buckets)}")
        self._database = database
        self._buckets = tuple(float(b) for b in buckets)
        self._scope = scope or Scope()

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
            webhooks = monitoring.webhook_standing(session, self._scope.endpoints)
        last = newest_result_times(latest)
        shown = self._scope.runs(last, datetime.now(UTC))

        def listed(run: str) -> bool:
            return shown is None or run in shown

        yield from _result_families(latest, last, listed)
        yield from _run_families(runs, states, firing, listed)
        yield from _webhook_families(webhooks)
        yield _duration_family(durations, self._buckets)


def _result_families(
    latest: Sequence[queries.ResultRow],
    last: Mapping[tuple[str, str], datetime],
    listed: Callable[[str], bool],
) -> Iterator[Metric]:
    """The newest results: each metric's value and samples, and when each run's task was last stored."""
    value = GaugeMetricFamily(
        "evald_metric_value",
        "Value of each metric at the newest step evaluated for it, in the metric's own unit "
        "(fractions 0..1 for accuracy and rates, seconds for *_s, tokens for lengths: README, Metrics)",
        labels=["run", "task", "stage", "metric"],
    )
    for row in latest:
        # No samples, no number (a mean over nothing is not 0); NaN, a real outcome, stays.
        if listed(row.run) and row.value is not None and row.n != 0:
            value.add_metric([row.run, row.task, row.stage, row.metric], row.value)
    yield value

    # Beside the value, so "no samples" is a sample too (0), not a series that silently stops.
    samples = GaugeMetricFamily(
        "evald_metric_samples",
        "Samples (n) behind each metric at the newest step evaluated for it; 0: no samples, so "
        "evald_metric_value has no sample for it there",
        labels=["run", "task", "stage", "metric"],
    )
    for row in latest:
        if listed(row.run) and row.n is not None:
            samples.add_metric([row.run, row.task, row.stage, row.metric], row.n)
    yield samples

    stamp = GaugeMetricFamily(
        "evald_last_result_timestamp_seconds",
        "Unix time the newest result of the run's task was stored",
        labels=["run", "task"],
    )
    for (run_name, task), at in sorted(last.items()):
        if listed(run_name):
            stamp.add_metric([run_name, task], at.timestamp())
    yield stamp


def _run_families(
    runs: Iterable[queries.RunRow],
    states: Mapping[str, int],
    firing: Mapping[str, int],
    listed: Callable[[str], bool],
) -> Iterator[Metric]:
    """Each run's newest evaluated step, the jobs by state, and the alerts firing per run."""
    step = GaugeMetricFamily(
        "evald_checkpoint_step", "Newest checkpoint step a job of the run succeeded on", labels=["run"]
    )
    for run in runs:
        if run.evaluated_step is not None and listed(run.name):
            step.add_metric([run.name], run.evaluated_step)
    yield step

    jobs = GaugeMetricFamily("evald_jobs", "Evaluation jobs by state", labels=["state"])
    for state, count in states.items():
        jobs.add_metric([state], count)
    yield jobs

    alerts = GaugeMetricFamily("evald_alerts_firing", "Alerts firing now, by run", labels=["run"])
    for name, count in sorted(firing.items()):
        if listed(name):
            alerts.add_metric([name], count)
    yield alerts


def _webhook_families(webhooks: Iterable[monitoring.EndpointStanding]) -> Iterator[Metric]:
    """Per webhook endpoint: its failed delivery attempts and its outbox messages by state."""
    failures = CounterMetricFamily(
        "evald_webhook_failures",
        "Webhook delivery attempts that failed (no answer, or a status other than 2xx)",
        labels=["endpoint"],
    )
    messages = GaugeMetricFamily(
        "evald_webhook_messages",
        "Webhook outbox messages by state (pending: not delivered yet; failed: given up; "
        "disabled: endpoint answered 410)",
        labels=["endpoint", "state"],
    )
    for standing in webhooks:
        failures.add_metric([standing.endpoint], standing.failed_attempts)
        for state, count in standing.messages.items():
            messages.add_metric([standing.endpoint, state], count)
    yield failures
    yield messages


def _duration_family(durations: Iterable[queries.DurationBuckets], bounds: Sequence[float]) -> Metric:
    """Finished jobs' durations by task and state, as cumulative buckets up to ``bounds``."""
    duration = HistogramMetricFamily(
        "evald_job_duration_seconds",
        "Wall time of finished evaluation jobs (claim to result)",
        labels=["task", "state"],
    )
    for found in durations:
        buckets = [(_bound(b), c) for b, c in zip(bounds, found.cumulative, strict=True)]
        buckets.append(("+Inf", found.count))
        duration.add_metric([found.task, found.state], buckets, sum_value=found.total_s)
    return duration


def newest_result_times(latest: Iterable[queries.ResultRow]) -> dict[tuple[str, str], datetime]:
    """Per (run, task), when the results at its newest evaluated step were stored (the latest of its
    stages and metrics there)."""
    found: dict[tuple[str, str], datetime] = {}
    for row in latest:
        key = (row.run, row.task)
        if key not in found or row.evaluated_at > found[key]:
            found[key] = row.evaluated_at
    return found


def _bound(value: float) -> str:
    return f"{value:g}" if value != int(value) else f"{int(value)}.0"


def registry(database: Database, scope: Scope | None = None) -> CollectorRegistry:
    """A registry of its own (not the process-wide default) holding only the database collector."""
    found = CollectorRegistry(auto_describe=False)
    found.register(DatabaseCollector(database, scope=scope))
    return found


def scope_of(watched: Collection[str], window_secs: float, endpoints: Collection[str]) -> Scope:
    """The scope of a config's runs, ``[web] metrics_window_secs`` and webhook names."""
    return Scope(frozenset(watched), window_secs, tuple(endpoints))
