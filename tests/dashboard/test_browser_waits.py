"""How the browser helpers (``dashboard.browser``) decide a page has rendered, is empty, or is too slow,
on static pages shaped like Streamlit's in headless Chromium: the benchmark counts an empty page apart from
a timeout, and a test waiting on an empty page is told so at once, with the page's own notice."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dashboard import browser as B

pytestmark = pytest.mark.slow

SPEC = B.PageSpec("jobs", "jobs", ("C³ breakdown over steps",))
DONE = '<div data-testid="stApp" data-test-script-state="notRunning">{}</div>'


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    why = B.missing_browser()
    if why:
        if os.environ.get("FLEETSCOPE_REQUIRE_BROWSER") == "1":
            pytest.fail(why + " and FLEETSCOPE_REQUIRE_BROWSER=1")
        pytest.skip(why)
    with B.browser_page() as p:
        yield p


def test_a_page_that_finished_with_its_empty_state_is_empty_not_slow(page: Any, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(B, "EMPTY_GRACE_S", 1.0)
    page.set_content(DONE.format("<h2>Jobs</h2><p>No data yet: no job ran in this window.</p>"))
    t0 = time.perf_counter()
    with pytest.raises(B.EmptyPage, match="'C³ breakdown over steps' not shown; the page says No data yet: no job ran in this window"):
        B.wait_rendered(page, SPEC, timeout_s=60)
    assert time.perf_counter() - t0 < 10  # the grace, not the minute's timeout


def test_the_last_pages_notice_does_not_make_the_next_one_empty(page: Any, monkeypatch: pytest.MonkeyPatch):
    """A notice still on screen while the page's own content is on its way: the content is waited for."""
    monkeypatch.setattr(B, "EMPTY_GRACE_S", 5.0)
    page.set_content(DONE.format('<p id="old">No data yet: nothing has been ingested.</p>')
                     + "<script>setTimeout(() => { document.getElementById('old').textContent = 'C³ breakdown over steps'; }, 800)</script>")
    B.wait_rendered(page, SPEC, timeout_s=30)
    assert page.get_by_text("C³ breakdown over steps", exact=True).is_visible()


def test_a_page_with_neither_its_text_nor_a_notice_times_out(page: Any):
    page.set_content(DONE.format("<h2>Jobs</h2>"))
    with pytest.raises(Exception) as caught:
        B.wait_rendered(page, SPEC, timeout_s=1)
    assert type(caught.value).__name__ == "TimeoutError" and not isinstance(caught.value, B.EmptyPage)


def test_a_panel_notice_beside_the_content_is_no_empty_page(page: Any):
    page.set_content(DONE.format("<p>No data yet: no stragglers in this window.</p><h3>C³ breakdown over steps</h3>"))
    B.wait_rendered(page, SPEC, timeout_s=30)
