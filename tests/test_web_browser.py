"""The dashboard in a real browser (Debian's Chromium driven by Playwright): ``evald serve`` runs as its
own process on a database a real daemon fills (the toy model's checkpoints, evaluated by real workers)
while the page is open. Skipped with a message where no browser is installed; ``EVALD_REQUIRE_BROWSER=1``
(CI) turns the skip into a failure."""

from __future__ import annotations

import csv
import io
import itertools
import math
import re
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import httpx
import pytest

from storage import alerting, queries
from storage.database import Database
from tests import dashboard_data
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.deadlines import patient
from tests.harness import (
    DaemonProcess,
    all_jobs_done,
    running_daemon,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)
from tests.web_pages import (
    ACC,
    DESKTOP,
    PHONE,
    Dashboard,
    browser,
    dashboard_on,
    open_page,
    point,
    serving,
    shots,
    sign_in,
    signed_in,
)

__all__ = ["browser"]  # the module's fixture, bound here

pytestmark = pytest.mark.slow

#: The issue's promise: a result stored while the page is open shows within this long, without a reload.
LIVE_WITHIN_MS = 5000
#: One evaluation on a loaded CI machine (a worker process loading torch and the toy model).
JOB_TIMEOUT_S = 240
STEPS = (10, 20, 30)
PROBLEMS = 10
ACCURACY = '.chart[data-chart="arith/full/accuracy"]'
POINTS_AT_LEAST = f"""n => {{
    const line = document.querySelector('{ACCURACY} polyline.line');
    return line !== null && Number(line.dataset.points) >= n;
}}"""
SAMPLES_EQUAL = "n => document.querySelectorAll('#detail-samples .sample[data-index]').length === n"


@dataclass
class Served:
    url: str
    database: Database
    run_root: Path
    daemon: DaemonProcess
    #: Checkpoints not yet given to the daemon: the test drops them in while the page watches.
    later: list[int]


@pytest.fixture(scope="module")
def served(browser: Any, toy_run: ToyRun, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``evald serve`` and ``evald run`` on one SQLite database; the first checkpoint is in the run folder,
    the others wait for the test."""
    tmp = tmp_path_factory.mktemp("browser")
    url = f"sqlite:///{tmp / 'evald.db'}"
    upgraded(url).dispose()
    config = write_config(tmp, url, dataset=write_dataset(tmp / "arith.jsonl", PROBLEMS))
    with config.open("a") as extra:
        # A threshold every result crosses: each checkpoint raises an alert, drawn on the wall_s chart.
        extra.write("\n[alerts]\ncooldown_secs = 0\n[alerts.thresholds.wall_s]\nmin = 1000000\n")
    copy_checkpoint(toy_run.last_checkpoint, tmp / "run" / f"step_{STEPS[0]}")
    database = Database(url, read_only=True)
    try:
        with serving(config, ready="api/v1") as serve, running_daemon(config, tmp / "daemon.log") as daemon:
            yield Served(serve.url, database, tmp / "run", daemon, list(STEPS[1:]))
            assert daemon.stop() == 0
    finally:
        database.dispose()
    assert "web.started" in serve.output and "web.stopped" in serve.output


def _steps_stored(database: Database) -> int:
    with database.session() as s:
        rows = queries.result_rows(s, run="toy", metric="accuracy")
    return len({r.step for r in rows})


def _stored_at_least(database: Database, count: int) -> Callable[[], bool | None]:
    return lambda: _steps_stored(database) >= count or None


def _series(database: Database) -> dict[str, int]:
    """chart key (task/stage/metric) → points stored."""
    with database.session() as s:
        rows = queries.result_rows(s, run="toy")
    counts: dict[str, int] = {}
    for row in rows:
        if row.step is not None:
            key = f"{row.task}/{row.stage}/{row.metric}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def _drawn(page: Any) -> dict[str, int]:
    counts: dict[str, int] = page.eval_on_selector_all(
        ".chart",
        """cards => Object.fromEntries(cards.map(c => {
            const line = c.querySelector('polyline.line');
            return [c.dataset.chart, line ? Number(line.dataset.points) : 0];
        }))""",
    )
    return counts


def _screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    path = shots(tmp_path) / name
    page.evaluate("() => window.scrollTo(0, 0)")  # a sticky header shows where the page is scrolled to
    page.screenshot(path=str(path), full_page=True)
    return path


def test_dashboard_follows_the_daemon_live_and_opens_a_points_samples(
    browser: Any, served: Served, toy_run: ToyRun, tmp_path: Path
) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    try:
        page.goto(served.url)
        wait_for(
            lambda: _steps_stored(served.database) == 1 or None,
            JOB_TIMEOUT_S,
            "the first result",
            served.daemon.process,
        )
        page.wait_for_function(POINTS_AT_LEAST, arg=1, timeout=patient(LIVE_WITHIN_MS / 1000) * 1000)
        # Live: each checkpoint evaluated while the page is open shows on it within 5 s, with no reload.
        for count, step in enumerate(served.later, start=2):
            copy_checkpoint(toy_run.last_checkpoint, served.run_root / f"step_{step}")
            wait_for(
                _stored_at_least(served.database, count),
                JOB_TIMEOUT_S,
                f"the result of step {step}",
                served.daemon.process,
            )
            stored_at = time.monotonic()
            page.wait_for_function(POINTS_AT_LEAST, arg=count, timeout=patient(LIVE_WITHIN_MS / 1000) * 1000)
            assert time.monotonic() - stored_at < patient(LIVE_WITHIN_MS / 1000)
        wait_for(lambda: all_jobs_done(served.database, len(STEPS)), JOB_TIMEOUT_S, "every job")

        # Every stored series is one chart with one point per evaluated checkpoint.
        expected = _series(served.database)
        page.wait_for_function(
            "n => document.querySelectorAll('.chart polyline.line').length === n", arg=len(expected)
        )
        page.wait_for_function(
            "e => Object.entries(e).every(([k, n]) => Number(document.querySelector("
            '`.chart[data-chart="${k}"] polyline.line`).dataset.points) === n)',
            arg=expected,
            timeout=patient(LIVE_WITHIN_MS / 1000) * 1000,
        )
        assert _drawn(page) == expected
        assert set(expected.values()) == {len(STEPS)}
        accuracy = page.locator(ACCURACY)
        vertices = accuracy.locator("polyline.line").get_attribute("points")
        assert vertices is not None and len(vertices.split()) == len(STEPS)
        assert accuracy.locator("circle.pt").count() == len(STEPS)
        assert accuracy.locator("circle.best").count() == 1
        with served.database.session() as s:
            alerts = [a for a in alerting.alert_rows(s, run="toy") if a.metric == "wall_s"]
        # One firing alert (repeats update it), marked at the step where it fired.
        assert len(alerts) == 1 and alerts[0].state == "firing"
        wall = page.locator('.chart[data-chart="arith/full/wall_s"]')
        assert wall.locator(f'g.alert.firing[data-step="{alerts[0].step}"]').count() == 1
        assert accuracy.locator("g.alert").count() == 0

        # Click the newest point and read that checkpoint's metrics and samples.
        last = STEPS[-1]
        accuracy.locator(f'circle.pt[data-step="{last}"]').click()
        page.wait_for_selector("#samples-summary")
        assert f"step {last}" in page.inner_text("#detail-title")
        assert page.locator("#metrics-table tbody tr").count() == len(expected)
        with served.database.session() as s:
            wrong = queries.job_samples(s, run="toy", step=last, task="arith", wrong_only=True)
            every = queries.job_samples(s, run="toy", step=last, task="arith")
        cards = page.locator("#detail-samples .sample[data-index]")
        assert cards.count() == len(wrong.samples)
        assert all(not s.correct for s in wrong.samples)
        page.uncheck("#wrong-only")
        page.wait_for_function(SAMPLES_EQUAL, arg=len(every.samples))
        assert len(every.samples) == PROBLEMS
        assert cards.first.locator("pre").first.inner_text() == every.samples[0].prompt
        page.check("#wrong-only")
        page.wait_for_function(SAMPLES_EQUAL, arg=len(wrong.samples))

        # Smoothing from the shared function: the raw curve stays, faint, behind the smoothed one.
        page.select_option("#smooth-kind", "ema")
        # Attached, not "visible": a flat curve's line has no height, which Playwright counts as hidden.
        page.wait_for_selector(f"{ACCURACY} polyline.raw", state="attached")
        assert "smooth=ema" in page.url
        assert _drawn(page) == expected
        shot = _screenshot(page, tmp_path, "dashboard.png")
        assert shot.stat().st_size > 10_000
        assert not errors, errors
    finally:
        page.close()


def test_a_second_page_opens_with_its_state_from_the_url(
    browser: Any, served: Served, tmp_path: Path
) -> None:
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    try:
        page.goto(served.url + "#runs=toy&smooth=window:3&filter=accuracy")
        page.wait_for_selector("body[data-ready=true]")
        assert page.locator(".chart").count() == 1
        assert page.locator(f"{ACCURACY} polyline.raw").count() == 1
        assert page.input_value("#window-width") == "3"
        _screenshot(page, tmp_path, "filtered.png")
    finally:
        page.close()


# ---- the dashboard's charts, runs and exports, on a database of four runs (tests/dashboard_data.py)

ALL_RUNS = "#runs=" + ",".join(dashboard_data.RUNS)
KEY = f"{dashboard_data.TASK}/full"
TOKENS = f'.chart[data-chart="{KEY}/tokens_per_s"]'
PERPLEXITY = f'.chart[data-chart="{KEY}/perplexity"]'
EMPTY = f'.chart[data-chart="{KEY}/response_length_correct"]'
#: Each chart's tick labels as boxes: x ticks (left, right) and y ticks (top, bottom), in page pixels.
TICK_BOXES = """cards => cards.map(c => {
    const box = (sel, a, b) => [...c.querySelectorAll(sel)]
        .map(t => t.getBoundingClientRect()).map(r => [r[a], r[b]]);
    return {key: c.dataset.chart, x: box('g.axis.x text.tick', 'left', 'right'),
            y: box('g.axis.y text.tick', 'top', 'bottom')};
})"""


@pytest.fixture(scope="module")
def dashboard(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """``evald serve`` with a token on the four runs; the API read with the token as a client would."""
    with dashboard_on(tmp_path_factory.mktemp("dashboard")) as served:
        yield served


def _ticks_readable(page: Any) -> list[str]:
    """Every chart has at least four labelled ticks on each axis and no two labels touch."""
    problems = []
    for chart in page.eval_on_selector_all(".chart", TICK_BOXES):
        for axis in ("x", "y"):
            boxes = sorted(chart[axis])
            if len(boxes) < 4:
                problems.append(f"{chart['key']}: {len(boxes)} {axis} ticks")
            for (_, end), (start, _) in itertools.pairwise(boxes):
                if start < end + 2:
                    problems.append(f"{chart['key']}: {axis} tick labels overlap ({end} > {start})")
    return problems


def _labels(page: Any, chart: str, axis: str) -> list[str]:
    labels: list[str] = page.locator(f"{chart} g.axis.{axis} text.tick").all_text_contents()
    return labels


def _domain(page: Any, chart: str) -> tuple[float, float, float, float]:
    data = page.eval_on_selector(
        f"{chart} svg.plot", "s => [s.dataset.x0, s.dataset.x1, s.dataset.y0, s.dataset.y1]"
    )
    x0, x1, y0, y1 = (float(v) for v in data)
    return x0, x1, y0, y1


def _tooltip(page: Any, chart: str) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = page.eval_on_selector_all(
        f"{chart} .tooltip .tip-row", "rows => rows.map(r => ({...r.dataset, cls: r.className}))"
    )
    return rows


def _save(page: Any, chart: str, fmt: str) -> tuple[bytes, dict[str, Any]]:
    with page.expect_download() as info:
        page.click(f"{chart} button.dl.{fmt}")
    download = info.value
    path = download.path()
    assert path is not None
    record = page.evaluate("() => window.evald.downloads[window.evald.downloads.length - 1]")
    assert record["name"] == download.suggested_filename
    return Path(path).read_bytes(), record


def test_login_page_is_styled_and_its_stylesheet_is_the_one_open_path(
    browser: Any, dashboard: Dashboard, tmp_path: Path
) -> None:
    # Open without the token: the login form's stylesheet; still closed: the dashboard's.
    anonymous = httpx.get(dashboard.url + "login.css", timeout=10)
    assert anonymous.status_code == 200 and anonymous.headers["content-type"].startswith("text/css")
    assert "body.login" in anonymous.text
    closed = httpx.get(dashboard.url + "static/dashboard.css", timeout=10, follow_redirects=False)
    assert closed.status_code == 303 and closed.headers["location"] == "/login"
    for name, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        context = browser.new_context(viewport=viewport)
        try:
            page = context.new_page()
            page.goto(dashboard.url)
            assert page.url == dashboard.url + "login"
            style = page.eval_on_selector(
                "form",
                """f => { const s = getComputedStyle(f), b = getComputedStyle(document.body);
                    const r = f.getBoundingClientRect();
                    return {bg: s.backgroundColor, radius: s.borderRadius, body: b.display,
                            left: r.left, right: r.right,
                            button: getComputedStyle(f.querySelector('button')).backgroundColor}; }""",
            )
            assert style["bg"] == "rgb(255, 255, 255)" and style["radius"] == "10px", style
            assert style["body"] == "grid" and style["button"] == "rgb(31, 78, 121)", style
            # Centred and inside the screen at both widths.
            assert style["left"] > 0 and style["right"] < viewport["width"], style
            assert abs(style["left"] - (viewport["width"] - style["right"])) < 2, style
            _screenshot(page, tmp_path, f"login-{name}.png")
            sign_in(page, dashboard.url, dashboard.data.token)
            page.wait_for_selector("body[data-ready=true]")
        finally:
            context.close()


def test_dashboard_axes_scales_zoom_tooltip_sections_groups_runs_and_downloads(
    browser: Any, dashboard: Dashboard, tmp_path: Path
) -> None:
    context = signed_in(browser, dashboard, DESKTOP)
    errors: list[str] = []
    try:
        page = open_page(context, dashboard.url + ALL_RUNS, errors)
        runs = dashboard_data.RUNS
        page.wait_for_function(
            "n => document.querySelectorAll('.chart[data-chart$=\"/accuracy\"] polyline.line').length === n",
            arg=len(runs),
        )

        # Axis titles, and readable ticks on every chart.
        assert page.text_content(f"{ACC} text.axis-title.x") == "step"
        assert page.text_content(f"{ACC} text.axis-title.y") == "accuracy"
        assert page.locator(".chart").count() == 10
        assert page.locator(".chart text.axis-title.x").count() == 10
        assert not _ticks_readable(page), _ticks_readable(page)

        # The x axis: step, wall time, time since the run's first result (tick labels follow).
        steps = _labels(page, ACC, "x")
        assert all(label.isdigit() for label in steps), steps
        page.select_option("#x-axis", "wall")
        assert "wall time" in page.text_content(f"{ACC} text.axis-title.x")
        wall = _labels(page, ACC, "x")
        assert wall != steps and all(re.fullmatch(r"\d\d:\d\d", label) for label in wall), wall
        page.select_option("#x-axis", "relative")
        assert page.text_content(f"{ACC} text.axis-title.x") == "time since the run's first result"
        relative = _labels(page, ACC, "x")
        assert all(re.fullmatch(r"\d+(s|m|h\d\dm|h)", label) for label in relative), relative
        # Stored a minute per step apart over 150 steps: 2h30m from the first result to the last.
        x0, x1, _, _ = _domain(page, ACC)
        assert x0 <= 0 and 150 * 60 <= x1 < 170 * 60, (x0, x1)
        assert not _ticks_readable(page), _ticks_readable(page)
        assert "x=relative" in page.url
        page.select_option("#x-axis", "step")
        assert _labels(page, ACC, "x") == steps

        # Log scale: perplexity spans four decades; ticks become powers of ten.
        linear = _labels(page, PERPLEXITY, "y")
        page.select_option("#y-scale", "log")
        logs = [float(v) for v in _labels(page, PERPLEXITY, "y")]
        assert logs != [float(v) for v in linear] and len(logs) >= 4
        assert all(math.log10(v) == round(math.log10(v)) for v in logs), logs
        assert "(log scale)" in page.text_content(f"{PERPLEXITY} text.axis-title.y")
        assert not _ticks_readable(page), _ticks_readable(page)
        page.select_option("#y-scale", "linear")
        assert _labels(page, PERPLEXITY, "y") == linear

        # Ignore outliers: one tokens/s glitch of 900,000 no longer sets the scale; it is marked at the edge.
        assert _domain(page, TOKENS)[3] > 800_000
        page.check("#outliers")
        top = _domain(page, TOKENS)[3]
        assert top < 2_000, top
        assert page.locator(f"{TOKENS} path.off-scale").count() == 1
        assert "outside the scale" in page.inner_text(f"{TOKENS} .legend")
        page.uncheck("#outliers")

        # A mean over no sample (n = 0) is skipped, never drawn as 0.
        empty = page.locator(f'{EMPTY} polyline.line[data-run="grpo-s1"]')
        assert empty.get_attribute("data-points") == str(len(dashboard_data.STEPS))
        assert empty.get_attribute("data-drawn") == str(len(dashboard_data.STEPS) - 1)
        gap = f'{EMPTY} circle.pt[data-run="grpo-s1"][data-step="{dashboard_data.EMPTY_STEP}"]'
        assert page.locator(gap).count() == 0
        assert _domain(page, EMPTY)[2] > 100  # the scale does not reach down to a fake 0
        # Not a silent gap: a mark on the axis at that step, and the note names the step (issue 31).
        mark = page.locator(
            f'{EMPTY} circle.no-samples[data-run="grpo-s1"][data-step="{dashboard_data.EMPTY_STEP}"]'
        )
        assert mark.count() == 1
        assert "no samples (n = 0)" in (mark.locator("title").text_content() or "")
        note = page.inner_text(f"{EMPTY} .legend .note")
        assert f"no samples (n = 0), so no value, at step {dashboard_data.EMPTY_STEP} (grpo-s1)" in note, note
        page.locator(EMPTY).screenshot(path=str(shots(tmp_path) / "no-samples.png"))

        # The alert's marker at its onset, its bar to the last step it was seen at.
        alert = dashboard.api.get("/api/v1/alerts", params={"run": "grpo-s1"}).json()["items"][0]
        onset = alert.get("first_step", alert["step"])
        assert onset == dashboard_data.ALERT_ONSET
        marker = page.locator(f'{ACC} g.alert.firing[data-step="{onset}"]')
        assert marker.count() == 1 and marker.locator("rect").count() == 1

        # The tooltip lists every run at the hovered step, with the API's values.
        page.mouse.move(*point(page, ACC, "grpo-s2", 80))
        rows = _tooltip(page, ACC)
        assert {r["run"] for r in rows} == set(runs), rows
        for row in rows:
            s = dashboard.series(row["run"], "accuracy")
            assert float(row["value"]) == s["value"][s["step"].index(80)] and row["step"] == "80"
        assert page.inner_text(f"{ACC} .tooltip .tip-head") == "step 80"
        page.mouse.move(0, 0)

        # Drag to zoom (x only for a flat drag), double-click resets; so does the button.
        whole = _domain(page, ACC)
        start, end = point(page, ACC, "grpo-s1", 50), point(page, ACC, "grpo-s1", 100)
        page.mouse.move(*start)
        page.mouse.down()
        page.mouse.move(end[0], start[1] + 5, steps=5)
        page.mouse.up()
        zoomed = _domain(page, ACC)
        assert abs(zoomed[0] - 50) < 1 and abs(zoomed[1] - 100) < 1, zoomed
        assert _labels(page, ACC, "x") != steps and len(_labels(page, ACC, "x")) >= 4
        assert page.locator(f"{ACC} button.reset").is_visible()
        page.dblclick(f"{ACC} svg.plot", position={"x": 200, "y": 100})
        assert _domain(page, ACC) == whole and _labels(page, ACC, "x") == steps
        assert page.locator(f"{ACC} button.reset").is_hidden()
        page.mouse.move(*start)
        page.mouse.down()
        page.mouse.move(end[0], start[1], steps=5)
        page.mouse.up()
        assert _domain(page, ACC) != whole
        page.click(f"{ACC} button.reset")
        assert _domain(page, ACC) == whole

        # Sections: quality, length and behaviour, system; a pin moves a chart to the top, kept in the URL
        # and in localStorage.
        sections = page.eval_on_selector_all(
            ".section:not([hidden])",
            """ss => Object.fromEntries(ss.map(s => [s.dataset.section,
                [...s.querySelectorAll('.chart')].map(c => c.dataset.chart.split('/')[2])]))""",
        )
        assert sections == {
            "quality": ["accuracy", "pass@4", "perplexity", "reward"],
            "behaviour": ["response_length", "response_length_correct"],
            "system": ["latency_p50_s", "load_s", "peak_memory_mb", "tokens_per_s"],
        }, sections
        page.click(f"{TOKENS} button.pin")
        assert page.locator(f'.section[data-section="pinned"] {TOKENS}').count() == 1
        assert page.eval_on_selector(".section:not([hidden])", "s => s.dataset.section") == "pinned"
        assert "pins=math%2Ffull%2Ftokens_per_s" in page.url
        assert page.evaluate("() => localStorage.getItem('evald.pins')") == '["math/full/tokens_per_s"]'
        assert page.get_attribute(f"{TOKENS} button.pin", "aria-pressed") == "true"

        # The run table: every run with its [[runs]] config as the API gives it.
        listed = dashboard.api.get("/api/v1/runs").json()["items"]
        assert page.locator("#run-table tbody tr").count() == len(runs)
        for run in listed:
            row = page.locator(f'#run-table tbody tr[data-run="{run["name"]}"]')
            assert row.locator('td[data-key="config.freq_steps"]').inner_text() == str(
                run["config"]["freq_steps"]
            )
            assert row.locator('td[data-key="config.root"]').inner_text() == run["config"]["root"]

        # Groups: the three seeds of grpo as their mean with a ± 1 std band; the tooltip gives mean ± std.
        page.select_option("#group-by", "seed")
        assert "group=seed" in page.url
        mean = page.locator(f'{ACC} polyline.group-mean[data-run="grpo"]')
        assert mean.get_attribute("data-runs") == "grpo-s1,grpo-s2,grpo-s3"
        assert (
            page.locator(f'{ACC} polyline.group-mean[data-run="ppo"]').get_attribute("data-runs") == "ppo-s1"
        )
        assert page.locator(f'{ACC} polygon.band.group[data-run="grpo"]').count() == 1
        assert page.locator(f"{ACC} polyline.member").count() == len(runs)
        assert page.locator('#run-table td[data-key="group"]').all_inner_texts() == [
            "grpo",
            "grpo",
            "grpo",
            "ppo",
        ]
        page.mouse.move(*point(page, ACC, "grpo", 80))
        tip = {r["run"]: r for r in _tooltip(page, ACC)}
        values = [dashboard.series(r, "accuracy") for r in runs[:3]]
        at80 = [s["value"][s["step"].index(80)] for s in values]
        assert math.isclose(float(tip["grpo"]["mean"]), statistics.mean(at80), rel_tol=1e-12)
        assert math.isclose(float(tip["grpo"]["std"]), statistics.stdev(at80), rel_tol=1e-9)
        assert {"grpo-s1", "grpo-s2", "grpo-s3", "ppo-s1"} <= set(tip) and "member" in tip["grpo-s1"]["cls"]
        # The viewport as it is (a full-page shot scrolls, and the tooltip goes with the pointer).
        page.screenshot(path=str(shots(tmp_path) / "desktop-groups.png"))
        page.mouse.move(0, 0)
        page.select_option("#group-by", "config:freq_steps")
        assert (
            page.locator(f'{ACC} polyline.group-mean[data-run="freq_steps=10"]').get_attribute("data-runs")
            == "grpo-s1,grpo-s2,grpo-s3"
        )
        page.select_option("#group-by", "none")

        # Downloads: PNG and SVG of the chart, its data as CSV equal to the API's points.
        png, record = _save(page, ACC, "png")
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and record["type"] == "image/png", record
        (shots(tmp_path) / "accuracy-download.png").write_bytes(png)
        svg, record = _save(page, ACC, "svg")
        assert svg.startswith(b'<?xml version="1.0"') and record["type"] == "image/svg+xml"
        root = ElementTree.fromstring(svg)
        texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
        assert "accuracy · math · full" in texts and "step" in texts and "accuracy" in texts
        assert len(list(root.iter("{http://www.w3.org/2000/svg}polyline"))) >= len(runs)
        raw, record = _save(page, ACC, "csv")
        assert record["type"] == "text/csv" and record["name"] == "accuracy_math_full.csv"
        rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8"))))
        expected = []
        for run in runs:
            s = dashboard.series(run, "accuracy")
            for i, step in enumerate(s["step"]):
                expected.append((run, step, s["value"][i], s["stderr"][i], s["n"][i], s["checkpoint"][i]))
        got = [
            (r["run"], int(r["step"]), float(r["value"]), float(r["stderr"]), int(r["n"]), r["checkpoint"])
            for r in rows
        ]
        assert got == expected
        _screenshot(page, tmp_path, "desktop.png")
        assert not errors, errors
    finally:
        context.close()


def test_a_shared_url_with_a_bad_smoothing_says_so_and_draws_with_the_default(
    browser: Any, dashboard: Dashboard, tmp_path: Path
) -> None:
    context = signed_in(browser, dashboard, DESKTOP)
    # A pin kept in this browser from an earlier visit (the URL names none).
    context.add_init_script("localStorage.setItem('evald.pins', JSON.stringify(['math/full/accuracy']))")
    errors: list[str] = []
    try:
        page = open_page(context, dashboard.url + "#runs=grpo-s1&smooth=ema:5", errors)
        notice = page.inner_text("#notice")
        assert "ema:5" in notice and "not valid" in notice and "“none”" in notice, notice
        assert page.is_visible("#notice")
        assert page.locator(".chart polyline.line").count() == 10
        assert page.input_value("#smooth-kind") == "none"
        assert "smooth=none" in page.url
        assert page.inner_text("#live").startswith("live")
        assert page.locator(f'.section[data-section="pinned"] {ACC}').count() == 1
        _screenshot(page, tmp_path, "bad-smooth.png")
        page.click("#notice-close")
        assert page.is_hidden("#notice")
        assert not errors, errors
    finally:
        context.close()


def test_at_phone_width_cards_fit_ticks_stay_readable_and_the_detail_panel_is_on_screen(
    browser: Any, dashboard: Dashboard, tmp_path: Path
) -> None:
    context = signed_in(browser, dashboard, PHONE)
    errors: list[str] = []
    try:
        page = open_page(context, dashboard.url + ALL_RUNS + "&x=wall", errors)
        width = PHONE["width"]
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width
        overflow = page.eval_on_selector_all(
            ".chart",
            f"""cs => cs.filter(c => {{ const r = c.getBoundingClientRect();
                return r.left < 0 || r.right > {width} || c.scrollWidth > c.clientWidth
                    || c.querySelector('svg.plot').getBoundingClientRect().right > r.right; }})
                .map(c => c.dataset.chart)""",
        )
        assert overflow == []
        assert not _ticks_readable(page), _ticks_readable(page)
        # The tooltip of the newest step (at the right edge) stays inside the screen.
        page.mouse.move(*point(page, ACC, "grpo-s1", dashboard_data.STEPS[-1]))
        tip = page.locator(f"{ACC} .tooltip").bounding_box()
        assert tip is not None and tip["x"] >= 0 and tip["x"] + tip["width"] <= width, tip
        assert len(_tooltip(page, ACC)) == len(dashboard_data.RUNS)
        _screenshot(page, tmp_path, "phone.png")
        # A click opens the checkpoint's detail over the charts, wholly on screen.
        page.mouse.click(*point(page, ACC, "grpo-s1", 80))
        page.wait_for_selector("#detail-title:has-text('step 80')")
        page.wait_for_selector("#metrics-table")
        page.wait_for_selector("#samples-summary")
        panel = page.locator("#detail").bounding_box()
        assert panel is not None
        assert panel["x"] >= 0 and panel["x"] + panel["width"] <= width, panel
        assert panel["y"] >= 0 and panel["y"] + panel["height"] <= PHONE["height"], panel
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width
        page.screenshot(path=str(shots(tmp_path) / "phone-detail.png"))
        page.click("#close-detail")
        assert page.is_hidden("#detail")
        assert not errors, errors
    finally:
        context.close()
