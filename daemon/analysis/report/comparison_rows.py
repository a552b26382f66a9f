"""``evald compare``'s result as a table, JSON or CSV, each saying the test every row was put to."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from daemon.analysis.curves import Comparison, Difference
from daemon.analysis.report.cells import Format, table

COMPARISON_FIELDS = (
    "task",
    "stage",
    "metric",
    "step",
    "value_a",
    "value_b",
    "stderr_a",
    "stderr_b",
    "diff",
    "combined_stderr",
    "test",
    "pairs",
    "test_stderr",
    "z",
    "p",
    "p_adjusted",
    "differs",
    "why_not_paired",
    "smoothed_a",
    "smoothed_b",
)


def comparison_rule(found: Comparison) -> str:
    """The test every row was put to, in words (every rendering says it)."""
    smoothing = (
        "no smoothing"
        if not found.smoothing.enabled
        else f"smoothing {found.smoothing.spec} shown for display only, never tested"
    )
    return (
        f"diff = {found.run_b} - {found.run_a} on raw values; paired z-test over shared prompts where both "
        "runs stored every graded sample of the same prompts, else independent z-test with "
        f"sqrt(stderr_a^2 + stderr_b^2); differs when the Benjamini-Hochberg adjusted p <= {found.fdr:g} "
        f"(false discovery rate over the {found.tested} point(s) tested); {smoothing}"
    )


def _difference(row: Difference, fdr: float) -> dict[str, Any]:
    test = row.test
    return {
        "task": row.task,
        "stage": row.stage,
        "metric": row.metric,
        "step": row.step,
        "value_a": row.a,
        "value_b": row.b,
        "stderr_a": row.stderr_a,
        "stderr_b": row.stderr_b,
        "diff": row.diff,
        "combined_stderr": row.combined_stderr,
        "test": None if test is None else test.kind,
        "pairs": None if test is None else test.pairs,
        "test_stderr": None if test is None else test.stderr,
        "z": None if test is None or not math.isfinite(test.z) else test.z,
        "p": None if test is None else test.p,
        "p_adjusted": row.p_adjusted,
        "differs": row.differs(fdr),
        "why_not_paired": row.why,
        "smoothed_a": row.smoothed_a,
        "smoothed_b": row.smoothed_b,
    }


def comparison(found: Comparison, fmt: Format) -> str:
    """``evald compare``'s answer in ``fmt``: JSON, CSV (one row per matched point), or a table."""
    rows = [_difference(d, found.fdr) for d in found.differences]
    if fmt == "json":
        return json.dumps(
            {
                "run_a": found.run_a,
                "run_b": found.run_b,
                "smoothing": found.smoothing.spec,
                "fdr": found.fdr,
                "tested": found.tested,
                "paired": found.paired,
                "differ": found.different,
                "rule": comparison_rule(found),
                "rows": rows,
                "unmatched": list(found.unmatched),
            },
            indent=1,
        )
    if fmt == "csv":
        buffer = io.StringIO()
        fields = ("run_a", "run_b", *COMPARISON_FIELDS, "fdr", "smoothing")
        writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        extra = {
            "run_a": found.run_a,
            "run_b": found.run_b,
            "fdr": found.fdr,
            "smoothing": found.smoothing.spec,
        }
        writer.writerows({**row, **extra} for row in rows)
        return buffer.getvalue().rstrip("\n")
    return _comparison_text(found, rows)


def _comparison_text(found: Comparison, rows: list[dict[str, Any]]) -> str:
    """The comparison as a table under its summary, with why points were not paired or not compared."""
    verdict = {True: "yes", False: "no", None: "-"}
    smoothed = found.smoothing.enabled
    headers = (
        "task",
        "stage",
        "metric",
        "step",
        found.run_a,
        found.run_b,
        *((f"{found.run_a}~", f"{found.run_b}~") if smoothed else ()),
        "diff",
        "stderr",
        "test",
        "p",
        "p_adj",
        "differs",
    )
    body = [
        (
            r["task"],
            r["stage"],
            r["metric"],
            r["step"],
            _sig(r["value_a"]),
            _sig(r["value_b"]),
            *((_sig(r["smoothed_a"]), _sig(r["smoothed_b"])) if smoothed else ()),
            f"{r['diff']:+.4g}",
            "-" if r["test_stderr"] is None else f"{r['test_stderr']:.3g}",
            "-" if r["test"] is None else r["test"] + ("" if r["pairs"] is None else f"({r['pairs']})"),
            "-" if r["p"] is None else f"{r['p']:.3g}",
            "-" if r["p_adjusted"] is None else f"{r['p_adjusted']:.3g}",
            verdict[r["differs"]],
        )
        for r in rows
    ]
    lines = [
        f"{found.run_a} vs {found.run_b}: {len(rows)} matched point(s), {found.tested} tested "
        f"({found.paired} paired), {found.different} differ at false discovery rate {found.fdr:g}",
        f"({comparison_rule(found)})",
        table(headers, body),
    ]
    if smoothed:
        lines.append(f"{found.run_a}~, {found.run_b}~: smoothed ({found.smoothing.spec}), for display only")
    reasons = sorted(
        {r["why_not_paired"] for r in rows if r["test"] == "independent" and r["why_not_paired"]}
    )
    if reasons:
        lines.append("not paired: " + "; ".join(reasons))
    untested = sorted({r["why_not_paired"] for r in rows if r["test"] is None and r["why_not_paired"]})
    if untested:
        lines.append("no verdict: " + "; ".join(untested))
    lines.extend(f"not compared: {what}" for what in found.unmatched)
    return "\n".join(lines)


def _sig(number: float | None) -> str:
    """A value with 6 significant digits (``%.6g``): no float noise, no meaningless trailing digits."""
    return "-" if number is None else f"{number:.6g}"
