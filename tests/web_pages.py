"""What the dashboard's browser tests share: Debian's Chromium driven by Playwright (one browser a module),
``evald serve`` as its own process, and the page helpers of the views the tests open.

Skipped with a message where no browser is installed; ``EVALD_REQUIRE_BROWSER=1`` (``make test``, CI)
turns the skip into a failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import dashboard_data
from tests.deadlines import Deadline, patient
from tests.harness import free_port

CHROMIUM = os.environ.get("EVALD_CHROMIUM", "/usr/bin/chromium")
#: Flags for a headless Chromium in a container with no network: no sandbox (root), nothing phoning home.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    # Chromium 156 renders the address bar's popups as WebUI pages, preloaded in a renderer of their own
    # for every window (a context's page is one): 33 renderers and 20 CPU-s a test run, for a popup a
    # headless browser never shows.
    "--disable-features=WebUIOmniboxPopup,WebUIOmniboxAimPopup",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 420, "height": 860}
#: The accuracy chart of tests/dashboard_data.py's task: drawn once the page has loaded its data.
ACC = f'.chart[data-chart="{dashboard_data.TASK}/full/accuracy"]'


def browser_or_skip() -> Any:
    """Playwright's ``sync_playwright``, or the test skipped (failed under ``EVALD_REQUIRE_BROWSER=1``)."""
    problem = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem = "the playwright package is not installed (pip install playwright)"
    if problem is None and not Path(CHROMIUM).exists():
        problem = f"no Chromium at {CHROMIUM} (apt-get install -y chromium, or set EVALD_CHROMIUM)"
    if problem is not None:
        message = f"browser test skipped: {problem}"
        if os.environ.get("EVALD_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return sync_playwright


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module's tests; each test opens its own context."""
    sync_playwright = browser_or_skip()
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def wait_http(url: str, process: subprocess.Popen[str], timeout: float = 60) -> None:
    """Until ``url`` answers 200, failing with the server's output if it exits first."""
    deadline = Deadline(timeout)
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None, process.communicate()[0][-3000:]
        assert not deadline.expired(), f"{url} did not answer in {timeout} s"
        time.sleep(0.2)


@dataclass
class Serve:
    """An ``evald serve`` process: its base URL, and all it wrote once it stopped."""

    url: str
    output: str = field(default="")


@contextmanager
def serving(config: Path, *, token: str | None = None, ready: str = "login") -> Iterator[Serve]:
    """``evald serve`` on ``config`` (with ``token`` as its web token), answering at ``ready``; stopped
    with SIGTERM at the end, which it must survive with status 0."""
    port = free_port()
    env = {**os.environ, **({"EVALD_TEST_WEB_TOKEN": token} if token else {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "daemon", "--config", str(config), "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    served = Serve(f"http://127.0.0.1:{port}/")
    try:
        wait_http(served.url + ready, process)
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        served.output = process.communicate(timeout=patient(30))[0]
        assert process.returncode == 0, served.output[-3000:]


@dataclass
class Dashboard:
    url: str
    data: dashboard_data.DashboardData
    api: httpx.Client

    def series(self, run: str, metric: str) -> dict[str, Any]:
        body = self.api.get(f"/api/v1/runs/{run}/series", params={"metric": metric}).json()
        (found,) = body["series"]
        return dict(found)


@contextmanager
def dashboard_on(folder: Path) -> Iterator[Dashboard]:
    """``evald serve`` with a token on tests/dashboard_data.py's four runs, built in ``folder``; the API
    read with the token as a client would."""
    data = dashboard_data.build(folder)
    with serving(data.config, token=data.token) as served:
        headers = {"Authorization": f"Bearer {data.token}"}
        with httpx.Client(base_url=served.url, headers=headers, timeout=30) as client:
            yield Dashboard(served.url, data, client)


def shots(tmp_path: Path) -> Path:
    """Where screenshots go: ``EVALD_SCREENSHOT_DIR``, else the test's folder."""
    folder = Path(os.environ.get("EVALD_SCREENSHOT_DIR", str(tmp_path)))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sign_in(page: Any, url: str, token: str) -> None:
    """Through the login form on ``page`` (at ``url`` + ``login``), until the dashboard is shown."""
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    # The dashboard writes its state into the URL's fragment as soon as it has loaded (history.replaceState):
    # a busy test process can first look after that, so the page at "/" counts whatever its fragment.
    page.wait_for_url(lambda at: at.split("#", 1)[0] == url)


def signed_in(browser: Any, dashboard: Dashboard, viewport: dict[str, int]) -> Any:
    """A browser context holding the login cookie (its own login through the form)."""
    context = browser.new_context(viewport=viewport, accept_downloads=True)
    page = context.new_page()
    page.goto(dashboard.url + "login")
    sign_in(page, dashboard.url, dashboard.data.token)
    page.close()
    return context


def open_page(context: Any, url: str, errors: list[str]) -> Any:
    """``url`` in a new page of ``context``, loaded and its accuracy chart drawn; the page's errors and
    console errors go to ``errors``."""
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    page.wait_for_selector(f"{ACC} polyline.line", state="attached")
    return page


def point(page: Any, chart: str, run: str, step: int) -> tuple[float, float]:
    """The page coordinates of ``run``'s point at ``step`` on ``chart``, scrolled into view."""
    found = page.locator(f'{chart} circle.pt[data-run="{run}"][data-step="{step}"]')
    found.scroll_into_view_if_needed()  # the mouse reaches what is on screen only
    box = found.bounding_box()
    assert box is not None
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
