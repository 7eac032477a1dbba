"""Drive the running dashboard in headless Chromium: the browser test and benchmarks/dashboard.py share this.

Playwright's Python API drives the system's Chromium (Debian's ``chromium`` package) through
``executable_path``, so nothing is downloaded at test time. Imports of playwright are deferred: the
dashboard itself never needs it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Headless, and nothing that reaches the network or the user's profile: CI machines have neither.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

INSTALL_HINT = "apt-get install -y chromium && pip install playwright (do not run `playwright install`)"


@dataclass(frozen=True)
class PageSpec:
    """A page as the browser reaches it, and the texts that show its content has rendered."""

    name: str
    path: str
    expect: tuple[str, ...]


PAGES: tuple[PageSpec, ...] = (
    PageSpec("overview", "", ("Fleet overview", "Host × GPU health", "Fleet power and utilisation")),
    PageSpec("jobs", "jobs", ("C³ breakdown over steps", "Scaling across runs")),
    PageSpec("stragglers", "stragglers", ("Current suspects", "Slowest ranks")),
    PageSpec("health_sdc", "health_sdc", ("Health events over time by node", "SDC suspects")),
    PageSpec("reliability", "reliability", ("Failures by category", "Checkpoint intervals")),
    PageSpec("network", "network", ("Collectives in production", "nccl-tests history")),
    PageSpec("energy_carbon", "energy_carbon", ("GPU energy by site", "PUE over time")),
    PageSpec("teams_cost", "teams_cost", ("Usage and cost per team", "GPU-hours per team over time", "Top jobs by cost")),
    PageSpec("governance", "governance", ("Models and risk class", "EU AI Act rule matrix", "Audit reports and export bundles")),
    PageSpec("alerts", "alerts", ("Firing and recent", "Silences", "Dead letters")),
    PageSpec("service", "service", ("Roll-up stages", "Scheduled tasks", "Storage")),
)


def chromium_path() -> str | None:
    """The system Chromium: $FLEETSCOPE_CHROMIUM, Debian's /usr/bin/chromium, or one on PATH."""
    for candidate in (os.environ.get("FLEETSCOPE_CHROMIUM"), "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file():
            return candidate
    return shutil.which("chromium") or shutil.which("chromium-browser")


def missing_browser() -> str | None:
    """Why a browser run cannot happen here, or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401  # lazy: Playwright, a dev dependency
    except ImportError:
        return f"playwright (Python) is not installed: {INSTALL_HINT}"
    if chromium_path() is None:
        return f"no Chromium at /usr/bin/chromium or on PATH (set FLEETSCOPE_CHROMIUM): {INSTALL_HINT}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def dashboard_server(
    database_url: str, *, data_dir: Path | None = None, port: int | None = None, timeout_s: float = 120, log: Path | None = None
) -> Iterator[str]:
    """Run ``fleetscope dashboard`` on a free loopback port against ``database_url`` (and ``data_dir``, where
    the audit reports and exports are filed); yield its base URL."""
    port = port or free_port()
    env = {**os.environ, "FLEETSCOPE_DATABASE_URL": database_url, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if data_dir is not None:
        env["FLEETSCOPE_DATA_DIR"] = str(data_dir)
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetscope.cli", "dashboard", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"fleetscope dashboard exited with {proc.returncode}" + (f"; see {log}" if log else ""))
            try:
                with urllib.request.urlopen(base + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"fleetscope dashboard did not answer on {base} within {timeout_s:.0f} s")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            out.close()  # type: ignore[union-attr]


VIEWPORT = {"width": 1440, "height": 1800}


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright ``Browser``): ``new_page()`` on it is a fresh visitor, with no
    session or cookie of another page. Playwright's sync API allows one of these per thread at a time."""
    from playwright.sync_api import sync_playwright  # lazy: Playwright, a dev dependency

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def browser_page(width: int = VIEWPORT["width"], height: int = VIEWPORT["height"]) -> Iterator[Any]:
    """A fresh headless Chromium page (Playwright ``Page``)."""
    with chromium() as browser:
        yield browser.new_page(viewport={"width": width, "height": height})


# Streamlit marks the app root with the script's state; elements whose code is still loading show as
# skeletons; charts are drawn by vega-embed after the script finishes, into a canvas or an svg.
_SCRIPT_DONE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
_CHARTS_DRAWN = """() => document.querySelectorAll(
        '[data-testid="stSkeleton"], [data-testid="stSkeletonElement"], [data-testid="stAppSkeleton"]').length === 0
    && [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].every(e => e.querySelector('canvas, svg'))"""


class EmptyPage(Exception):
    """The page finished showing its empty state ("No data yet: ...", ``dashboard.ui.no_data``) where one of
    its key texts belongs: the store holds nothing for it, which is not a page too slow to render."""


# How long a "No data yet" notice may stand in for a key text before the page counts as empty: the last
# page's notice stays on screen until this page's script replaces it, well within this.
EMPTY_GRACE_S = 15.0


def wait_rendered(page: Any, spec: PageSpec, timeout_s: float = 60) -> None:
    """Wait until the page's script has finished, its key texts are shown, nothing is still loading and
    every chart is drawn; ``EmptyPage`` once it has finished with a "No data yet" notice instead of a key
    text (within ``EMPTY_GRACE_S``, not the whole timeout)."""
    ms = timeout_s * 1000
    empty = page.get_by_text(re.compile(r"^No data yet"))
    for text in spec.expect:
        shown = page.get_by_text(text, exact=True).first
        shown.or_(empty.first).first.wait_for(state="visible", timeout=ms)
        if shown.is_visible():
            continue
        try:
            shown.wait_for(state="visible", timeout=min(ms, EMPTY_GRACE_S * 1000))
        except Exception:  # noqa: BLE001 - playwright's TimeoutError: decided below
            page.wait_for_selector(_SCRIPT_DONE, timeout=ms)
            if shown.is_visible():
                continue
            notices = [empty.nth(i).inner_text()[:200] for i in range(empty.count())]
            if not notices:
                raise
            raise EmptyPage(f"{spec.name}: {text!r} not shown; the page says {'; '.join(notices)}") from None
    page.wait_for_selector(_SCRIPT_DONE, timeout=ms)
    page.wait_for_function(_CHARTS_DRAWN, timeout=ms)


SIGN_IN_TITLE = "Sign in to Fleetscope"


def sign_in(page: Any, token: str, timeout_s: float = 60) -> None:
    """Fill the dashboard's sign-in form (shown on every address until a session signs in) with ``token``."""
    field = page.get_by_label("API token", exact=True)
    field.wait_for(state="visible", timeout=timeout_s * 1000)
    field.fill(token)
    page.get_by_role("button", name="Sign in", exact=True).click(timeout=timeout_s * 1000)


def open_page(page: Any, base: str, spec: PageSpec, timeout_s: float = 60, query: str = "", token: str | None = None) -> float:
    """Load ``spec``'s page fresh (a new session: signed in with ``token`` first where given) and return the
    seconds until its content has rendered."""
    t0 = time.perf_counter()
    page.goto(f"{base}/{spec.path}{query}", wait_until="domcontentloaded", timeout=timeout_s * 1000)
    if token is not None:
        sign_in(page, token, timeout_s)
    wait_rendered(page, spec, timeout_s)
    return time.perf_counter() - t0


def navigate(page: Any, spec: PageSpec, timeout_s: float = 60) -> float:
    """Go to ``spec``'s page the way a user does once the app is loaded (its link in the sidebar: a script
    rerun over the open websocket, no page reload) and return the seconds until its content has rendered."""
    link = page.locator(f'[data-testid="stSidebarNav"] a[href$="/{spec.path}"]').first
    t0 = time.perf_counter()
    link.click(timeout=timeout_s * 1000)
    wait_rendered(page, spec, timeout_s)
    return time.perf_counter() - t0


def error_texts(page: Any) -> list[str]:
    """Texts of Streamlit exception and error elements on the page (none on a healthy page)."""
    loc = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]')
    return [loc.nth(i).inner_text() for i in range(loc.count())]
