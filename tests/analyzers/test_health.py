"""analyzers.health: the Xid table against NVIDIA's catalog, counter rates with resets, throttling and
clocks (including the real nvidia-smi H100 captures), scores, recommendations and findings."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

from analyzers import health
from fleetscope.core.errors import ValidationError
from fleetscope.core.frames import FINDING, HEALTH_EVENT, conform

REPO = Path(__file__).resolve().parents[2]
TELEMETRY = REPO.parent / "shared" / "realdata" / "telemetry"
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def samples(gpu: str, n: int = 61, **cols) -> pl.DataFrame:
    """n one-minute samples of one GPU; each keyword is a constant or a list of n values."""
    data = {"ts": [T0 + timedelta(minutes=i) for i in range(n)], "gpu_uuid": [gpu] * n}
    for k, v in cols.items():
        data[k] = v if isinstance(v, list) else [v] * n
    return pl.DataFrame(data, schema_overrides={"ts": pl.Datetime("us", "UTC")})


def xid(gpu: str, code: int, minute: int = 0, host: str = "node-a") -> dict:
    return {"ts": T0 + timedelta(minutes=minute), "host": host, "gpu_uuid": gpu, "kind": "xid", "code": code}


# --- the catalog -----------------------------------------------------------------------------------


# NVIDIA catalog rows (code → mnemonic, immediate bucket), as printed on the Xid Catalog page.
NVIDIA_ROWS = {
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP"),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP"),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU"),
    74: ("NVLINK_ERROR", "WORKFLOW_NVLINK_ERR"),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU"),
    119: ("GSP_RPC_TIMEOUT", "RESET_GPU"),
    120: ("GSP_ERROR", "RESET_GPU"),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU"),
    143: ("GPU_INIT_ERROR", "RESET_GPU"),
}


def test_catalog_covers_the_codes_the_issue_names_and_cites_its_source():
    cat = health.xid_catalog()
    needed = [13, 31, 32, 38, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120, 121, 140, 143,
              *range(144, 151)]
    assert set(needed) <= set(cat["code"].to_list())
    assert cat["code"].is_unique().all()
    assert set(cat["action"]) <= set(health.ACTIONS)
    assert set(cat["severity"]) <= {"info", "warning", "critical"}
    header = health.XID_CATALOG_PATH.read_text().splitlines()[0]
    assert "docs.nvidia.com/deploy/xid-errors" in header and "2026-11-29" in header
    assert (health.XID_CATALOG_PATH.parent / "SOURCES.md").is_file()


@pytest.mark.parametrize("code", sorted(NVIDIA_ROWS))
def test_catalog_rows_match_nvidia(code):
    row = health.xid_catalog().filter(pl.col("code") == code).row(0, named=True)
    assert (row["mnemonic"], row["nvidia_immediate"]) == NVIDIA_ROWS[code]


def test_catalog_classification_of_the_common_codes():
    cat = {r["code"]: r for r in health.xid_catalog().to_dicts()}
    assert cat[79]["action"] == "drain_node" and cat[79]["category"] == "hardware"
    assert cat[48]["component"] == "memory" and cat[95]["severity"] == "critical"
    assert cat[94]["action"] == "reset_gpu" and cat[94]["severity"] == "warning"  # reset when convenient
    assert cat[64]["action"] == "send_for_repair"
    assert cat[13]["category"] == "application" and cat[13]["action"] == "restart_app"
    assert cat[43]["action"] == "none"  # application fault, GPU healthy
    assert {cat[c]["component"] for c in range(144, 151)} == {"nvlink"}
    assert cat[119]["component"] == cat[120]["component"] == "gsp"


def test_classify_xids_joins_the_table_and_flags_unknown_codes():
    ev = conform(HEALTH_EVENT, pl.DataFrame([xid("GPU-1", 79), xid("GPU-1", 999), {**xid("GPU-1", 1), "kind": "ecc"}]))
    out = health.classify_xids(ev)
    assert out.height == 2  # the ecc row is not an Xid
    by = {r["code"]: r for r in out.to_dicts()}
    assert by[79]["mnemonic"] == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert by[999]["category"] == "unknown" and by[999]["action"] == "investigate"


def test_decode_clock_event_reasons():
    assert health.decode_clock_event_reasons(0x1) == ["gpu_idle"]
    assert health.decode_clock_event_reasons(0x60) == ["sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert health.decode_clock_event_reasons(0x84) == ["sw_power_cap", "hw_power_brake_slowdown"]
    assert health.decode_clock_event_reasons(0) == []
    with pytest.raises(ValueError):
        health.decode_clock_event_reasons(-1)


# --- real nvidia-smi captures -----------------------------------------------------------------------


def _smi_row(name: str) -> dict[str, str]:
    path = TELEMETRY / name
    if not path.is_file():
        pytest.skip(f"real nvidia-smi capture not found at {path}")
    rows = list(csv.reader(path.open()))
    return {h.strip(): v.strip() for h, v in zip(rows[0], rows[1])}


def _smi_sample(row: dict[str, str], gpu: str) -> dict:
    mhz = lambda s: float(s.split()[0])  # noqa: E731
    return {
        "gpu_uuid": gpu,
        "util_ratio": float(row["utilization.gpu [%]"].split()[0]) / 100,
        "sm_clock_mhz": mhz(row["clocks.current.sm [MHz]"]),
        "clock_event_reasons": int(row["clocks_event_reasons.active"], 16),
        "ecc_sbe_volatile_total": int(row["ecc.errors.corrected.volatile.total"]),
        "ecc_dbe_volatile_total": int(row["ecc.errors.uncorrected.volatile.total"]),
        "remap_correctable_total": int(row["remapped_rows.correctable"]),
        "remap_uncorrectable_total": int(row["remapped_rows.uncorrectable"]),
        "remap_pending": int(row["remapped_rows.pending"] == "Yes"),
        "remap_failure": int(row["remapped_rows.failure"] == "Yes"),
        "temp_c": float(row["temperature.gpu"]),
    }


def test_real_h100_idle_and_gpu_burn_captures_are_healthy():
    """The same H100 idle and under gpu-burn (nvidia_gpu_exporter captures, driver 590.48.01): idle shows
    only the GpuIdle reason; under 100 % load it holds its max SM clock with no throttle reason."""
    idle, load = _smi_row("nvidia-smi_query-gpu_all-fields_H100_590.48.01_idle.csv"), _smi_row(
        "nvidia-smi_query-gpu_all-fields_H100_590.48.01_load.csv")
    assert health.decode_clock_event_reasons(int(idle["clocks_event_reasons.active"], 16)) == ["gpu_idle"]
    assert health.decode_clock_event_reasons(int(load["clocks_event_reasons.active"], 16)) == []
    max_sm = float(load["clocks.max.sm [MHz]"].split()[0])
    rows = [{"ts": T0, **_smi_sample(idle, "GPU-h100")}, {"ts": T0 + timedelta(minutes=1), **_smi_sample(load, "GPU-h100")}]
    g = health.gpu_health(pl.DataFrame(rows, schema_overrides={"ts": pl.Datetime("us", "UTC")}), expected_sm_clock_mhz=max_sm)
    r = g.row(0, named=True)
    assert r["loaded_samples"] == 1  # the idle sample is not under load
    assert r["sm_clock_loaded_median_mhz"] == max_sm == 1980.0
    assert r["low_clock_ratio"] == 0.0 and r["thermal_throttle_ratio"] == 0.0 and r["power_throttle_ratio"] == 0.0
    assert r["recommendation"] == "none" and r["score"] == 100.0


# --- counters -----------------------------------------------------------------------------------------


def test_counter_increase_counts_a_reset_as_restart_from_zero():
    # 0,5,10 then a driver reload: 2,4 → increase 10 + 2 + 2 = 14 (Prometheus increase()), one reset
    s = samples("GPU-r", 5, ecc_sbe_volatile_total=[0, 5, 10, 2, 4], util_ratio=0.0)
    r = health.gpu_health(s).row(0, named=True)
    assert r["ecc_sbe_increase"] == 14
    assert r["counter_resets"] == 1
    assert r["ecc_sbe_per_h"] == pytest.approx(14 / (4 / 60))


def test_rates_are_per_hour_of_the_window():
    s = samples("GPU-b", 61, ecc_sbe_volatile_total=list(range(0, 122, 2)), util_ratio=0.9)
    r = health.gpu_health(s).row(0, named=True)
    assert r["ecc_sbe_increase"] == 120 and r["ecc_sbe_per_h"] == pytest.approx(120.0)
    assert r["recommendation"] == "watch" and "120.0/h" in r["reasons"][0]


def test_unordered_and_interleaved_samples_give_the_same_answer():
    a = samples("GPU-a", 10, ecc_sbe_volatile_total=[0, 1, 2, 3, 0, 1, 2, 3, 4, 5], util_ratio=0.9)
    b = samples("GPU-b", 10, ecc_sbe_volatile_total=list(range(10)), util_ratio=0.9)
    ordered = health.gpu_health(pl.concat([a, b]))
    shuffled = health.gpu_health(pl.concat([a, b]).sample(fraction=1.0, shuffle=True, seed=3))
    interleaved = health.gpu_health(pl.concat([a, b]).sort("ts"))
    cols = ["gpu_uuid", "ecc_sbe_increase", "counter_resets"]
    assert ordered.select(cols).equals(shuffled.select(cols)) and ordered.select(cols).equals(interleaved.select(cols))
    assert ordered.filter(pl.col("gpu_uuid") == "GPU-a")["ecc_sbe_increase"][0] == 3 + 5


def test_readings_from_a_second_source_interleaved_with_rows_without_them():
    # The agent's NVML rows every minute carry no DCGM fault counters; dcgm-exporter's scrape, 30 s later,
    # does: DBE 0, 0, 2, 2, 1 (a reset, then one error), remap failure 0, 0, 1, 1, 1. The rows are read in
    # time order, each dcgm reading between two NVML rows. Increases are between the dcgm readings:
    # 2 + (1 after the reset) = 3, one reset; the remap failure flag's last reading is 1.
    nvml = samples("GPU-x", 5, util_ratio=0.9, ecc_dbe_volatile_total=None, remap_failure=None)
    dcgm = samples("GPU-x", 5, util_ratio=None, ecc_dbe_volatile_total=[0, 0, 2, 2, 1], remap_failure=[0, 0, 1, 1, 1]).with_columns(
        pl.col("ts") + timedelta(seconds=30))
    # a GPU with no reading at all sits before it, so nothing carries across GPUs
    quiet = samples("GPU-a", 5, util_ratio=0.9, ecc_dbe_volatile_total=None, remap_failure=None)
    mixed = pl.concat([quiet, nvml, dcgm], how="vertical_relaxed").sort("gpu_uuid", "ts")
    rows = {r["gpu_uuid"]: r for r in health.gpu_health(mixed).iter_rows(named=True)}
    x = rows["GPU-x"]
    assert (x["ecc_dbe_increase"], x["counter_resets"], x["remap_failure_last"]) == (3, 1, 1)
    assert x["recommendation"] == "send_for_repair"
    a = rows["GPU-a"]
    assert (a["ecc_dbe_increase"], a["counter_resets"], a["recommendation"]) == (0, 0, "none")
    assert a["remap_failure_last"] is None


def test_violation_counters_become_time_ratios():
    # 30 s of thermal violation per 60 s sample → 50 % of the time
    s = samples("GPU-t", 11, thermal_violation_s=[30.0 * i for i in range(11)], util_ratio=0.9)
    assert health.gpu_health(s)["thermal_violation_ratio"][0] == pytest.approx(0.5)


# --- throttling, clocks, rules ---------------------------------------------------------------------------


def test_thermal_throttle_and_low_clock_only_count_loaded_samples():
    n = 20
    util = [0.9] * 10 + [0.0] * 10
    reasons = [0x40] * 5 + [0] * 5 + [0x1] * 10
    clock = [1500.0] * 5 + [1980.0] * 5 + [345.0] * 10
    r = health.gpu_health(samples("GPU-c", n, util_ratio=util, clock_event_reasons=reasons, sm_clock_mhz=clock),
                          expected_sm_clock_mhz=1980.0).row(0, named=True)
    assert r["loaded_samples"] == 10
    assert r["thermal_throttle_ratio"] == pytest.approx(0.5)
    assert r["low_clock_ratio"] == pytest.approx(0.5)  # idle 345 MHz samples are not "low under load"
    assert r["recommendation"] == "watch"


def test_fleet_peers_set_the_clock_expectation_when_none_is_given():
    fleet = pl.concat([samples(f"GPU-{i}", 10, util_ratio=0.95, sm_clock_mhz=1980.0) for i in range(9)]
                      + [samples("GPU-slow", 10, util_ratio=0.95, sm_clock_mhz=1400.0)])
    g = health.gpu_health(fleet)
    slow = g.filter(pl.col("gpu_uuid") == "GPU-slow").row(0, named=True)
    assert slow["expected_sm_clock_mhz"] == 1980.0 and slow["low_clock_ratio"] == 1.0
    assert g.filter(pl.col("gpu_uuid") != "GPU-slow")["recommendation"].to_list() == ["none"] * 9


@pytest.mark.parametrize(
    ("codes", "extra", "want"),
    [
        ([13], {}, "none"),  # an application fault: the job restarts, the GPU is fine
        ([13, 13], {}, "investigate"),  # repeated on one GPU: NVIDIA's WORKFLOW_XID_13 says run diagnostics
        ([39], {}, "restart_app"),  # copy-engine exception (driver)
        ([43], {}, "none"),
        ([94], {}, "reset_gpu"),
        ([79], {}, "drain_node"),
        ([48], {}, "reset_gpu"),
        ([48, 63], {}, "drain_node"),  # NVIDIA WORKFLOW_XID_48: with 63/64 drain and reset
        ([64], {}, "send_for_repair"),
        ([79, 79], {}, "send_for_repair"),  # fell off the bus twice in the window
        ([], {"remap_failure": 1}, "send_for_repair"),
        ([], {"remap_pending": 1}, "reset_gpu"),
        ([], {"ecc_dbe_volatile_total": [0] * 30 + [1] * 31}, "reset_gpu"),
    ],
)
def test_recommendation_rules(codes, extra, want):
    ev = pl.DataFrame([xid("GPU-x", c, i) for i, c in enumerate(codes)], schema=HEALTH_EVENT.schema) if codes else None
    g = health.gpu_health(samples("GPU-x", util_ratio=0.9, **extra), ev)
    assert g["recommendation"][0] == want


def test_score_orders_gpus_by_how_bad_they_are():
    ev = pl.DataFrame([xid("GPU-repair", 64), xid("GPU-drain", 79), xid("GPU-reset", 119), xid("GPU-app", 39)],
                      schema=HEALTH_EVENT.schema)
    fleet = pl.concat([samples(g, util_ratio=0.9) for g in ("GPU-repair", "GPU-drain", "GPU-reset", "GPU-app", "GPU-ok")])
    s = dict(health.gpu_health(fleet, ev).select("gpu_uuid", "score").iter_rows())
    assert s["GPU-repair"] < s["GPU-drain"] < s["GPU-reset"] < s["GPU-app"] < s["GPU-ok"] == 100.0


def test_node_rollup_drains_for_one_bad_gpu_and_blames_cooling_when_most_throttle():
    inv = pl.DataFrame({"gpu_uuid": ["A0", "A1", "B0", "B1"], "host": ["node-a", "node-a", "node-b", "node-b"]})
    ev = pl.DataFrame([xid("A0", 79)], schema=HEALTH_EVENT.schema)
    fleet = pl.concat([samples("A0", util_ratio=0.9), samples("A1", util_ratio=0.9),
                       samples("B0", util_ratio=0.9, clock_event_reasons=0x20), samples("B1", util_ratio=0.9, clock_event_reasons=0x20)],
                      how="diagonal")
    g = health.gpu_health(fleet, ev, gpu_host=inv)
    n = {r["host"]: r for r in health.node_health(g).to_dicts()}
    assert n["node-a"]["recommendation"] == "drain_node" and n["node-a"]["gpus_flagged"] == ["A0"]
    assert n["node-b"]["recommendation"] == "watch" and "cooling" in n["node-b"]["node_reason"]
    f = health.health_findings(g, health.node_health(g))
    assert f.columns == list(FINDING.names)
    by = {r["subject"]: r for r in f.to_dicts()}
    assert by["gpu:A0"]["severity"] == "critical" and by["host:node-a"]["kind"] == "node_drain_node"
    assert "gpu:A1" not in by
    ev0 = json.loads(by["gpu:A0"]["evidence"])
    assert ev0["xid_codes"] == [79] and ev0["host"] == "node-a"
    assert by["gpu:A0"]["summary"].endswith(".") and by["gpu:A0"]["summary"].count(". ") == 0


# --- bad input --------------------------------------------------------------------------------------------


def test_bad_input_is_refused_clearly():
    with pytest.raises(ValidationError, match="no samples"):
        health.gpu_health(samples("G", 0))
    with pytest.raises(ValidationError, match="gpu_uuid"):
        health.gpu_health(samples("G", 3).drop("gpu_uuid"))
    with pytest.raises(ValidationError, match=r"row 1 field 'thermal_violation_s'"):
        health.gpu_health(samples("G", 3, thermal_violation_s=[0.0, float("nan"), 1.0]))
    with pytest.raises(TypeError):
        health.gpu_health({"ts": []})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="code"):
        health.classify_xids(pl.DataFrame({"ts": [T0], "kind": ["xid"]}))


# --- PCIe replays and NVLink errors (DCGM health watch limits) ------------------------------------


def test_pcie_replays_at_a_trickle_are_watched():
    # an hour of one-minute samples with 3 replays, one of them across a driver reload (counter back to 0)
    s = samples("GPU-p", 61, pcie_replay_total=[0] * 20 + [1] * 20 + [0] * 10 + [2] * 11, util_ratio=0.9)
    r = health.gpu_health(s).row(0, named=True)
    assert r["pcie_replay_increase"] == 3 and r["pcie_replay_per_h"] == pytest.approx(3.0) and r["counter_resets"] == 1
    assert r["recommendation"] == "watch" and r["score"] == 90.0
    assert r["reasons"] == ["3 PCIe replay(s) in the window (0.05/min)"]


def test_pcie_replays_over_dcgms_rate_are_investigated():
    # 12 replays a minute for 10 minutes: over DCGM_LIMIT_MAX_PCIREPLAY_RATE (8/min)
    s = samples("GPU-q", 11, pcie_replay_total=[5000 + 12 * i for i in range(11)], util_ratio=0.9)
    r = health.gpu_health(s).row(0, named=True)
    assert r["pcie_replay_increase"] == 120 and r["pcie_replay_per_h"] == pytest.approx(720.0)
    assert r["recommendation"] == "investigate" and r["score"] == 80.0
    assert r["reasons"][0].startswith("PCIe replays at 12/min, over DCGM's limit of 8/min")
    f = health.health_findings(health.gpu_health(s))
    assert f["kind"].to_list() == ["gpu_investigate"] and "PCIe replays at 12/min" in f["summary"][0]


def test_exactly_dcgms_pcie_limit_is_not_over_it():
    s = samples("GPU-e", 11, pcie_replay_total=[8 * i for i in range(11)], util_ratio=0.9)
    assert health.gpu_health(s)["recommendation"].to_list() == ["watch"]


def test_nvlink_crc_errors_watch_then_investigate_by_rate():
    slow = samples("GPU-c", 61, nvlink_crc_flit_errors_total=[i // 10 for i in range(61)],
                   nvlink_crc_data_errors_total=0, util_ratio=0.9)
    r = health.gpu_health(slow).row(0, named=True)
    assert r["nvlink_crc_flit_errors_increase"] == 6 and r["recommendation"] == "watch"
    assert r["reasons"] == ["6 NVLink CRC error(s) in the window (0.00167/s)"]
    # 7,200 flit + 600 data errors a minute: 130/s, over DCGM_LIMIT_MAX_NVLINK_CRC_ERROR (100/s)
    fast = samples("GPU-d", 6, nvlink_crc_flit_errors_total=[7200 * i for i in range(6)],
                   nvlink_crc_data_errors_total=[600 * i for i in range(6)], util_ratio=0.9)
    r = health.gpu_health(fast).row(0, named=True)
    assert r["recommendation"] == "investigate" and r["reasons"][0].startswith("NVLink CRC errors at 130/s")


def test_any_nvlink_replay_or_recovery_error_is_investigated():
    s = pl.concat([
        samples("GPU-r1", 6, nvlink_replay_errors_total=[0, 0, 0, 1, 1, 1], nvlink_recovery_errors_total=0, util_ratio=0.9),
        samples("GPU-r2", 6, nvlink_replay_errors_total=0, nvlink_recovery_errors_total=[4, 4, 4, 4, 4, 5], util_ratio=0.9),
        samples("GPU-ok", 6, nvlink_replay_errors_total=7, nvlink_recovery_errors_total=4, util_ratio=0.9),
    ])
    out = {r["gpu_uuid"]: r for r in health.gpu_health(s).iter_rows(named=True)}
    assert out["GPU-r1"]["reasons"] == ["1 NVLink replay error(s) in the window: run a field diagnostic"]
    assert out["GPU-r2"]["reasons"] == ["1 NVLink recovery error(s) in the window: run a field diagnostic"]
    assert out["GPU-r1"]["recommendation"] == out["GPU-r2"]["recommendation"] == "investigate"
    # a counter standing still at a high value is history, not a problem in this window
    assert out["GPU-ok"]["recommendation"] == "none" and out["GPU-ok"]["score"] == 100.0


def test_link_counters_refuse_nan():
    s = samples("GPU-n", 3, nvlink_crc_flit_errors_total=[0.0, float("nan"), 2.0], util_ratio=0.9)
    with pytest.raises(ValidationError, match="nvlink_crc_flit_errors_total"):
        health.gpu_health(s)
