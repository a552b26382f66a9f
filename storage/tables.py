"""The tables as the reads that do without the ORM name them: SQLAlchemy's lightweight ``table()`` and
``column()`` clauses, only the columns those reads use, each with the type that reads its values.

``evald results`` spent a third of its instructions importing the ORM and mapping every model to read
four tables; through these it reads them with SQLAlchemy's core alone (:mod:`storage.queries.results`,
:mod:`storage.queries.filters`, ``run_exists``). The schema is :mod:`storage.models`' (and the
migrations'): ``tests/test_cli_imports.py`` holds every column here to the model's column of that name,
type for type.
"""

from __future__ import annotations

from sqlalchemy import Float, Integer, String, column, table

from storage.column_types import MetricFloat, UTCDateTime

RUNS = table("runs", column("id", Integer), column("name", String))
CHECKPOINTS = table(
    "checkpoints",
    column("id", Integer),
    column("run_id", Integer),
    column("name", String),
    column("step", Integer),
    column("epoch", Integer),
)
EVAL_JOBS = table(
    "eval_jobs",
    column("id", Integer),
    column("checkpoint_id", Integer),
    column("task", String),
    column("stage", String),
    column("state", String),
    column("finished_at", UTCDateTime),
)
RESULTS = table(
    "results",
    column("id", Integer),
    column("job_id", Integer),
    column("metric", String),
    column("value", MetricFloat),
    column("n", Integer),
    column("stderr", Float),
)

#: Every table here, by name.
TABLES = {t.name: t for t in (RUNS, CHECKPOINTS, EVAL_JOBS, RESULTS)}
