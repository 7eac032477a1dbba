"""Every dashboard page under Streamlit's AppTest: an empty database shows "No data yet" and no exception;
the showcase world shows its key content."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.dashboard.conftest import APP

PAGES = ("overview", "jobs", "stragglers", "health_sdc", "reliability", "network", "energy_carbon", "governance", "alerts")


def open_page(url: str, page: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("FLEETSCOPE_DATABASE_URL", url)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    if page != "overview":
        at.switch_page(f"pages/{page}.py").run()
    return at


def healthy(at: AppTest) -> None:
    """No exception and no error element on the page."""
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def infos(at: AppTest) -> list[str]:
    return [i.value for i in at.info]


@pytest.mark.parametrize("page", PAGES)
def test_empty_database_says_no_data_yet(page: str, empty_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(empty_sqlite_url, page, monkeypatch)
    healthy(at)
    assert any(text.startswith("No data yet") for text in infos(at)), infos(at)


def _overview(at: AppTest) -> None:
    m = metrics(at)
    assert m["GPUs"] == "64"
    assert m["Unhealthy"] == "3"
    assert int(m["Busy"]) + int(m["Idle"]) + int(m["Unhealthy"]) + int(m["Silent"]) == 64
    assert m["Power now"].endswith("kW")
    assert m["GPU energy today (UTC)"].endswith("kWh")
    running = at.dataframe[0].value
    assert running["job_id"].tolist() == ["job-llm-a"]
    assert not any("no GPUs in the inventory" in t for t in infos(at))


def _jobs(at: AppTest) -> None:
    m = metrics(at)
    assert m["World size"] == "16 GPUs" and m["Steps recorded"] == "40" and m["Status"] == "running"
    assert any("goodput" in t for t in infos(at))  # goodput has not landed: its section says so
    assert "C³ breakdown over steps" in [s.value for s in at.subheader]


def _stragglers(at: AppTest) -> None:
    assert metrics(at)["Ranks ≥ 1.1× median compute"] == "1"
    suspects = at.dataframe[0].value
    assert suspects["subject"].tolist() == ["job:job-llm-a/rank:5"]
    slowest = at.dataframe[1].value
    assert slowest["rank"].tolist()[0] == 5


def _health_sdc(at: AppTest) -> None:
    frames = [d.value for d in at.dataframe]
    by_node = frames[0]
    assert by_node.iloc[0]["kind"] == "xid" and by_node.iloc[0]["events"] == 2
    assert any("sdc_suspect" in set(f.get("kind", [])) or "sdc" in set(f.get("kind", [])) for f in frames)


def _reliability(at: AppTest) -> None:
    m = metrics(at)
    assert (m["Failures"], m["Preemptions"], m["Restarts"]) == ("2", "1", "1")
    causes = set(at.dataframe[0].value["cause"])
    assert {"xid_79", "nccl_timeout"} <= causes


def _network(at: AppTest) -> None:
    frames = [d.value for d in at.dataframe]
    assert set(frames[0]["op"]) == {"all_reduce", "all_gather"}
    assert frames[-1]["run_id"].tolist() == ["nccl-tests-1", "nccl-tests-0"]
    assert at.multiselect(key="nccl_runs").value == ["nccl-tests-1", "nccl-tests-0"]


def _energy_carbon(at: AppTest) -> None:
    assert metrics(at)["GPU energy in range"].endswith("kWh")
    assert any("PUE" in t for t in infos(at))


def _governance(at: AppTest) -> None:
    assert len([t for t in infos(at) if t.startswith("No data yet")]) == 5


def _alerts(at: AppTest) -> None:
    assert len([t for t in infos(at) if t.startswith("No data yet")]) == 4


CHECKS = {
    "overview": _overview,
    "jobs": _jobs,
    "stragglers": _stragglers,
    "health_sdc": _health_sdc,
    "reliability": _reliability,
    "network": _network,
    "energy_carbon": _energy_carbon,
    "governance": _governance,
    "alerts": _alerts,
}


@pytest.mark.parametrize("page", PAGES)
def test_seeded_database_shows_key_content(page: str, seeded_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(seeded_sqlite_url, page, monkeypatch)
    healthy(at)
    CHECKS[page](at)


def test_site_and_job_filters_from_the_url(seeded_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Filters can come in the URL, so an alert can link to its job. (AppTest 1.67 drops the main script's
    # widgets from the element tree after the first run of an st.navigation app, so the widgets cannot
    # be driven here; the browser test drives them.)
    monkeypatch.setenv("FLEETSCOPE_DATABASE_URL", seeded_sqlite_url)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["site"] = "site-b"
    at.run()
    healthy(at)
    assert metrics(at)["GPUs"] == "32"
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["job"] = "job-llm-c"
    at.query_params["range"] = "6 h"
    at.run()
    at.switch_page("pages/jobs.py").run()
    healthy(at)
    assert metrics(at)["World size"] == "32 GPUs"
    # A job that is not in the window falls back to all jobs instead of failing.
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["job"] = "no-such-job"
    at.run()
    healthy(at)
    assert at.session_state["f_job"] == "All jobs"


def test_pending_sections_fill_in_when_their_tables_arrive(empty_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The alerting service will bring its own tables; the page must show them without a code change.
    path = empty_sqlite_url.split("///", 1)[1]
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE alert (alert_id INTEGER PRIMARY KEY, name TEXT, state TEXT)")
        conn.execute("INSERT INTO alert VALUES (1, 'GPUXidErrors', 'firing')")
    at = open_page(empty_sqlite_url, "alerts", monkeypatch)
    healthy(at)
    assert at.dataframe[0].value["name"].tolist() == ["GPUXidErrors"]


def test_an_unmigrated_database_says_how_to_fix_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(f"sqlite:///{tmp_path / 'new.db'}", "overview", monkeypatch)
    assert not at.exception
    assert "fleetscope db upgrade" in at.error[0].value
