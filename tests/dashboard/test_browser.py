"""The dashboard in a real browser: `fleetscope dashboard` on a loopback port against the showcase world,
every page visited in headless Chromium, key content asserted, no error element, a screenshot of each.

Needs Debian's chromium and Playwright's Python API (CI: `apt-get install -y chromium` and
`pip install playwright`; never `playwright install`, which downloads browsers). Skips with that reason
where they are missing, unless FLEETSCOPE_REQUIRE_BROWSER=1 makes a missing browser a failure.
Screenshots go to $FLEETSCOPE_TEST_ARTIFACTS/dashboard (default: test-artifacts/dashboard).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard import browser as B

pytestmark = pytest.mark.slow

ARTIFACTS = Path(os.environ.get("FLEETSCOPE_TEST_ARTIFACTS", B.ROOT / "test-artifacts")) / "dashboard"


@pytest.fixture(scope="module")
def base_url(seeded_sqlite_url: str) -> Iterator[str]:
    why = B.missing_browser()
    if why:
        if os.environ.get("FLEETSCOPE_REQUIRE_BROWSER") == "1":
            pytest.fail(why + " and FLEETSCOPE_REQUIRE_BROWSER=1")
        pytest.skip(why)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with B.dashboard_server(seeded_sqlite_url, log=ARTIFACTS / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def page(base_url: str) -> Iterator[Any]:
    with B.browser_page() as p:
        # The first load pays for Python imports and the frontend bundle; give it room on a slow machine.
        B.open_page(p, base_url, B.PAGES[0], timeout_s=180)
        yield p


def metric(page: Any, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]').filter(has=page.get_by_text(label, exact=True)).first
    return box.locator('[data-testid="stMetricValue"]').inner_text().strip()


KEY_METRICS = {
    "overview": {"GPUs": "64", "Unhealthy": "3"},
    "jobs": {"World size": "16 GPUs", "Steps recorded": "40"},
    "stragglers": {"Ranks ≥ 1.1× median compute": "1"},
    "reliability": {"Failures": "2", "Preemptions": "1"},
}
MIN_CHARTS = {"overview": 3, "jobs": 4, "stragglers": 1, "health_sdc": 1, "reliability": 2, "network": 3, "energy_carbon": 2}


@pytest.mark.parametrize("spec", B.PAGES, ids=[p.name for p in B.PAGES])
def test_every_page_renders_its_content(spec: B.PageSpec, base_url: str, page: Any) -> None:
    B.navigate(page, spec)  # as a user moves between pages: the sidebar's link, no reload
    page.screenshot(path=str(ARTIFACTS / f"{spec.name}.png"), full_page=True)
    assert B.error_texts(page) == []
    for label, value in KEY_METRICS.get(spec.name, {}).items():
        assert metric(page, label) == value, label
    assert page.locator('[data-testid="stVegaLiteChart"]').count() >= MIN_CHARTS.get(spec.name, 0)
    if spec.name in ("governance", "alerts"):
        assert page.get_by_text("No data yet", exact=False).count() >= 4


def test_a_deep_link_opens_the_job(base_url: str, page: Any) -> None:
    jobs = next(p for p in B.PAGES if p.name == "jobs")
    B.open_page(page, base_url, jobs, query="?job=job-llm-c")
    assert B.error_texts(page) == []
    assert metric(page, "World size") == "32 GPUs"


def test_sidebar_filters(base_url: str, page: Any) -> None:
    B.open_page(page, base_url, B.PAGES[0])
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
