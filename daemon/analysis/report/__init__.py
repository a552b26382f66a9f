"""Turning rows into what a person or a program reads: aligned tables, JSON, CSV (one module per view).

Every surface (the command line, the HTTP API, the demo, the daemon's log lines) reads them through this
package's names, ``report.status(...)``, ``report.one_line(...)``; each lives in the module named here and
is imported when it is first asked for, so ``evald results`` never imports the status view's config
models nor the alert view's tables (``tests/test_cli_imports.py`` counts them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from evald.lazy import export

if TYPE_CHECKING:
    from daemon.analysis.report.alert_rows import alert_json, alert_steps, alerts_text
    from daemon.analysis.report.cells import NO_SAMPLES, Format, cell, jsonable, one_line, table
    from daemon.analysis.report.comparison_rows import COMPARISON_FIELDS, comparison, comparison_rule
    from daemon.analysis.report.job_history import history
    from daemon.analysis.report.result_rows import RESULT_FIELDS, metrics_by_checkpoint, result_dicts, results
    from daemon.analysis.report.sample_rows import job_fields, sample_dict, samples_json, samples_text
    from daemon.analysis.report.status_lines import cluster_text, resources_text, status_text
    from daemon.analysis.report.status_summary import RETRYING_STATES, resources, status, with_scheduler

#: Each name's module, in this package.
_HOMES = {
    "alert_json": "alert_rows",
    "alert_steps": "alert_rows",
    "alerts_text": "alert_rows",
    "NO_SAMPLES": "cells",
    "Format": "cells",
    "cell": "cells",
    "jsonable": "cells",
    "one_line": "cells",
    "table": "cells",
    "COMPARISON_FIELDS": "comparison_rows",
    "comparison": "comparison_rows",
    "comparison_rule": "comparison_rows",
    "history": "job_history",
    "RESULT_FIELDS": "result_rows",
    "metrics_by_checkpoint": "result_rows",
    "result_dicts": "result_rows",
    "results": "result_rows",
    "job_fields": "sample_rows",
    "sample_dict": "sample_rows",
    "samples_json": "sample_rows",
    "samples_text": "sample_rows",
    "cluster_text": "status_lines",
    "resources_text": "status_lines",
    "status_text": "status_lines",
    "RETRYING_STATES": "status_summary",
    "resources": "status_summary",
    "status": "status_summary",
    "with_scheduler": "status_summary",
}


def __getattr__(name: str) -> Any:
    """``report.X``: its module imported on first use (:func:`evald.lazy.export`)."""
    return export(__name__, _HOMES, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "COMPARISON_FIELDS",
    "NO_SAMPLES",
    "RESULT_FIELDS",
    "RETRYING_STATES",
    "Format",
    "alert_json",
    "alert_steps",
    "alerts_text",
    "cell",
    "cluster_text",
    "comparison",
    "comparison_rule",
    "history",
    "job_fields",
    "jsonable",
    "metrics_by_checkpoint",
    "one_line",
    "resources",
    "resources_text",
    "result_dicts",
    "results",
    "sample_dict",
    "samples_json",
    "samples_text",
    "status",
    "status_text",
    "table",
    "with_scheduler",
]
