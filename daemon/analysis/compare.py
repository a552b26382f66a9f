"""``evald compare``: two runs' stored results and graded samples read, then compared point by point.

The comparison itself is :func:`daemon.analysis.curves.compare` (pure); this reads what it needs: each
run's results (:func:`~daemon.analysis.run_rows.run_results`), and the samples of the matched points of
the metrics a paired test rebuilds from them.
"""

from __future__ import annotations

from daemon.analysis import curves
from daemon.analysis.run_rows import run_results
from daemon.analysis.smoothing import Smoothing
from storage.database import Database
from storage.queries import grades


def compare_runs(
    database: Database,
    run_a: str,
    run_b: str,
    *,
    task: str | None,
    stage: str | None,
    metric: str | None,
    smoothing: Smoothing,
    fdr: float,
) -> curves.Comparison:
    """Run B against run A at their matched steps, each point tested, verdicts at ``fdr``."""
    with database.session() as session:
        a, b = (run_results(session, run, task=task, stage=stage, metric=metric) for run in (run_a, run_b))
        # The samples of the matched points of metrics the samples rebuild: for the paired test.
        keys = {
            (r.task, r.stage, r.step) for r in a if r.step is not None and r.metric in curves.PAIRED_SCORES
        }
        keys &= {(r.task, r.stage, r.step) for r in b if r.step is not None}
        grades_a, grades_b = (grades.job_grades(session, run=run, keys=keys) for run in (run_a, run_b))
    return curves.compare(
        curves.curves(a),
        curves.curves(b),
        run_a=run_a,
        run_b=run_b,
        smoothing=smoothing,
        fdr=fdr,
        grades_a=grades_a,
        grades_b=grades_b,
    )
