"""How long each test file takes in `make test`, so the longest start first.

pytest-xdist hands a free process the next file (``--dist loadfile``). Its default order puts files with
many tests first; the few-test, long files (a daemon scenario, the browser) came last and ran alone while
the other processes sat idle. Longest first keeps the processes busy to the end (``--no-loadscope-reorder``
in the Makefile keeps this order). The figures only order the queue: a stale or missing one costs time,
never a test. They are the seconds per file (setup, call and teardown summed) from
`pytest -n 4 --dist loadfile -m 'not long' --durations=0` on 2026-12-02; files under 8 s are left out and
go after these, in their usual order.
"""

from __future__ import annotations

SECONDS: dict[str, int] = {
    "test_daemon.py": 160,
    # Added 2026-12-04 from the files' own runs under load (issue 33/34); re-measure with the rest.
    "test_code_daemon.py": 60,
    "test_delivery_sinks.py": 60,
    "test_executor_contract.py": 45,
    "test_code_agreement.py": 33,
    "test_mlflow_attach.py": 25,
    "test_code_sandbox.py": 14,
    "test_code_worker.py": 14,
    "test_code_cpp.py": 13,
    "test_docs.py": 10,
    # Added 2026-12-04 (issue 32: status and the dashboard's attempts), measured alone under load.
    "test_status_slurm.py": 40,
    "test_web_attempts.py": 15,
    "test_status_surfaces.py": 12,
    # Added 2026-12-06 (issue 41: content checks at scan time), measured alone under load.
    "test_content_checks_daemon.py": 65,
    "test_content_checks_property.py": 42,
    "test_content_checks.py": 17,
    "test_load_errors.py": 40,
    "test_worker_failures.py": 120,
    "test_web_browser.py": 92,
    "test_never_partial.py": 90,
    "test_layout_deepspeed.py": 88,
    "test_alerts.py": 82,
    "test_no_silent_skip.py": 61,
    "test_sampling.py": 58,
    "test_reload.py": 55,
    "test_trackers_mlflow.py": 53,
    "test_slurm_executor.py": 53,
    "test_cli.py": 52,
    "test_lm_eval_jobs.py": 50,
    "test_worker.py": 47,
    "test_layout_openrlhf.py": 43,
    "test_scheduling_daemon.py": 42,
    "test_trainer_layouts.py": 38,
    "test_layout_hf_trainer.py": 38,
    "test_worker_group.py": 37,
    "test_serve_exposure.py": 36,
    "test_lm_eval_agreement.py": 36,
    "test_poison_checkpoints.py": 34,
    "test_poison_loop.py": 31,
    "test_samples.py": 28,
    "test_watching.py": 27,
    "test_planner.py": 27,
    "test_outages.py": 25,
    "test_several_daemons.py": 24,
    "test_discovery.py": 24,
    "test_lm_eval_group.py": 22,
    "test_adoption.py": 17,
    "test_worker_environment.py": 16,
    "test_lm_eval_export.py": 16,
    "test_poison_jobs.py": 14,
    "test_trackers_offline.py": 13,
    "test_plot.py": 13,
    "test_storage.py": 11,
    "test_compare.py": 11,
    "test_checkpoint_config.py": 11,
    "test_rewards.py": 10,
    "test_result_series.py": 10,
    "test_prometheus.py": 9,
    "test_openrlhf_discovery.py": 9,
    "test_json_log.py": 9,
}


def weight(path: str) -> int:
    """The seconds of the test file at ``path`` (its name), 0 when not measured."""
    return SECONDS.get(path.rsplit("/", 1)[-1], 0)
