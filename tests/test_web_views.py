"""The dashboard's views in a real browser (Debian's Chromium driven by Playwright), each at a desktop
(1280 px) and a phone (420 px) width: every chart's newest point on screen and nothing scrolling
sideways, the alert list, deep links to a step's detail (and Back), and the paired comparison of two runs
(`evald compare`'s answer, from ``/api/v1/compare``). ``evald serve`` runs as its own process, with a
token, on tests/dashboard_data.py's runs. Screenshots of each view go to ``EVALD_SCREENSHOT_DIR`` (else
the test's tmp folder). Skipped as tests/test_web_browser.py skips where no browser is installed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import dashboard_data
from tests.web_pages import (
    ACC,
    DESKTOP,
    PHONE,
    Dashboard,
    browser,
    dashboard_on,
    open_page,
    point,
    shots,
    signed_in,
)

__all__ = ["browser"]  # the module's fixture, bound here

pytestmark = pytest.mark.slow

ALL_RUNS = "#runs=" + ",".join(dashboard_data.RUNS)
KEY = f"{dashboard_data.TASK}/full"
WIDTHS = {"1280": DESKTOP, "420": PHONE}
#: Every chart (in ``scope``) whose newest point is not wholly inside both its card and the window.
NEWEST_OFF_SCREEN = """scope => [...document.querySelectorAll(scope + ' .chart')]
    .filter(c => c.offsetParent !== null).flatMap(c => {
        const points = [...c.querySelectorAll('circle.pt')];
        if (!points.length) return [c.dataset.chart + ': no point drawn'];
        const newest = Math.max(...points.map(p => Number(p.dataset.step)));
        const card = c.getBoundingClientRect();
        return points.filter(p => Number(p.dataset.step) === newest).map(p => p.getBoundingClientRect())
            .filter(r => r.right > Math.min(innerWidth, card.right) || r.left < card.left)
            .map(r => `${c.dataset.chart}: step ${newest} at ${r.left}..${r.right}, card ${card.left}..`
                      + `${card.right}, window ${innerWidth}`);
    })"""
#: What is wider than its box: the page, each table's box (it would scroll) and each chart's card (it
#: would cut its content: a card hides what overflows).
SIDEWAYS = """() => ({page: document.scrollingElement.scrollWidth, window: innerWidth,
    boxes: [...document.querySelectorAll('.table-wrap, .chart')].filter(w => w.offsetParent !== null)
        .filter(w => w.scrollWidth > w.clientWidth)
        .map(w => w.dataset.chart || w.querySelector('table').id)})"""


@pytest.fixture(scope="module")
def dashboard(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    with dashboard_on(tmp_path_factory.mktemp("views")) as served:
        yield served


def _fits(page: Any, scope: str = "#charts") -> None:
    """Laid out at the width asked for, nothing wider than the window, every newest point on screen."""
    sideways = page.evaluate(SIDEWAYS)
    # A page laid out wider than asked (Chromium keeps a window at least 500 px wide when its size comes
    # from --window-size: a 420 px picture of it cuts the right edge) would prove nothing.
    assert sideways["window"] == page.viewport_size["width"], sideways
    assert sideways["page"] <= sideways["window"] and sideways["boxes"] == [], sideways
    assert page.evaluate(NEWEST_OFF_SCREEN, scope) == []


def _view(page: Any) -> dict[str, list[str]]:
    """The URL fragment's parameters."""
    return parse_qs(page.url.split("#", 1)[1]) if "#" in page.url else {}


def _shot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(shots(tmp_path) / name))


@pytest.mark.parametrize("width", WIDTHS)
def test_every_chart_shows_its_newest_point_and_nothing_scrolls_sideways(
    browser: Any, dashboard: Dashboard, tmp_path: Path, width: str
) -> None:
    context = signed_in(browser, dashboard, WIDTHS[width])
    errors: list[str] = []
    try:
        page = open_page(context, dashboard.url + ALL_RUNS, errors)
        page.wait_for_function("n => document.querySelectorAll('.chart polyline.line').length >= n", arg=40)
        _fits(page)
        stacked = page.evaluate("() => document.getElementById('run-table').classList.contains('stacked')")
        # The runs table fits: its rows stacked at 420 px, a table at 1280 px.
        assert stacked is (width == "420")
        assert page.locator("#run-table tbody tr").count() == len(dashboard_data.RUNS)
        _shot(page, tmp_path, f"main-{width}.png")
        page.locator(ACC).scroll_into_view_if_needed()
        _shot(page, tmp_path, f"charts-{width}.png")
        # Narrowed (a desktop window made small, a phone turned): every chart is drawn again at its new width.
        narrower = WIDTHS["420"] if width == "1280" else {"width": 360, "height": 800}
        page.set_viewport_size(narrower)
        page.wait_for_function(
            """() => [...document.querySelectorAll('.chart')].every(c =>
                Number(c.querySelector('svg.plot').getAttribute('width')) <= c.clientWidth)"""
        )
        _fits(page)
        assert not errors, errors
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_the_alert_list_shows_the_alerts_and_each_opens_its_onset_step(
    browser: Any, dashboard: Dashboard, tmp_path: Path, width: str
) -> None:
    context = signed_in(browser, dashboard, WIDTHS[width])
    errors: list[str] = []
    try:
        page = open_page(context, dashboard.url + "#runs=grpo-s2", errors)
        stored = dashboard.api.get("/api/v1/alerts").json()["items"]
        rows = page.eval_on_selector_all(
            "#alert-table tbody tr.alert-row",
            """rows => rows.map(r => ({run: r.dataset.run, step: Number(r.dataset.step),
                state: r.dataset.state, text: r.innerText}))""",
        )
        # Every seeded alert, the firing one first, each with its run, metric, rule, onset and time.
        assert [(r["run"], r["step"], r["state"]) for r in rows] == [
            ("grpo-s1", dashboard_data.ALERT_ONSET, "firing"),
            ("ppo-s1", dashboard_data.RESOLVED_ONSET, "resolved"),
        ]
        assert len(stored) == len(rows)
        for row in rows:
            (alert,) = [a for a in stored if a["run"] == row["run"]]
            for part in (alert["metric"], alert["rule"], f"step {alert['first_step']}", "fired"):
                assert part in row["text"], (part, row["text"])
        assert f"→ {dashboard_data.ALERT_LAST}" in rows[0]["text"] and "resolved" in rows[1]["text"]
        assert page.inner_text("#alerts-count").startswith("1 firing · 2 in all")
        _fits(page)
        page.locator("#alerts-box").screenshot(path=str(shots(tmp_path) / f"alerts-{width}.png"))
        page.select_option("#alerts-state", "resolved")
        assert page.locator("#alert-table tbody tr.alert-row").count() == 1
        page.select_option("#alerts-state", "")

        # A click on the onset opens that step's detail, its metric marked, and is a history entry.
        page.click("#alert-table tr.alert-row.firing a.step-link")
        page.wait_for_selector("#metrics-table tr.focus")
        view = _view(page)
        assert (view["run"], view["step"], view["metric"]) == (
            ["grpo-s1"],
            [str(dashboard_data.ALERT_ONSET)],
            ["accuracy"],
        )
        assert page.inner_text("#detail-title").startswith(f"grpo-s1 · step {dashboard_data.ALERT_ONSET}")
        assert page.get_attribute("#metrics-table tr.focus", "data-metric") == "accuracy"
        assert "drop_from_best" in page.inner_text("#detail-alerts")
        # The alert's run is drawn beside the one shown, its point at the onset ringed.
        assert page.is_checked('#run-table input[data-run="grpo-s1"]')
        selected = f'{ACC} circle.pt.selected[data-run="grpo-s1"][data-step="{dashboard_data.ALERT_ONSET}"]'
        page.wait_for_selector(selected, state="attached")
        _shot(page, tmp_path, f"alert-opened-{width}.png")
        page.go_back()
        page.wait_for_selector("#detail", state="hidden")
        assert "step" not in _view(page)
        assert not errors, errors
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_deep_link_opens_the_steps_detail_and_navigating_updates_the_url(
    browser: Any, dashboard: Dashboard, tmp_path: Path, width: str
) -> None:
    context = signed_in(browser, dashboard, WIDTHS[width])
    errors: list[str] = []
    try:
        link = "#runs=grpo-s2&run=grpo-s1&step=130&metric=accuracy&task=math"
        page = open_page(context, dashboard.url + link, errors)
        page.wait_for_selector("#metrics-table tr.focus")
        assert page.inner_text("#detail-title") == "grpo-s1 · step 130 · step_130"
        info = dashboard.api.get("/api/v1/runs/grpo-s1/steps/130").json()
        value = next(r["value"] for r in info["results"] if r["metric"] == "accuracy")
        focus = page.locator("#metrics-table tr.focus")
        assert focus.get_attribute("data-metric") == "accuracy"
        assert float(focus.locator("td.num").first.inner_text()) == pytest.approx(value, rel=1e-3)
        page.wait_for_selector(f'{ACC}.focus circle.pt.selected[data-run="grpo-s1"][data-step="130"]')
        assert page.locator(".chart.focus").count() == 1
        assert page.get_attribute("#detail-link", "href") == "#" + page.url.split("#", 1)[1]
        panel = page.locator("#detail").bounding_box()
        assert panel is not None and panel["x"] >= 0 and panel["x"] + panel["width"] <= WIDTHS[width]["width"]
        _shot(page, tmp_path, f"deep-link-{width}.png")
        view = _view(page)
        assert view["runs"] == ["grpo-s2,grpo-s1"] and view["step"] == ["130"]

        # Another step clicked: the URL names it, and Back goes to the linked one again.
        if width == "420":
            page.click("#close-detail")
            assert "step" not in _view(page)
        page.mouse.click(*point(page, ACC, "grpo-s2", 40))
        page.wait_for_selector("#detail-title:has-text('grpo-s2 · step 40')")
        assert (_view(page)["run"], _view(page)["step"]) == (["grpo-s2"], ["40"])
        page.go_back()
        if width == "420":
            page.wait_for_selector("#detail", state="hidden")
            page.go_back()
        page.wait_for_selector("#detail-title:has-text('grpo-s1 · step 130')")
        assert _view(page)["step"] == ["130"]
        assert not errors, errors
    finally:
        context.close()


def test_a_deep_link_naming_what_does_not_exist_says_so(browser: Any, dashboard: Dashboard) -> None:
    context = signed_in(browser, dashboard, DESKTOP)
    errors: list[str] = []
    try:
        page = open_page(context, dashboard.url + "#runs=grpo-s1&run=grpo-s1&step=ten", errors)
        assert "step “ten” is not a step number" in page.inner_text("#notice")
        assert page.is_hidden("#detail") and "step" not in _view(page)
        page.close()
        page = open_page(context, dashboard.url + "#runs=grpo-s1&run=nope&step=10", errors)
        assert "run “nope” is not in the database (runs: grpo-s1, grpo-s2" in page.inner_text("#notice")
        assert page.is_hidden("#detail") and "run" not in _view(page)
        page.close()
        # A step the run does not have: the panel says the server's words, the nearest steps.
        page = open_page(context, dashboard.url + "#runs=grpo-s1&run=grpo-s1&step=125", errors)
        page.wait_for_selector("#detail-metrics p.muted")
        assert "no result at step 125 (nearest steps: 100, 110, 120, 130, 140" in page.inner_text(
            "#detail-metrics"
        )
        assert not [e for e in errors if "404" not in e], errors
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_shows_both_runs_as_evald_compare_does(
    browser: Any, dashboard: Dashboard, tmp_path: Path, width: str
) -> None:
    context = signed_in(browser, dashboard, WIDTHS[width])
    errors: list[str] = []
    try:
        page = open_page(context, dashboard.url + ALL_RUNS, errors)
        page.click("#open-compare")
        page.wait_for_selector('#compare-box[data-ready="grpo-s1,grpo-s2"]')
        assert _view(page)["compare"] == ["grpo-s1,grpo-s2"]
        body = dashboard.api.get("/api/v1/compare", params={"run_a": "grpo-s1", "run_b": "grpo-s2"}).json()
        summary = page.inner_text("#compare-summary")
        assert f"{body['differ']} of {body['tested']} tested points differ" in summary, summary
        assert page.inner_text("#compare-rule") == body["rule"]
        acc = "#compare-box " + ACC
        rows = [r for r in body["rows"] if r["metric"] == "accuracy"]
        # Both runs, one point per matched step each; a diamond at each step that differs.
        for run in ("grpo-s1", "grpo-s2"):
            line = page.locator(f'{acc} polyline.line[data-run="{run}"]')
            assert line.get_attribute("data-points") == str(len(rows))
        differ = [r["step"] for r in rows if r["differs"]]
        assert differ, "the seeded collapse of grpo-s1 differs from grpo-s2"
        marks = page.eval_on_selector_all(f"{acc} path.mark", "ms => ms.map(m => Number(m.dataset.step))")
        assert marks == differ
        table = page.eval_on_selector_all(
            f"{acc} table.diffs tbody tr",
            "trs => trs.map(t => [Number(t.dataset.step), t.classList.contains('differs')])",
        )
        assert table == [[r["step"], r["differs"]] for r in rows]
        assert page.locator("#compare-box .chart").count() == len({r["metric"] for r in body["rows"]})
        # Its table of every matched step, opened, fits the card too.
        page.locator(f"{acc} details.diffs summary").click()
        _fits(page, "#compare-box")
        page.locator("#compare-box").scroll_into_view_if_needed()
        _shot(page, tmp_path, f"compare-{width}.png")
        page.locator(acc).screenshot(path=str(shots(tmp_path) / f"compare-card-{width}.png"))

        # A value in the table opens that run's step; the comparison stays as drawn beside it (the same
        # card: not asked for again), and Back closes the step only.
        page.evaluate(f"() => {{ document.querySelector('{acc}')._kept = true; }}")
        step = differ[0]
        page.click(f'{acc} table.diffs tr[data-step="{step}"] td:nth-child(3) a')
        page.wait_for_selector(f"#detail-title:has-text('grpo-s2 · step {step}')")
        view = _view(page)
        assert (view["compare"], view["run"], view["step"]) == (["grpo-s1,grpo-s2"], ["grpo-s2"], [str(step)])
        assert page.evaluate(f"() => document.querySelector('{acc}')._kept === true")
        page.go_back()
        page.wait_for_selector("#detail", state="hidden")
        assert page.is_visible("#compare-box") and _view(page)["compare"] == ["grpo-s1,grpo-s2"]

        # Another run B: the URL follows; closing is a history entry too (Back reopens it).
        page.select_option("#compare-b", "ppo-s1")
        page.wait_for_selector('#compare-box[data-ready="grpo-s1,ppo-s1"]')
        assert _view(page)["compare"] == ["grpo-s1,ppo-s1"]
        page.click("#close-compare")
        assert page.is_hidden("#compare-box") and "compare" not in _view(page)
        page.go_back()
        page.wait_for_selector('#compare-box[data-ready="grpo-s1,ppo-s1"]')
        assert not errors, errors
    finally:
        context.close()


# ---- the deep-link format itself (links.js), run in the page: any name, any step text


@pytest.fixture(scope="module")
def links(browser: Any, dashboard: Dashboard) -> Iterator[Any]:
    """A dashboard page with links.js imported as ``window.links``."""
    context = signed_in(browser, dashboard, DESKTOP)
    page = context.new_page()
    page.goto(dashboard.url + "#runs=grpo-s1")
    page.wait_for_selector("body[data-ready=true]")
    page.evaluate("async () => { window.links = await import('/static/links.js'); }")
    yield page
    context.close()


ROUND_TRIP = """([detail, compare]) => {
    const hash = window.links.withView(new URLSearchParams('runs=a,b&smooth=none'), {detail, compare});
    const view = window.links.viewFrom(new URLSearchParams(hash.toString()));
    return {detail: view.detail, compare: view.compare, problems: view.problems, runs: hash.get('runs')};
}"""
NAMES = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=20)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    run=NAMES,
    step=st.integers(0, 2**31 - 1),
    metric=st.none() | NAMES,
    task=st.none() | NAMES,
    pair=st.none() | st.tuples(NAMES, NAMES).filter(lambda p: "," not in p[0] + p[1]),
    fdr=st.floats(0.0001, 0.9999),
)
def test_a_deep_link_gives_back_the_view_it_was_made_from(
    links: Any,
    run: str,
    step: int,
    metric: str | None,
    task: str | None,
    pair: tuple[str, str] | None,
    fdr: float,
) -> None:
    detail = {"run": run, "step": step, "metric": metric, "task": task}
    compare = None if pair is None else {"a": pair[0], "b": pair[1], "fdr": fdr}
    found = links.evaluate(ROUND_TRIP, [detail, compare])
    assert found == {"detail": detail, "compare": compare, "problems": [], "runs": "a,b"}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.text(st.characters(exclude_categories=["Cs"]), max_size=12) | st.integers(-5, 2**32).map(str))
def test_a_deep_links_step_is_taken_only_when_it_is_a_whole_number(links: Any, step: str) -> None:
    view = links.evaluate("s => window.links.viewFrom(new URLSearchParams({run: 'grpo-s1', step: s}))", step)
    whole = re.fullmatch(r"[0-9]+", step) is not None and int(step) <= 2**31 - 1
    if whole:
        assert view["detail"]["step"] == int(step) and view["problems"] == []
    elif step:
        assert view["detail"] is None and len(view["problems"]) == 1
    else:
        # No step at all: a run without one is said to need it.
        assert view["detail"] is None and "without a step" in view["problems"][0]
