"""analyzers.ib_links on frames built here and on the real topology and counters."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from analyzers import ib_links
from fleetscope.core import frames as F
from fleetscope.core.errors import ValidationError
from ingest import ib_sysfs, ibnetdiscover, perfquery

T = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
S10 = dt.timedelta(seconds=10)


def samples(rows: list[dict]) -> pl.DataFrame:
    return F.conform(F.FABRIC_PORT_SAMPLE, pl.DataFrame(rows, infer_schema_length=None))


def series(node: str, n: int, **counters) -> list[dict]:
    """``n`` samples 10 s apart; each counter is a function of the sample index."""
    return [{"ts": T + i * S10, "node": node, "device": "mlx5_0", "port": 1, "host": node, "state": "ACTIVE", "width": "4X",
             "speed": "HDR", "rate_gbps": 200.0, **{k: f(i) for k, f in counters.items()}} for i in range(n)]


def test_deltas_handle_resets_and_saturated_legacy_counters():
    rows = series("a", 5, xmit_wait_total=lambda i: [100, 2**32 - 1, 2**32 - 1, 7, 17][i], link_downed_total=lambda i: [5, 6, 0, 1, 1][i])
    d = ib_links.port_deltas(samples(rows))
    # interval 0->1 ends on the saturated value, 1->2 sits on it: no delta either time; 2->3 starts on it
    assert d["d_xmit_wait_total"].to_list() == [None, None, None, 10]
    # 6 -> 0 is a reset: the new value counts from zero
    assert d["d_link_downed_total"].to_list() == [1, 0, 1, 0]
    assert d["resets"].to_list() == [0, 1, 1, 0]
    assert d["saturated"].to_list()[0] == ["xmit_wait_total"]
    assert d["interval_s"].to_list() == [10.0] * 4


def test_port_health_verdicts_with_numbers():
    gbps = 200e9 / 8 * 10  # bytes a 200 Gb/s link moves in 10 s at line rate
    rows = (series("flappy", 7, link_downed_total=lambda i: 3 + (i >= 2) + (i >= 4) + (i >= 6), xmit_bytes_total=lambda i: int(i * gbps / 2))
            + series("noisy", 7, symbol_errors_total=lambda i: 20 * i, xmit_bytes_total=lambda i: int(i * gbps / 2))
            + series("busy", 7, xmit_wait_total=lambda i: i * 10**9, xmit_bytes_total=lambda i: i * 4 * 10**9)
            + series("roce", 7, local_ack_timeout_err_total=lambda i: 131 + (i == 6)))
    h = {r["node"]: r for r in ib_links.port_health(samples(rows)).to_dicts()}
    assert h["flappy"]["link_downed"] == 3 and h["flappy"]["flapping"] and h["flappy"]["flap_severity"] == "critical"
    assert h["flappy"]["xmit_gbps"] == pytest.approx(100.0)
    assert not h["flappy"]["errors"] and not h["flappy"]["congested"]
    # 120 symbol errors over 60 s of a 200 Gb/s link: BER 1e-11, ten times ibdiagnet's 1e-12
    assert h["noisy"]["symbol_ber"] == pytest.approx(120 / (200e9 * 60))
    assert h["noisy"]["error_reasons"] == ["symbol BER above 1e-12", "symbol_errors >= 10"]
    assert h["busy"]["xmit_wait_ratio"] == pytest.approx(6e9 / (6e9 + 6e9)) and h["busy"]["congested"]
    assert h["roce"]["error_reasons"] == ["local_ack_timeout_err > 0"]
    assert not any(h[n]["flapping"] for n in ("noisy", "busy", "roce"))


def test_an_idle_port_is_not_congested_and_one_sample_is_no_interval():
    rows = series("idle", 3, xmit_wait_total=lambda i: 0, xmit_bytes_total=lambda i: 0) + series("once", 1, link_downed_total=lambda i: 9)
    h = ib_links.port_health(samples(rows))
    assert h["node"].to_list() == ["idle"]
    assert h["xmit_wait_ratio"].to_list() == [None] and not h["congested"].item()


def test_a_saturated_xmit_wait_is_not_a_rate(realdata):
    """node_exporter's mlx4_0 port 1 reads 2^32-1: sampled twice unchanged it must not read as congestion."""
    data = (realdata / "fabric/node-exporter_sys-class-infiniband_i40iw0-mlx4_0.ttar").read_bytes()
    two = pl.concat([ib_sysfs.parse_ttar(data, ts=t, host="h").fabric_port_sample for t in (T, T + S10)])
    h = ib_links.port_health(two).filter(pl.col("device") == "mlx4_0").sort("port").to_dicts()
    assert h[0]["xmit_wait"] is None and h[0]["saturated"] == ["xmit_wait_total"] and not h[0]["congested"]


def test_the_one_lane_link_among_four_lane_ones_is_degraded(realdata):
    data = (realdata / "fabric/procfs_sys-class-infiniband_hfi1-mlx4-mlx5-hw_counters.ttar").read_bytes()
    ports = ib_sysfs.parse_ttar(data, ts=T, host="n1").fabric_port_sample
    d = ib_links.degraded_links(None, ports)
    assert d.select("subject", "width", "expected_width", "rate_gbps").rows() == [("host:n1/ib:mlx5_0:1", "1X", "4X", 25.0)]


def test_topology_unconnected_ports_are_not_slow_links(realdata):
    links = ibnetdiscover.parse((realdata / "fabric/ibnetdiscover-ports_osc_edr.txt").read_bytes()).fabric_link
    assert ib_links.degraded_links(links).height == 0  # the 4x SDR and 4x ??? ports have no peer
    narrowed = links.with_columns(pl.when(pl.col("a_host") == "o0002").then(pl.lit("1X")).otherwise(pl.col("width")).alias("width"))
    d = ib_links.degraded_links(narrowed)
    assert d.select("subject", "width", "expected_width").rows() == [("ib-link:0x7cfe9003003b4b96/1", "1X", "4X")]
    assert d["where"].item() == "o0002 HCA-1:1 <-> ib-i1l1s01:11"
    assert ib_links.nic_link_rate_gbps(links) == 100.0
    slowed = links.with_columns(pl.when(pl.col("a_host") == "o0001").then(pl.lit("FDR")).otherwise(pl.col("speed")).alias("speed"))
    d = ib_links.degraded_links(slowed)
    assert d.select("subject", "speed", "expected_speed").rows() == [("ib-link:0x7cfe9003003b4bde/1", "FDR", "EDR")]


def test_findings_name_the_port_and_carry_the_evidence(realdata):
    bad = (realdata / "fabric/perfquery-x_osc_0x506b4b03005c2740.txt").read_bytes()
    first = perfquery.parse(bad, ts=T).fabric_port_sample
    later = perfquery.parse(bad.replace(b"LinkDownedCounter:...............1", b"LinkDownedCounter:...............2")
                            .replace(b"PortXmitDiscards:................20046", b"PortXmitDiscards:................20246"),
                            ts=T + dt.timedelta(minutes=5)).fabric_port_sample
    h = ib_links.port_health(pl.concat([first, later]))
    f = ib_links.link_findings(h, window_start=T, window_end=T + dt.timedelta(minutes=15))
    got = {r["kind"]: r for r in f.to_dicts()}
    assert set(got) == {"ib_link_flapping", "ib_congestion"}
    assert got["ib_link_flapping"]["subject"] == "ib:lid:2052/1" and got["ib_link_flapping"]["score"] == 1.0
    assert "xmit_discards >= 100" in got["ib_congestion"]["summary"]


def test_bad_input_is_refused():
    with pytest.raises(ValidationError, match="port"):
        ib_links.port_health(pl.DataFrame({"ts": [T], "node": ["a"], "device": [""]}))
    with pytest.raises(TypeError):
        ib_links.port_deltas({"ts": []})  # type: ignore[arg-type]
