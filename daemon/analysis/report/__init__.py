"""Turning rows into what a person or a program reads: aligned tables, JSON, CSV (one module per view).

Every surface (the command line, the HTTP API, the demo, the daemon's log lines) reads them through this
package's names, ``report.status(...)``, ``report.one_line(...)``; each lives in the module named here.
"""

from daemon.analysis.report.alert_rows import alert_json, alert_steps, alerts_text
from daemon.analysis.report.cells import NO_SAMPLES, Format, cell, jsonable, one_line, table
from daemon.analysis.report.comparison_rows import COMPARISON_FIELDS, comparison, comparison_rule
from daemon.analysis.report.job_history import history
from daemon.analysis.report.result_rows import RESULT_FIELDS, metrics_by_checkpoint, result_dicts, results
from daemon.analysis.report.sample_rows import job_fields, sample_dict, samples_json, samples_text
from daemon.analysis.report.status_lines import cluster_text, resources_text, status_text
from daemon.analysis.report.status_summary import RETRYING_STATES, resources, status, with_scheduler

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
