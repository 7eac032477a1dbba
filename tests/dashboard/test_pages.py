"""Every dashboard page under Streamlit's AppTest: an empty database shows "No data yet" and no exception;
the showcase world shows its key content."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from fleetscope.services.alerting import reads as alert_reads
from fleetscope.services import audit as audit_svc
from fleetscope.services import energy_reads as energy_reads
from fleetscope.services import job_reads
from fleetscope.services import telemetry
from fleetscope.sim.showcase import SWEEP_A_S, SWEEP_B_S
from fleetscope.store import Store
from tests.dashboard.conftest import APP, data_dir_of, sign_in

PAGES = ("overview", "jobs", "stragglers", "health_sdc", "reliability", "network", "energy_carbon", "governance", "alerts", "serving", "teams_cost",
         "service")


def open_page(url: str, page: str, monkeypatch: pytest.MonkeyPatch, query: dict[str, str] | None = None,
              scopes: tuple[str, ...] | None = ("admin",)) -> AppTest:
    """``page`` of the dashboard on ``url``, signed in with a token of ``scopes`` (None: not signed in)."""
    monkeypatch.setenv("FLEETSCOPE_DATABASE_URL", url)
    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(data_dir_of(url)))
    at = AppTest.from_file(str(APP), default_timeout=60)
    if scopes is not None:
        sign_in(at, url, scopes)
    for k, v in (query or {}).items():
        at.query_params[k] = v
    at.run()
    if page != "overview":
        at.switch_page(f"views/{page}.py").run()
    return at


def healthy(at: AppTest) -> None:
    """No exception and no error element on the page."""
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def infos(at: AppTest) -> list[str]:
    return [i.value for i in at.info]


@pytest.fixture
def seeded_copy(seeded_sqlite_url: str, tmp_path: Path) -> str:
    """A private copy of the seeded database and its data dir, for tests that change them."""
    shutil.copytree(data_dir_of(seeded_sqlite_url), tmp_path / "data")
    return f"sqlite:///{tmp_path / 'data' / 'fleetscope.store.db'}"


def store_of(url: str) -> Store:
    return Store.open(url)


@pytest.mark.parametrize("page", PAGES)
def test_empty_database_says_no_data_yet(page: str, empty_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(empty_sqlite_url, page, monkeypatch)
    healthy(at)
    assert any(text.startswith("No data yet") for text in infos(at)), infos(at)


def _overview(at: AppTest, url: str) -> None:
    m = metrics(at)
    assert m["GPUs"] == "64"
    assert m["Unhealthy"] == "3"
    assert int(m["Busy"]) + int(m["Idle"]) + int(m["Unhealthy"]) + int(m["Silent"]) == 64
    assert m["Power now"].endswith("kW")
    # Energy and CO2e today: the counters' rise over the 30 minutes of the 64-GPU fleet, at the world's
    # annual grid intensity (the sites declare no country); the roll-up says the same.
    store = store_of(url)
    end = telemetry.data_end(store) + dt.timedelta(microseconds=1)
    rolled = energy_reads.energy_by_site_hour(store, dt.datetime.combine(end.date(), dt.time(), dt.UTC), end)
    assert m["GPU energy today (UTC)"] == f"{rolled['energy_j'].sum() / 3.6e6:.1f} kWh" == "15.2 kWh"
    assert m["CO2e today"] == f"{rolled['kgco2e'].sum():,.1f} kg" == "7.2 kg"
    assert any(c.value.startswith("From the GPUs' energy counters.") for c in at.caption)
    # Fleet power: a probe a minute on the grid from 12:01 until five minutes before the data ends, and now.
    assert "25 points, each the fleet's state over one sample interval." in [c.value for c in at.caption]
    running = at.dataframe[0].value
    assert running["job_id"].tolist() == ["job-llm-a"]
    assert running["goodput_ratio"].tolist() == pytest.approx([0.846], abs=1e-3)  # from the goodput analyzer's stored result
    firing = at.dataframe[1].value
    assert sorted(firing["alertname"]) == ["GpuFellOffBus", "GpuNeedsRepairOrDrain", "GpuNeedsRepairOrDrain", "SdcSuspect"]
    assert not any(t.startswith("No data yet") for t in infos(at)), infos(at)
    runs = at.dataframe[-1].value  # the analyzer registry, as the service runs it
    assert runs["name"].tolist()[:2] == ["c3", "stragglers"] and "fabric_attribution" in runs["name"].tolist()


def _jobs(at: AppTest, url: str) -> None:
    m = metrics(at)
    assert m["World size"] == "16 GPUs" and m["Steps recorded"] == "40" and m["Status"] == "running"
    # The C³ analyzer's stored breakdown and the goodput analyzer's result (fleetscope.services.jobs).
    assert (m["C1 compute"], m["C2 communication"], m["C3 coordination"]) == ("49%", "13%", "39%")
    assert m["Runtime goodput"] == "84.6%" and m["Disruptions"] == "0"
    assert m["Goodput in the interval"] == "84.6%"  # the slider starts on the whole run
    assert "C³ breakdown over steps" in [s.value for s in at.subheader]
    # llama-7b's three runs do not follow the Fleet Law (one has a straggler): the page says so.
    assert any("does not fit these runs of llama-7b" in w.value for w in at.warning)
    # the showcase world has no profiler traces: the HTA panel says where its figures would come from, and only it
    assert at.dataframe[0].value["world_size"].tolist() == [8, 16, 32]
    assert [t for t in infos(at) if t.startswith("No data yet")] == [
        f"No data yet: no HTA temporal breakdown for this job: {job_reads.TEMPORAL_NO_DATA}. "
        "It comes from the job's PyTorch profiler (Kineto) traces, one per rank."], infos(at)


def _stragglers(at: AppTest, url: str) -> None:
    assert metrics(at)["Ranks ≥ 1.1× median compute"] == "1"
    suspects = at.dataframe[0].value
    assert suspects["subject"].tolist() == ["job:job-llm-a/rank:5"]
    slowest = at.dataframe[1].value
    assert slowest["rank"].tolist()[0] == 5


def _health_sdc(at: AppTest, url: str) -> None:
    frames = [d.value for d in at.dataframe]
    by_node = frames[0]
    assert by_node.iloc[0]["kind"] == "xid" and by_node.iloc[0]["events"] == 2
    # The health analyzer's recommendations: the GPU with XID 79 goes for repair, its node is drained.
    advice = frames[1]
    assert sorted(advice["action"]) == ["drain node", "send for repair"]
    assert "host:site-a-node-001" in set(advice["subject"])
    assert any("sdc_suspect" in set(f.get("kind", [])) or "sdc" in set(f.get("kind", [])) for f in frames)


def _reliability(at: AppTest, url: str) -> None:
    m = metrics(at)
    assert (m["Failures"], m["Preemptions"], m["Restarts"]) == ("2", "1", "1")
    causes = set(at.dataframe[0].value["cause"])
    assert {"xid_79", "nccl_timeout"} <= causes


def _network(at: AppTest, url: str) -> None:
    frames = [d.value for d in at.dataframe]
    assert set(frames[0]["op"]) == {"all_reduce", "all_gather"}
    assert frames[-1]["run_id"].tolist() == ["nccl-tests-1", "nccl-tests-0"]
    assert at.multiselect(key="nccl_runs").value == ["nccl-tests-1", "nccl-tests-0"]


def _energy_carbon(at: AppTest, url: str) -> None:
    assert metrics(at)["GPU energy in range"].endswith("kWh")
    # the showcase world has no facility meters; its jobs ran on GPUs the roll-up covered
    assert [t for t in infos(at) if "No data yet" in t] == [next(t for t in infos(at) if "facility and IT meter" in t)]
    store = Store.open(url)
    jobs = store.read("job_energy_minute")["job_id"].unique().sort().to_list()
    store.engine.dispose()
    table = next(d.value for d in at.dataframe if "job_id" in d.value.columns and "embodied_kgco2e" in d.value.columns)
    assert jobs and sorted(table["job_id"].tolist()) == jobs
    assert metrics(at)["Embodied CO2e in range"].endswith(("kg", "t"))


def download_labels(at: AppTest) -> list[str]:
    return [d.proto.label for d in at.get("download_button")]


def _governance(at: AppTest, url: str) -> None:
    models = at.dataframe[0].value.set_index("model_name")
    # The latest audit decided the risk class from the declarations (fleetscope.sim.showcase.run_services).
    assert models.loc["loan-screen", "risk_class"] == "high_risk" and "Annex III point 5" in models.loc["loan-screen", "why"]
    assert models.loc["llama-7b", "risk_class"] == "gpai"
    assert models.loc["gpt-1.3b", "risk_class"].startswith("undecided")
    # Lineage of the first model (the sweep's, trained on licensed books only), then of llama-7b, trained
    # downstream of the quarantined forum dump.
    assert set(at.dataframe[1].value["dataset"]) == {"licensed-books-v2"} and set(at.dataframe[1].value["namespace"]) == {"s3://fleetscope-raw"}
    assert at.get("graphviz_chart") and "licensed-books-v2" in at.get("graphviz_chart")[0].proto.spec
    at.selectbox(key="gov_lineage_model").set_value("llama-7b:1").run()
    healthy(at)
    taints = at.dataframe[1].value
    assert "forum-dump-2023" in set(taints.loc[taints["kind"] == "quarantined", "dataset"])
    # the fairness verdict of every evaluated model, as a table
    verdicts = at.dataframe[2].value
    assert list(verdicts.columns[:3]) == ["model", "evaluated_at", "passed"] and len(verdicts) == verdicts["model"].nunique()
    audit = audit_svc.audit_runs(store_of(url)).row(0, named=True)
    m = metrics(at)
    assert (m["Pass"], m["Fail"], m["Missing evidence"]) == (str(audit["pass"]), str(audit["fail"]), str(audit["missing_evidence"]))
    assert audit["fail"] == 1
    # Post-market monitoring of loan-screen: 28 hours from 07:00 the day before the seed's end (12:30), so a
    # reference day and four hourly windows, 07:00-10:00. Every window is flagged, not only the drifted ones:
    # the stream's bias against women who would repay (bias=1.5) fails the fairness watch every hour.
    assert (m["Windows"], m["Flagged"]) == ("4", "4"), m
    mon = next(d.value for d in at.dataframe if "kind" in d.value.columns and "summary" in d.value.columns)
    hours = {kind: sorted(dt.datetime.fromisoformat(str(t)).astimezone(dt.UTC).hour for t in mon.loc[mon["kind"] == kind, "window_start"].unique())
             for kind in ("model_drift", "model_fairness")}
    # the applicants' incomes fall from hour 26 of the stream on: the last two windows, 09:00 and 10:00
    assert hours == {"model_drift": [9, 10], "model_fairness": [7, 8, 9, 10]}, hours
    crit = next(d.value for d in at.dataframe if "criterion" in d.value.columns)
    assert set(crit["criterion"]) == {"equalized_odds", "demographic_parity", "calibration"}
    labels = download_labels(at)
    assert [lab.split(",")[0] for lab in labels] == ["Report (JSON", "Report (HTML", "Report (PDF", "Export bundle (ZIP"]
    assert not any(t.startswith("No data yet") for t in infos(at)), infos(at)


def _alerts(at: AppTest, url: str) -> None:
    m = metrics(at)
    # pending: the two jobs whose goodput is under 0.8 (JobGoodputLow waits 15 minutes); muted: the dead GPU's
    # XID alert inhibits the sweep's repair advice for it and for its node (one fault, one page)
    assert (m["Firing"], m["Pending"], m["Muted"]) == ("4", "2", "2")
    # No receiver named "default" is configured in the showcase: the notification is a dead letter.
    assert (m["Dead"], m["Delivered"]) == ("1", "0")
    dead = at.dataframe[-1].value
    assert dead["receiver"].tolist() == ["default"] and set(dead["last_error"]) == {"no receiver named 'default'"}
    assert [t for t in infos(at) if t.startswith("No data yet")] == [
        "No data yet: no silences. Create one below to mute matching alerts for a while."]


def _serving(at: AppTest, url: str) -> None:
    # the showcase world runs no inference server: the page says how to point one at it
    assert [t for t in infos(at) if t.startswith("No data yet")] == [
        "No data yet: no inference server has been scraped. Point `fleetscope agent --serving http://POD:8000/metrics` at vLLM, "
        "SGLang, TGI, Triton or NIM replicas."]


def _teams_cost(at: AppTest, url: str) -> None:
    # the showcase world has no scheduler: the page says where jobs come from (tests/dashboard/test_teams_page.py
    # adds Slurm and Kubernetes clusters to it)
    assert [t for t in infos(at) if t.startswith("No data yet")] == [
        "No data yet: no scheduler job in this time range. Ingest `sacct -P`, `squeue --json`, slurmrestd or kube-state-metrics output "
        "with `fleetscope ingest`, or poll slurmrestd with `fleetscope agent --slurm URL`; map accounts and namespaces to teams with "
        "`fleetscope teams map`."]


def _service(at: AppTest, url: str) -> None:
    m = metrics(at)
    assert m["Beat"] == "no leader"  # the seeded world runs no beat
    assert any("No beat holds the leader lease" in w.value for w in at.warning)
    stages, storage = (d.value for d in at.dataframe)
    assert list(stages["stage"]) == ["energy", "minute", "hour", "job_hour"]
    # nor a worker: no task outcome is recorded (tests/fleetscope/test_pipeline_service.py has them)
    assert [t for t in infos(at) if t.startswith("No data yet")] == [
        "No data yet: no task runs recorded. Workers record each task's outcome once `fleetscope worker` runs them."]
    by_table = dict(zip(storage["table"], storage["MiB"]))
    assert by_table["gpu_sample"] > 0 and "ingest_log" in by_table


CHECKS = {
    "service": _service,
    "teams_cost": _teams_cost,
    "serving": _serving,
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
    CHECKS[page](at, seeded_sqlite_url)


def test_site_and_job_filters_from_the_url(seeded_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Filters can come in the URL, so an alert can link to its job. (AppTest 1.67 drops the main script's
    # widgets from the element tree after the first run of an st.navigation app, so the widgets cannot
    # be driven here; the browser test drives them.)
    monkeypatch.setenv("FLEETSCOPE_DATABASE_URL", seeded_sqlite_url)
    at = AppTest.from_file(str(APP), default_timeout=60)
    sign_in(at, seeded_sqlite_url, ("read",))
    at.query_params["site"] = "site-b"
    at.run()
    healthy(at)
    assert metrics(at)["GPUs"] == "32"
    at = AppTest.from_file(str(APP), default_timeout=60)
    sign_in(at, seeded_sqlite_url, ("read",))
    at.query_params["job"] = "job-llm-c"
    at.query_params["range"] = "6 h"
    at.run()
    at.switch_page("views/jobs.py").run()
    healthy(at)
    assert metrics(at)["World size"] == "32 GPUs"
    # A job that is not in the window falls back to all jobs instead of failing.
    at = AppTest.from_file(str(APP), default_timeout=60)
    sign_in(at, seeded_sqlite_url, ("read",))
    at.query_params["job"] = "no-such-job"
    at.run()
    healthy(at)
    assert at.session_state["f_job"] == "All jobs"


def test_gpus_without_an_energy_counter_get_their_energy_from_the_roll_up(seeded_copy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Power-only telemetry (no counter): the overview's energy comes from the worker's roll-up, which
    # integrated the power (written here before the counters are blanked, as the worker would have).
    with sqlite3.connect(seeded_copy.split("///", 1)[1]) as conn:
        conn.execute("UPDATE gpu_sample SET energy_j = NULL")
    at = open_page(seeded_copy, "overview", monkeypatch)
    healthy(at)
    m = metrics(at)
    assert (m["GPU energy today (UTC)"], m["CO2e today"]) == ("15.2 kWh", "7.2 kg")
    assert any(c.value.startswith("From the energy roll-up (to 12:30 UTC).") for c in at.caption)


def test_the_fleet_law_fit_says_where_adding_gpus_stops_paying(seeded_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The sweep's five runs follow T(N) = 8/N + 0.004·2(N−1) + 0.1 s exactly: the fit recovers a and b,
    # and N* = sqrt(a / 2b) = sqrt(1000) ≈ 31.6 GPUs; η of the 16-GPU run is T4·4 / (16·T16).
    at = open_page(seeded_sqlite_url, "jobs", monkeypatch, {"job": "job-sweep-n16"})
    healthy(at)
    m = metrics(at)
    assert m["GPUs past which steps get slower"] == f"{(SWEEP_A_S / (2 * SWEEP_B_S)) ** 0.5:.1f}" == "31.6"
    assert (m["T_compute (a)"], m["Growing cost (b per hop)"], m["Fit R²"]) == ("8.00 s", "4 ms", "1.000")
    t4, t16 = 8 / 4 + 0.004 * 6 + 0.1, 8 / 16 + 0.004 * 30 + 0.1
    assert m["η of this run"] == f"{4 * t4 / (16 * t16):.2f}" == "0.74"
    runs = at.dataframe[0].value
    assert runs["world_size"].tolist() == [4, 8, 16, 32, 64]
    assert runs["step_time_mean_s"].tolist() == pytest.approx([2.124, 1.156, 0.72, 0.598, 0.729], abs=1e-5)
    assert m["Runtime goodput"] == "100.0%"


def test_goodput_in_an_interval_of_the_run_is_the_services(seeded_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(seeded_sqlite_url, "jobs", monkeypatch, {"job": "job-llm-a"})
    healthy(at)
    run = job_reads.job_analyses(store_of(seeded_sqlite_url), "job-llm-a")["goodput"]
    lo, hi = run["window_start"], run["window_end"]
    half = lo + (hi - lo) / 2
    at.slider(key="goodput_interval").set_value((lo, half)).run()
    healthy(at)
    got = at.slider(key="goodput_interval").value
    want = job_reads.interval_goodput(store_of(seeded_sqlite_url), "job-llm-a", got[0], got[1], now=hi)
    assert got[0] == lo and abs((got[1] - half).total_seconds()) <= (hi - lo).total_seconds() / 200
    assert metrics(at)["Goodput in the interval"] == f"{want['goodput_ratio']:.1%}"
    assert metrics(at)["Productive"] and want["total_s"] == pytest.approx((got[1] - got[0]).total_seconds())


def test_fewer_runs_than_the_fit_needs_say_no_data_yet(seeded_copy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with sqlite3.connect(seeded_copy.split("///", 1)[1]) as conn:  # keep two of the sweep's runs
        conn.execute("UPDATE job SET model_name = 'other' WHERE job_id IN ('job-sweep-n4', 'job-sweep-n8', 'job-sweep-n64')")
    at = open_page(seeded_copy, "jobs", monkeypatch, {"job": "job-sweep-n16"})
    healthy(at)
    assert "No data yet: no Fleet Law fit: 2 distinct world sizes of gpt-1.3b; the fit needs three." in " ".join(infos(at))
    assert metrics(at)["World size"] == "16 GPUs" and at.dataframe[0].value["world_size"].tolist() == [16, 32]


def fill_silence(at: AppTest, matchers: str, comment: str = "GPU sent for repair, ticket HW-1") -> AppTest:
    at.text_area(key="sil_matchers").input(matchers)
    at.text_area(key="sil_comment").input(comment)
    return at


def test_a_silence_is_created_and_expired_through_the_alerting_service(seeded_copy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(seeded_copy, "alerts", monkeypatch)
    fill_silence(at, 'alertname="GpuFellOffBus"\nseverity="critical"').button(key="sil_create").click().run()
    healthy(at)
    assert at.success[0].value.startswith("Silence ") and 'alertname="GpuFellOffBus"' in at.success[0].value
    silences = alert_reads.silences(store_of(seeded_copy))
    # created by the signed-in token (open_page signs in as test-admin), as the API records its token's name
    assert silences.select("state", "matchers", "created_by").rows() == [("active", 'alertname="GpuFellOffBus", severity="critical"', "test-admin")]
    assert silences["comment"][0] == "GPU sent for repair, ticket HW-1"
    assert (silences["ends_at"][0] - silences["starts_at"][0]) == dt.timedelta(hours=2)  # the form's default window
    # the firing GpuFellOffBus alert is silenced at once, beside the two repair alerts it inhibits (a silenced
    # alert still inhibits, as in Alertmanager)
    assert metrics(at)["Muted"] == "3"
    alerts = at.dataframe[0].value
    assert alerts.loc[alerts["alertname"] == "GpuFellOffBus", "silenced_by"].tolist() == [silences["silence_id"][0]]
    at.button(key="sil_expire").click().run()
    healthy(at)
    assert at.success[0].value == f"Silence {silences['silence_id'][0]} expired."
    assert alert_reads.silences(store_of(seeded_copy))["state"].to_list() == ["expired"]
    assert metrics(at)["Muted"] == "2"


@pytest.mark.parametrize(
    "matchers, comment, end_day, why",
    [
        ('alertname=~"(unclosed"', "x", None, "not an RE2 regex"),
        ('alertname="GpuFellOffBus"', "x", dt.date(2020, 1, 1), "endsAt must be after startsAt"),
        ('host=~".*"', "x", None, "must not match every alert"),
        ("", "x", None, "Give at least one matcher"),
        ('alertname="X"', "  ", None, "Say why (Comment)"),
        ("; DROP TABLE alert_silence; --", "x", None, "cannot parse matcher"),
    ],
)
def test_a_bad_silence_says_why_and_writes_nothing(
    matchers: str, comment: str, end_day: dt.date | None, why: str, seeded_copy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = open_page(seeded_copy, "alerts", monkeypatch)
    fill_silence(at, matchers, comment)
    if end_day:
        at.date_input(key="sil_end_day").set_value(end_day)
    at.button(key="sil_create").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert len(at.error) == 1 and why in at.error[0].value, [e.value for e in at.error]
    assert alert_reads.silences(store_of(seeded_copy)).is_empty()


def test_governance_makes_a_new_signed_export(seeded_copy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(seeded_copy, "governance", monkeypatch)
    before = audit_svc.audit_exports(store_of(seeded_copy))
    at.button(key="gov_new_export").click().run()
    healthy(at)
    after = audit_svc.audit_exports(store_of(seeded_copy))
    assert after.height == before.height + 1 and after["requested_by"][0] == "test-admin"  # the signed-in token
    assert at.success[0].value.startswith(f"Signed export {after['export_id'][0][:12]} of audit {after['audit_id'][0]}")
    assert at.selectbox(key="gov_export").value == after["export_id"][0]  # newest first, offered for download


def test_governance_declares_a_serious_incident_from_a_monitoring_finding(seeded_copy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A monitoring finding of the showcase's loan-screen model declared a widespread infringement: recorded
    under the signed-in name, with the Art. 73(3) two-day deadline on the page."""
    at = open_page(seeded_copy, "governance", monkeypatch)
    healthy(at)
    assert at.selectbox(key="gov_incident_finding").value  # the version's newest finding, offered first
    at.selectbox(key="gov_incident_kind").set_value("widespread_infringement")
    at.button(key="gov_incident_declare").click().run()
    healthy(at)
    done = at.success[0].value
    assert done.startswith("Serious incident declared for loan-screen@") and "by test-admin" in done and "(2 days, Art. 73(3))" in done
    incidents = store_of(seeded_copy).query("SELECT entered_by, value FROM aiact_declaration WHERE kind = 'incident'")
    assert incidents.height == 1 and incidents["entered_by"][0] == "test-admin"
    assert json.loads(incidents["value"][0])["kind"] == "widespread_infringement"


def test_a_report_changed_after_filing_is_refused_not_offered(seeded_copy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    audit_id = audit_svc.audit_runs(store_of(seeded_copy))["audit_id"][0]
    html = data_dir_of(seeded_copy) / "reports" / audit_id / "report.html"
    html.write_bytes(html.read_bytes().replace(b"</body>", b"<p>all rules pass</p></body>"))
    (data_dir_of(seeded_copy) / "reports" / audit_id / "report.pdf").unlink()
    at = open_page(seeded_copy, "governance", monkeypatch)
    healthy(at)
    warnings = [w.value for w in at.warning]
    assert any(w.startswith("HTML:") and "no longer matches the hash" in w for w in warnings), warnings
    assert any(w.startswith("PDF:") for w in warnings), warnings
    assert [lab.split(" (")[0] for lab in download_labels(at)] == ["Report", "Export bundle"]


def test_an_unmigrated_database_says_how_to_fix_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before anyone can sign in: the token table is not there yet, and the page says why, not "sign-in failed".
    at = open_page(f"sqlite:///{tmp_path / 'new.db'}", "overview", monkeypatch, scopes=None)
    assert not at.exception
    assert "fleetscope db upgrade" in at.error[0].value


def test_network_shows_the_suspect_switch_and_starved_alltoall_runs(seeded_copy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetscope.core import frames as F

    store = store_of(seeded_copy)
    when = telemetry.data_end(store) - dt.timedelta(minutes=1)
    rows = [{"analyzer": "fabric", "kind": "comm_straggler_fabric", "subject": "job:job-llm-a/ib:0xleaf1", "window_start": when,
             "window_end": when, "severity": "critical", "score": 1.0, "summary": "4 of job job-llm-a's slow ranks sit under leaf 0xleaf1"},
            {"analyzer": "fabric", "kind": "alltoall_low_utilization", "subject": "nccl_test:r1", "window_start": when,
             "window_end": when, "severity": "warning", "score": 0.3, "summary": "30% of the bound"}]
    store.write(F.Batch(finding=F.findings_frame(rows)))
    store.engine.dispose()
    at = open_page(seeded_copy, "network", monkeypatch)
    healthy(at)
    assert {"Communication stragglers by switch and link", "All-to-all against the topology's bound"} <= {h.value for h in at.subheader}
    tables = [d.value for d in at.dataframe]
    sus = next(t for t in tables if "subject" in t.columns and "job:job-llm-a/ib:0xleaf1" in set(t["subject"]))
    assert sus["severity"].tolist() == ["critical"]
    low = next(t for t in tables if "utilization_ratio" in t.columns)
    assert low["subject"].tolist() == ["nccl_test:r1"] and low["utilization_ratio"].tolist() == [0.3]


def test_serving_page_shows_quantiles_slos_and_rates(empty_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment of two vLLM replicas scraped every minute for ten minutes, with a recorded SLO."""
    import polars as pl

    from analyzers.slo import SLO
    from fleetscope.core import frames as F
    from fleetscope.core import serving_frames as SF
    from fleetscope.services import serving as serving_svc

    store = store_of(empty_sqlite_url)
    end = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    rows, counters = [], []
    for m in range(11):
        ts = end - dt.timedelta(minutes=10 - m)
        for rep in ("chat-0", "chat-1"):
            n = 100 * m
            for le, c in (("0.1", 0.8 * n), ("0.5", n), ("+Inf", n)):
                rows.append({"ts": ts, "deployment": "chat", "replica": rep, "metric": "ttft_seconds", "le": le, "cumulative_count": c})
            counters.append({"ts": ts, "deployment": "chat", "replica": rep, "metric": "generation_tokens_total", "value": 20.0 * n})
    store.write(F.Batch(serving_replica=pl.DataFrame({"deployment": ["chat"] * 2, "replica": ["chat-0", "chat-1"], "server": ["vllm"] * 2}),
                        serving_bucket=F.conform(SF.SERVING_BUCKET, pl.DataFrame(rows)),
                        serving_counter=F.conform(SF.SERVING_COUNTER, pl.DataFrame(counters))))
    serving_svc.put_slo(store, SLO("ttft", "chat", "latency", 0.99, "ttft_seconds", 0.5), actor="test", now=end)
    at = open_page(empty_sqlite_url, "serving", monkeypatch)
    healthy(at)
    assert at.selectbox(key="serving_deployment").value == "chat"
    m = metrics(at)
    assert m["Output tokens/s"] == f"{2 * 20 * 100 / 60:,.1f}"
    slos = at.dataframe[0].value
    assert slos["slo"].tolist() == ["ttft"] and slos["sli"].tolist() == [1.0]
    assert not any(t.startswith("No data yet: no time to first token") for t in infos(at)), infos(at)
    # the replicas name no host, so no site's prices apply: the page says so instead of a cost
    assert any("runs on no host placed at a site" in t for t in infos(at)), infos(at)


def test_health_page_draws_one_gpus_history_linked_from_the_url(seeded_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``/health_sdc?gpu=UUID`` opens the page on that GPU: a chart a field of what ``telemetry.gpu_field_series`` reads
    over the page's range (24 h ending at the newest data), and the values themselves; other fields on request."""
    import math

    import polars as pl

    store = store_of(seeded_sqlite_url)
    gpu = store.read("gpu").sort("host", "gpu_index")["gpu_uuid"][5]
    end = telemetry.data_end(store) + dt.timedelta(microseconds=1)
    at = open_page(seeded_sqlite_url, "health_sdc", monkeypatch, {"gpu": gpu})
    healthy(at)
    assert at.selectbox(key="health_gpu").value == gpu and at.query_params["gpu"] == gpu
    assert at.multiselect(key="health_gpu_fields").value == list(telemetry.DEFAULT_SERIES_FIELDS)
    assert "One GPU over time" in [s.value for s in at.subheader]
    want = telemetry.gpu_field_series(store, gpu, telemetry.DEFAULT_SERIES_FIELDS, end - dt.timedelta(hours=24), end)
    # the showcase samples every GPU each 10 s for 30 minutes, and the seeding rolled the minute tier: 30 minutes of 6 samples
    assert want["tier"].unique().to_list() == ["minute"] and want.height == 3 * 30 and want["samples"].unique().to_list() == [6]
    got = pl.from_pandas(at.dataframe[-1].value)
    assert got["field"].to_list() == want["field"].to_list() and got["ts"].to_list() == want["ts"].to_list()
    for col in ("min", "max", "mean", "last"):
        assert all((a is None or math.isnan(a)) if b is None else a == b for a, b in zip(got[col].to_list(), want[col].to_list(), strict=True)), col
    # one chart a field, after the health events' chart
    assert len(at.get("vega_lite_chart")) == 1 + len(telemetry.DEFAULT_SERIES_FIELDS)
    at.multiselect(key="health_gpu_fields").set_value(["temp_c"]).run()
    healthy(at)
    assert set(pl.from_pandas(at.dataframe[-1].value)["field"]) == {"temp_c"} and len(at.get("vega_lite_chart")) == 2
    store.engine.dispose()


@pytest.mark.parametrize("linked, says", [("GPU-x'; DROP TABLE gpu; --", "No data yet: no sample of GPU-x'; DROP TABLE gpu; --"),
                                          ("GPU-\x1b[31m", "not a GPU UUID")])
def test_a_linked_gpu_nobody_has_says_so(linked: str, says: str, seeded_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(seeded_sqlite_url, "health_sdc", monkeypatch, {"gpu": linked})
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.selectbox(key="health_gpu").value == linked
    assert any(says in t for t in [*infos(at), *(w.value for w in at.warning)]), (infos(at), [w.value for w in at.warning])
    assert store_of(seeded_sqlite_url).read("gpu").height == 64
