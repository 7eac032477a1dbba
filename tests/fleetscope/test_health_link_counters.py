"""PCIe replay and NVLink error counters through the health window: the stored gpu_sample counter and
dcgm-exporter's NVLink series (kept in metric_sample) become health reasons and findings."""

import datetime as dt
import json

import polars as pl

from fleetscope.door import ingestion
from fleetscope.services.health import health_window
from fleetscope.sim import FleetSpec, gpu_fleet

T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)


def scrape(ts: dt.datetime, uuids: list[str], replay: dict[str, int], crc: dict[str, int]) -> bytes:
    """One dcgm-exporter body: the PCIe replay counter and the NVLink CRC flit counter per GPU."""
    lines = ["# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter", "# TYPE DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL counter"]
    for i, u in enumerate(uuids):
        labels = f'gpu="{i}",UUID="{u}",device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",Hostname="node-0"'
        lines.append(f"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{labels}}} {replay.get(u, 0)}")
        lines.append(f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{labels}}} {crc.get(u, 0)}")
    return ("\n".join(lines) + "\n").encode()


def test_pcie_replays_and_nvlink_errors_become_health_findings(store):
    uuids = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(4)]
    # 10 one-minute scrapes: GPU 1 replays 12 PCIe TLPs a minute (over DCGM's 8/min), GPU 2 logs 3 NVLink CRC errors
    for m in range(10):
        ts = T0 + dt.timedelta(minutes=m)
        body = scrape(ts, uuids, {uuids[1]: 12 * m}, {uuids[2]: min(m, 3)})
        ingestion.ingest_bytes(store, body, source=f"scrape-{m}", fmt="dcgm", opts=ingestion.Options(ts=ts))
    assert store.read("gpu_sample")["pcie_replay_total"].max() == 108
    out = health_window(store, T0, T0 + dt.timedelta(minutes=10))
    gpus = {r["gpu_uuid"]: r for r in out["gpus"].iter_rows(named=True)}
    assert gpus[uuids[1]]["pcie_replay_increase"] == 108 and gpus[uuids[1]]["recommendation"] == "investigate"
    assert gpus[uuids[2]]["nvlink_crc_flit_errors_increase"] == 3 and gpus[uuids[2]]["recommendation"] == "watch"
    assert gpus[uuids[0]]["recommendation"] == gpus[uuids[3]]["recommendation"] == "none"
    found = store.read("finding").filter(pl.col("subject").is_in([f"gpu:{u}" for u in uuids]))
    by = {r["subject"]: r for r in found.iter_rows(named=True)}
    assert "PCIe replays at 12/min" in by[f"gpu:{uuids[1]}"]["summary"]
    assert json.loads(by[f"gpu:{uuids[2]}"]["evidence"])["nvlink_crc_flit_errors_increase"] == 3


def test_health_window_without_nvlink_series_is_unchanged(store):
    batch = gpu_fleet(FleetSpec(sites=1, nodes_per_site=1, gpus_per_node=2, interval_s=10), T0, 120)
    store.write(batch)
    out = health_window(store, T0, T0 + dt.timedelta(minutes=2))
    assert not [c for c in out["gpus"].columns if c.startswith("nvlink_")]
    assert out["gpus"]["recommendation"].to_list() == ["none", "none"]
