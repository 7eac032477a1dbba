"""The dashboard in a real browser: `fleetscope dashboard` on a loopback port against the showcase world,
signed in with API tokens, every page visited in headless Chromium, key content asserted, no error element,
a screenshot of each; and what a visitor without a valid token, or with a read-only one, gets.

Needs Debian's chromium and Playwright's Python API (CI: `apt-get install -y chromium` and
`pip install playwright`; never `playwright install`, which downloads browsers). Skips with that reason
where they are missing, unless FLEETSCOPE_REQUIRE_BROWSER=1 makes a missing browser a failure.
Screenshots go to $FLEETSCOPE_TEST_ARTIFACTS/dashboard (default: test-artifacts/dashboard).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard import browser as B
from fleetscope.services import auth, telemetry
from fleetscope.services.alerting import reads as alert_reads
from fleetscope.store import Store
from governance import exports
from tests.dashboard.conftest import data_dir_of, seed_schedulers

pytestmark = pytest.mark.slow

ARTIFACTS = Path(os.environ.get("FLEETSCOPE_TEST_ARTIFACTS", B.ROOT / "test-artifacts")) / "dashboard"


SCHEDULERS: dict[str, Any] = {}  # the simulated Slurm and Kubernetes clusters seeded beside the showcase


@pytest.fixture(scope="module")
def data_dir(seeded_sqlite_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the seeded database and its reports (this module creates silences in it), with the
    simulator's Slurm and Kubernetes clusters for the Teams & Cost page (no fleet job rows: the other pages
    count the showcase's jobs)."""
    copy = tmp_path_factory.mktemp("dash-browser") / "data"
    shutil.copytree(data_dir_of(seeded_sqlite_url), copy)
    store = Store.open(f"sqlite:///{copy / 'fleetscope.store.db'}")
    try:
        SCHEDULERS["world"] = seed_schedulers(store, fleet_jobs=False)
        SCHEDULERS["end"] = telemetry.data_end(store) + dt.timedelta(microseconds=1)
    finally:
        store.engine.dispose()
    return copy


@pytest.fixture(scope="module")
def base_url(data_dir: Path) -> Iterator[str]:
    why = B.missing_browser()
    if why:
        if os.environ.get("FLEETSCOPE_REQUIRE_BROWSER") == "1":
            pytest.fail(why + " and FLEETSCOPE_REQUIRE_BROWSER=1")
        pytest.skip(why)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with B.dashboard_server(f"sqlite:///{data_dir / 'fleetscope.store.db'}", data_dir=data_dir, log=ARTIFACTS / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def tokens(data_dir: Path) -> dict[str, str]:
    """Secrets of an admin and a read-only token in the module's database, by name."""
    store = Store.open(f"sqlite:///{data_dir / 'fleetscope.store.db'}")
    try:
        return {name: auth.create_token(store.engine, name, [scope])
                for name, scope in (("browser-admin", "admin"), ("browser-reader", "read"), ("browser-revoked", "read"))}
    finally:
        store.engine.dispose()


@pytest.fixture(scope="module")
def browser(base_url: str) -> Iterator[Any]:
    with B.chromium() as b:
        yield b


@pytest.fixture
def visitor(browser: Any) -> Iterator[Any]:
    """A new visitor: a page of its own, with no session or cookie of the others."""
    context = browser.new_context(viewport=B.VIEWPORT)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture(scope="module")
def page(base_url: str, browser: Any, tokens: dict[str, str]) -> Iterator[Any]:
    """The admin's page, signed in once; the page-by-page tests move through it as a user does."""
    context = browser.new_context(viewport=B.VIEWPORT)
    p = context.new_page()
    # The first load pays for Python imports and the frontend bundle; give it room on a slow machine.
    B.open_page(p, base_url, B.PAGES[0], timeout_s=180, token=tokens["browser-admin"])
    yield p
    context.close()


@pytest.fixture
def own_page(browser: Any) -> Iterator[Any]:
    """A page in a context of its own, for a test that opens a page with a job or site in its address: that
    selection stays in its own session, and the page-by-page tests (in any order, on any worker) keep the shared
    page unselected."""
    context = browser.new_context(viewport=B.VIEWPORT)
    yield context.new_page()
    context.close()


def shows_only_the_sign_in(page: Any, timeout_s: float = 120) -> None:
    page.get_by_text(B.SIGN_IN_TITLE, exact=True).wait_for(state="visible", timeout=timeout_s * 1000)
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout_s * 1000)
    assert page.locator('[data-testid="stMetric"], [data-testid="stDataFrame"], [data-testid="stVegaLiteChart"]').count() == 0
    assert page.locator('[data-testid="stSidebarNav"], [data-testid="stSidebarUserContent"] [data-testid="stSelectbox"]').count() == 0
    for spec in B.PAGES:
        for text in spec.expect:
            assert page.get_by_text(text, exact=True).count() == 0, text


def test_without_sign_in_no_page_content_appears(base_url: str, visitor: Any) -> None:
    # First in the module, so the server has served nobody yet: a fresh server's first request for a page
    # gets the sign-in too.
    for path in ("governance", "", "jobs?job=job-llm-c", "alerts"):
        visitor.goto(f"{base_url}/{path}", wait_until="domcontentloaded", timeout=180_000)
        shows_only_the_sign_in(visitor)
    visitor.screenshot(path=str(ARTIFACTS / "sign-in.png"), full_page=True)


def test_a_wrong_token_is_refused(base_url: str, visitor: Any, tokens: dict[str, str]) -> None:
    visitor.goto(base_url, wait_until="domcontentloaded", timeout=120_000)
    B.sign_in(visitor, tokens["browser-admin"][:-4] + "abcd")
    visitor.get_by_text("Sign-in failed: that is not a valid token.", exact=True).wait_for(timeout=60_000)
    shows_only_the_sign_in(visitor)
    # The form forgot what was typed.
    assert visitor.get_by_label("API token", exact=True).input_value() == ""


def test_a_read_only_token_sees_fleet_pages_but_cannot_silence_or_export(base_url: str, visitor: Any, tokens: dict[str, str]) -> None:
    B.open_page(visitor, base_url, B.PAGES[0], timeout_s=120, token=tokens["browser-reader"])
    assert B.error_texts(visitor) == []
    assert metric(visitor, "GPUs") == "64"
    nav = visitor.locator('[data-testid="stSidebarNav"] a')
    assert [nav.nth(i).get_attribute("href").rsplit("/", 1)[-1] for i in range(nav.count())] == [
        "", "health_sdc", "reliability", "network", "energy_carbon", "teams_cost", "jobs", "stragglers", "serving", "alerts", "service"]
    visitor.get_by_text("Not shown, as they need the governance scope: Governance.", exact=True).wait_for(timeout=10_000)
    B.navigate(visitor, next(p for p in B.PAGES if p.name == "alerts"))
    assert B.error_texts(visitor) == []
    assert metric(visitor, "Firing") == "4"
    assert visitor.get_by_role("button", name="Create silence").count() == 0
    assert visitor.get_by_role("button", name="Expire silence").count() == 0
    visitor.get_by_text("Creating and expiring silences needs the admin scope", exact=False).wait_for(timeout=10_000)
    assert visitor.get_by_text("Audit reports and export bundles", exact=True).count() == 0
    assert visitor.locator('[data-testid="stDownloadButton"]').count() == 0
    visitor.screenshot(path=str(ARTIFACTS / "alerts-read-only.png"), full_page=True)


def metric(page: Any, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]').filter(has=page.get_by_text(label, exact=True)).first
    return box.locator('[data-testid="stMetricValue"]').inner_text().strip()


KEY_METRICS = {
    "overview": {"GPUs": "64", "Unhealthy": "3", "GPU energy today (UTC)": "15.2 kWh", "CO2e today": "7.2 kg"},
    "jobs": {"World size": "16 GPUs", "Steps recorded": "40", "C1 compute": "49%", "Runtime goodput": "84.6%"},
    "stragglers": {"Ranks ≥ 1.1× median compute": "1"},
    "reliability": {"Failures": "2", "Preemptions": "1"},
    "governance": {"Fail": "1"},
    "alerts": {"Firing": "4", "Dead": "1"},
}
MIN_CHARTS = {"teams_cost": 1, "overview": 3, "jobs": 5, "stragglers": 1, "health_sdc": 1, "reliability": 2, "network": 3, "energy_carbon": 2, "governance": 2}
# Pages whose every panel has data in the showcase world (the Alerts page has no silence yet; the showcase has no
# profiler traces, so the Jobs page's HTA panel says where its figures would come from).
NO_DATA_YET = {"overview": 0, "jobs": 1, "governance": 0, "alerts": 1, "teams_cost": 1}


def test_a_token_revoked_while_live_panels_refresh_ends_the_session(base_url: str, visitor: Any, tokens: dict[str, str], data_dir: Path) -> None:
    # An auto-refreshing panel reruns without app.py's gate; it checks the session itself.
    B.open_page(visitor, base_url, B.PAGES[0], timeout_s=120, token=tokens["browser-revoked"])
    visitor.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(has_text="Auto-refresh live panels").click()
    visitor.get_by_role("option", name="10 s").click()
    B.wait_rendered(visitor, B.PAGES[0])
    assert metric(visitor, "GPUs") == "64"
    store = Store.open(f"sqlite:///{data_dir / 'fleetscope.store.db'}")
    assert auth.revoke_token(store.engine, next(t["token_id"] for t in auth.list_tokens(store.engine) if t["name"] == "browser-revoked"))
    store.engine.dispose()
    # within the refresh interval plus the server's few seconds of token cache, with nothing clicked
    visitor.get_by_text("The token this session signed in with is no longer valid (revoked or expired): sign in again.", exact=True).wait_for(timeout=90_000)
    shows_only_the_sign_in(visitor)


@pytest.mark.parametrize("spec", B.PAGES, ids=[p.name for p in B.PAGES])
def test_every_page_renders_its_content(spec: B.PageSpec, base_url: str, page: Any) -> None:
    B.navigate(page, spec)  # as a user moves between pages: the sidebar's link, no reload
    page.screenshot(path=str(ARTIFACTS / f"{spec.name}.png"), full_page=True)
    assert B.error_texts(page) == []
    for label, value in KEY_METRICS.get(spec.name, {}).items():
        assert metric(page, label) == value, label
    assert page.locator('[data-testid="stVegaLiteChart"]').count() >= MIN_CHARTS.get(spec.name, 0)
    if spec.name in NO_DATA_YET:
        assert page.get_by_text("No data yet", exact=False).count() == NO_DATA_YET[spec.name]
    if spec.name == "teams_cost":  # no idle allocation is stored here: that is the one panel without data
        world, end = SCHEDULERS["world"], SCHEDULERS["end"]
        hours = sum(j.gpu_hours(end) for j in world.slurm) + sum(p.gpu_hours(end) for p in world.pods)
        assert (metric(page, "Teams"), metric(page, "GPU-hours allocated")) == ("4", f"{hours:,.1f}")
        for text in ("Usage and cost per team", "Queue wait per partition", "Top jobs by cost"):
            page.get_by_text(text, exact=True).wait_for(timeout=10_000)


def test_the_fleet_law_fit_is_drawn(base_url: str, own_page: Any, tokens: dict[str, str]) -> None:
    page = own_page
    jobs = next(p for p in B.PAGES if p.name == "jobs")
    # A reload is a new session: it signs in again and lands on the linked page.
    B.open_page(page, base_url, jobs, query="?job=job-sweep-n32", timeout_s=180, token=tokens["browser-admin"])
    assert B.error_texts(page) == []
    assert metric(page, "GPUs past which steps get slower") == "31.6"
    assert metric(page, "η of this run") == "0.44"
    page.screenshot(path=str(ARTIFACTS / "jobs-fleet-law.png"), full_page=True)


def download(page: Any, label_start: str, to: Path) -> Path:
    button = page.locator('[data-testid="stDownloadButton"] button').filter(has_text=label_start).first
    button.wait_for(state="visible", timeout=60_000)
    with page.expect_download(timeout=60_000) as info:
        button.click()
    path = to / info.value.suggested_filename
    info.value.save_as(path)
    return path


def test_reports_and_a_signed_bundle_download_and_verify(base_url: str, page: Any, data_dir: Path, tmp_path: Path) -> None:
    governance = next(p for p in B.PAGES if p.name == "governance")
    B.navigate(page, governance)
    report = json.loads(download(page, "Report (JSON", tmp_path).read_text())
    assert {m["model_name"] for m in report["models"]} == {"gpt-1.3b", "llama-7b", "loan-screen"}
    assert download(page, "Report (PDF", tmp_path).read_bytes().startswith(b"%PDF")
    bundle = download(page, "Export bundle (ZIP", tmp_path)
    assert bundle.name.startswith("fleetscope-export-") and zipfile.is_zipfile(bundle)
    # An auditor verifies it offline with the public half of the signing key.
    key = exports.load_public_key((data_dir / "signing_key.pub.pem").read_bytes())
    result = exports.verify(bundle.read_bytes(), key)
    assert result.ok, result


def test_a_silence_made_in_the_browser_mutes_the_alert(base_url: str, page: Any, data_dir: Path) -> None:
    alerts = next(p for p in B.PAGES if p.name == "alerts")
    B.navigate(page, alerts)
    page.get_by_role("textbox", name="Matchers, one per line").fill('alertname="SdcSuspect"')
    page.get_by_role("textbox", name="Comment", exact=True).fill("checking the replica by hand")
    page.get_by_role("button", name="Create silence").click()
    page.get_by_text("Silence ", exact=False).filter(has_text="created").first.wait_for(timeout=60_000)
    B.wait_rendered(page, alerts)
    assert B.error_texts(page) == []
    assert metric(page, "Muted") == "3"  # the silenced SdcSuspect, and the two repair alerts the dead GPU's XID inhibits
    silences = alert_reads.silences(Store.open(f"sqlite:///{data_dir / 'fleetscope.store.db'}"))
    # created by the signed-in token, not by anything typed in the form
    assert silences.select("state", "matchers", "created_by").rows() == [("active", 'alertname="SdcSuspect"', "browser-admin")]
    page.screenshot(path=str(ARTIFACTS / "alerts-silenced.png"), full_page=True)


def test_a_deep_link_opens_the_job(base_url: str, own_page: Any, tokens: dict[str, str]) -> None:
    page = own_page
    jobs = next(p for p in B.PAGES if p.name == "jobs")
    B.open_page(page, base_url, jobs, query="?job=job-llm-c", timeout_s=180, token=tokens["browser-admin"])
    assert B.error_texts(page) == []
    assert metric(page, "World size") == "32 GPUs"


def test_sidebar_filters(base_url: str, own_page: Any, tokens: dict[str, str]) -> None:
    page = own_page
    B.open_page(page, base_url, B.PAGES[0], timeout_s=180, token=tokens["browser-admin"])
    page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(has_text="Site").click()
    page.get_by_role("option", name="site-b").click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-testid="stMetric"]')]
            .some(m => m.innerText.startsWith('GPUs') && m.querySelector('[data-testid="stMetricValue"]').innerText.trim() === '32')""",
        timeout=60_000,
    )
    assert "site=site-b" in page.url  # the filter is in the URL, ready to share
    # All the showcase's jobs ran at site-a: the Jobs page says so instead of failing.
    B.navigate(page, B.PageSpec("jobs", "jobs", ("Jobs",)))
    page.get_by_text("No data yet: no job ran in this time range", exact=False).wait_for(timeout=60_000)
    assert B.error_texts(page) == []
    page.screenshot(path=str(ARTIFACTS / "jobs-site-b.png"), full_page=True)
