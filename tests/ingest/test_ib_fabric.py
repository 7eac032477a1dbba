"""The fabric readers on the real files of ../shared/realdata/fabric (values from its SOURCES.md), and on
malformed, truncated, oversized and hostile input."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from fleetscope.core.errors import ParseError
from ingest import ib_node_exporter, ib_sysfs, ibnetdiscover, ibswinfo, infiniband, nccl_topo, perfquery, slurm_ib_features

TS = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def read(realdata, name: str) -> bytes:
    return (realdata / "fabric" / name).read_bytes()


def port(df: pl.DataFrame, device: str, p: int) -> dict:
    rows = df.filter((pl.col("device") == device) & (pl.col("port") == p)).to_dicts()
    assert len(rows) == 1
    return rows[0]


# --- units --------------------------------------------------------------------------------------------


def test_link_rates_are_lanes_times_the_lane_rate():
    assert infiniband.rate_gbps("4x", "HDR") == 200.0
    assert infiniband.rate_gbps("4X", "EDR") == 100.0
    assert infiniband.rate_gbps("1X", "EDR") == 25.0
    assert infiniband.rate_gbps("4x", "???") is None
    assert infiniband.parse_rate("25 Gb/sec (1X EDR)") == (25.0, "1X", "EDR")
    assert infiniband.parse_rate("10 Gb/sec (4X)") == (10.0, "4X", None)
    assert infiniband.guid("0a7f:bc12:45ef:d23b") == "0x0a7fbc1245efd23b"
    with pytest.raises(ValueError):
        infiniband.parse_rate("fast")
    with pytest.raises(ValueError):
        infiniband.counter("-1")
    with pytest.raises(ValueError):
        infiniband.counter(str(2**64))


# --- node_exporter and the sysfs tree it read ---------------------------------------------------------------


def test_node_exporter_series_become_port_samples_in_bytes(realdata):
    b = ib_node_exporter.parse(read(realdata, "node-exporter_e2e-output_node_infiniband.prom"), ts=TS)
    df = b.fabric_port_sample
    assert df.height == 3 and b.meta["skipped_series"] == 2  # the two info lines
    p1 = port(df, "mlx4_0", 1)
    assert p1["rcv_bytes_total"] == 18_527_668 == 4 * 4_631_917  # sysfs counts 4-octet words
    assert p1["xmit_wait_total"] == 2**32 - 1  # saturated: kept as read, the analyzer knows it is no rate
    assert p1["xmit_discards_total"] == 5
    assert p1["rate_gbps"] == 40.0 and p1["state"] == "ACTIVE" and p1["phys_state"] == "LinkUp"
    assert port(df, "i40iw0", 1)["rate_gbps"] == 10.0
    # port 2: counters/port_rcv_data reads 0 beside counters_ext's live value; the live one is kept
    assert port(df, "mlx4_0", 2)["rcv_bytes_total"] == 18_527_668


def test_the_ttar_tree_gives_the_same_rows_as_node_exporter_read_from_it(realdata):
    sysfs = ib_sysfs.parse_ttar(read(realdata, "node-exporter_sys-class-infiniband_i40iw0-mlx4_0.ttar"), ts=TS).fabric_port_sample
    prom = ib_node_exporter.parse(read(realdata, "node-exporter_e2e-output_node_infiniband.prom"), ts=TS).fabric_port_sample
    cols = [c for c in prom.columns if c not in ("source", "width", "speed", "link_layer") and prom[c].null_count() < prom.height]
    assert sysfs.select(cols).sort("device", "port").equals(prom.select(cols).sort("device", "port"))
    assert port(sysfs, "mlx4_0", 1)["width"] == "4X" and port(sysfs, "mlx4_0", 1)["speed"] == "QDR"
    # "N/A (no PMA)" is unknown, not zero
    assert port(sysfs, "i40iw0", 1)["rcv_bytes_total"] is None


def test_procfs_tree_with_rdma_hw_counters_and_a_one_lane_link(realdata):
    df = ib_sysfs.parse_ttar(read(realdata, "procfs_sys-class-infiniband_hfi1-mlx4-mlx5-hw_counters.ttar"), ts=TS, host="n1").fabric_port_sample
    assert df.height == 4
    m = port(df, "mlx5_0", 1)
    assert (m["local_ack_timeout_err_total"], m["roce_adp_retrans_total"], m["out_of_sequence_total"], m["out_of_buffer_total"]) == (131, 99, 1, 0)
    assert (m["width"], m["speed"], m["rate_gbps"]) == ("1X", "EDR", 25.0)
    assert m["node_guid"] == "0x0a7fbc1245efd23b" and m["node"] == "n1" and m["host"] == "n1"
    assert m["xmit_bytes_total"] == 4 * 2_880_761_508_848
    assert port(df, "hfi1_0", 1)["rate_gbps"] == 100.0


def test_the_agent_reads_the_real_directory_as_the_archive_says(realdata, tmp_path):
    from fleetscope.agent import read_infiniband

    data = read(realdata, "procfs_sys-class-infiniband_hfi1-mlx4-mlx5-hw_counters.ttar")
    files, _ = ib_sysfs.ttar_files(data)
    root = tmp_path / "infiniband"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    (root / "mlx5_0/ports/1/counters/port_xmit_wait").chmod(0)  # unreadable: skipped, the rest read
    got = ib_sysfs.from_files(read_infiniband(root), ts=TS, host="n1").fabric_port_sample
    want = ib_sysfs.parse_ttar(data, ts=TS, host="n1").fabric_port_sample
    assert got.drop("source", "xmit_wait_total").equals(want.drop("source", "xmit_wait_total"))
    assert port(got, "mlx4_0", 2)["xmit_wait_total"] == 3846


@pytest.mark.parametrize(("files", "field", "words"), [
    ({"mlx5_0/ports/1/counters/symbol_error": "lots"}, "mlx5_0/ports/1/counters/symbol_error", "not a counter"),
    ({"mlx5_0/ports/1/counters/link_downed": "-3"}, "mlx5_0/ports/1/counters/link_downed", "not a counter"),
    ({"mlx5_0/ports/1/rate": "fast"}, "mlx5_0/ports/1/rate", "link rate"),
    ({"mlx5_0/ports/1/state": "ACTIVE"}, "mlx5_0/ports/1/state", "port state"),
    ({"mlx5_0/ports/0/rate": "25 Gb/sec (1X EDR)"}, "mlx5_0/ports/0/rate", "port number"),
    ({"mlx5_0/node_guid": "zz"}, "mlx5_0/node_guid", "GUID"),
    ({"../../etc/ports/1/rate": "x"}, "../../etc/ports/1/rate", "device name"),
    ({"mlx5_0/ports/1/counters/port_xmit_data": str(2**62)}, "mlx5_0/ports/1/xmit_bytes_total", r"2\^63"),
])
def test_bad_sysfs_values_are_refused_naming_the_file(files, field, words):
    with pytest.raises(ParseError, match=words) as e:
        ib_sysfs.from_files(files, ts=TS, host="h")
    assert e.value.field == field


def test_ttar_truncated_malformed_and_without_time_are_refused(realdata):
    data = read(realdata, "node-exporter_sys-class-infiniband_i40iw0-mlx4_0.ttar")
    with pytest.raises(ParseError, match="pass ts"):
        ib_sysfs.parse_ttar(data, ts=None)
    cut = data[: data.index(b"Lines: 1\n40 Gb/sec") + len(b"Lines: 1\n")]
    with pytest.raises(ParseError, match="truncated"):
        ib_sysfs.parse_ttar(cut, ts=TS)
    with pytest.raises(ParseError, match="Lines") as e:
        ib_sysfs.parse_ttar(b"Path: sys/class/infiniband/mlx5_0/ports/1/rate\nLines: 99999\nx\n", ts=TS)
    assert e.value.line == 2
    with pytest.raises(ParseError, match="expected 'Path:'"):
        ib_sysfs.parse_ttar(b"hello\n", ts=TS)
    with pytest.raises(ParseError, match="bad path"):
        ib_sysfs.parse_ttar(b"Path: sys/class/infiniband/../../x\nLines: 1\n1\n", ts=TS)
    with pytest.raises(ParseError, match="no files under"):
        ib_sysfs.parse_ttar(b"Path: sys/class/net/eth0/mtu\nLines: 1\n1500\nMode: 644\n", ts=TS)


@pytest.mark.parametrize(("body", "words"), [
    (b'node_infiniband_link_downed_total{device="mlx5_0",port="1"} -1\n', "negative"),
    (b'node_infiniband_link_downed_total{device="mlx5_0",port="1"} NaN\n', "not finite"),
    (b'node_infiniband_link_downed_total{device="mlx5_0",port="1"} 1.5\n', "not a counter"),
    (b'node_infiniband_link_downed_total{port="1"} 1\n', "device"),
    (b'node_infiniband_link_downed_total{device="mlx5_0",port="999"} 1\n', "port"),
    (b'node_infiniband_link_downed_total{device="mlx5_0",port="1} 1\n', "label"),
    (b'node_infiniband_state_id{device="mlx5_0",port="1"} 9999\n', "state"),
    (b'node_infiniband_link_downed_total{device="mlx5_0",port="1"} 1\x00\n', "NUL"),
])
def test_node_exporter_bad_samples_are_refused_with_the_line(body, words):
    with pytest.raises(ParseError, match=words) as e:
        ib_node_exporter.parse(b"# HELP x\n" + body, ts=TS)
    assert e.value.line == 2


def test_node_exporter_oversized_input_is_refused(monkeypatch):
    monkeypatch.setattr(ib_node_exporter, "MAX_INPUT_BYTES", 100)
    with pytest.raises(ParseError, match="exceeds"):
        ib_node_exporter.parse(b'node_infiniband_link_downed_total{device="m",port="1"} 0\n' * 5, ts=TS)


# --- perfquery -------------------------------------------------------------------------------------------


def test_perfquery_extended_counters_of_the_bad_port(realdata):
    df = perfquery.parse(read(realdata, "perfquery-x_osc_0x506b4b03005c2740.txt"), ts=TS).fabric_port_sample
    r = df.to_dicts()[0]
    assert (r["node"], r["port"], r["lid"]) == ("lid:2052", 1, 2052)
    assert (r["link_downed_total"], r["rcv_switch_relay_errors_total"], r["xmit_discards_total"], r["xmit_wait_total"]) == (1, 7, 20046, 41_864_608)
    assert r["xmit_bytes_total"] == 4 * 178_791_657_177_235


def test_perfquery_two_ports_and_receive_error_details(realdata):
    x = perfquery.parse(read(realdata, "perfquery-x_osc_0x7cfe9003009ce5b0.txt"), ts=TS).fabric_port_sample.sort("port")
    assert x["xmit_wait_total"].to_list() == [22_730_501, 36_510_964]
    assert x["xmit_bytes_total"][0] == 4 * 36_298_026_860_928 and x["rcv_bytes_total"][0] == 4 * 12_279_028_775_751
    e = perfquery.parse(read(realdata, "perfquery-E-rcv-error-details_osc_0x7cfe9003009ce5b0-port1.txt"), ts=TS).fabric_port_sample.to_dicts()[0]
    assert e["node"] == "lid:1719" and e["rcv_looping_errors_total"] == 0 and e["rcv_local_physical_errors_total"] == 0
    hca = perfquery.parse(read(realdata, "perfquery-x_osc_0x7cfe9003003b4bde.txt"), ts=TS).fabric_port_sample.to_dicts()[0]
    assert (hca["lid"], hca["xmit_wait_total"], hca["xmit_bytes_total"]) == (134, 0, 4 * 9_049_592_493_976)


@pytest.mark.parametrize(("body", "words", "line"), [
    (b"PortXmitData:....1\n", "before any", 1),
    (b"# Port counters: Lid 1 port 1\nPortXmitData:....lots\n", "not a counter", 2),
    (b"# Port counters: Lid 1 port 1\nPortSelect:....2\n", "does not match", 2),
    (b"# Port counters: Lid 1 port 1\ngarbage here\n", "Field:", 2),
    (b"# Port counters: Lid 99999 port 1\n", "16 bits", 1),
    (b"# Port counters: Lid 1 port 1\nPortXmitData:....99999999999999999999\n", "not a counter", 2),
])
def test_perfquery_bad_input_names_the_line(body, words, line):
    with pytest.raises(ParseError, match=words) as e:
        perfquery.parse(body, ts=TS)
    assert e.value.line == line


def test_perfquery_all_ports_sum_is_not_a_port():
    b = perfquery.parse(b"# Port counters: Lid 5 port 255\nPortSelect:....255\nLinkDownedCounter:....3\n", ts=TS)
    assert b.fabric_port_sample is None and b.meta["all_ports_blocks"] == 1


# --- topology ---------------------------------------------------------------------------------------------


def test_ibnetdiscover_links_once_and_unconnected_ports_apart(realdata):
    b = ibnetdiscover.parse(read(realdata, "ibnetdiscover-ports_osc_edr.txt"), ts=TS)
    links = b.fabric_link
    assert b.meta == {"links": 4, "unconnected_ports": 2, "conflicts": 0}
    o1 = links.filter(pl.col("a_host") == "o0001").to_dicts()[0]
    assert (o1["a_node"], o1["a_lid"], o1["b_desc"], o1["b_port"], o1["rate_gbps"]) == ("0x7cfe9003003b4bde", 134, "ib-i1l1s01", 10, 100.0)
    up = links.filter(pl.col("b_desc") == "ib-i1l2s01").to_dicts()[0]
    assert (up["a_desc"], up["a_port"], up["b_port"], up["a_kind"], up["b_kind"]) == ("ib-i1l1s01", 1, 1, "SW", "SW")
    lonely = links.filter(~pl.col("connected")).sort("a_port")
    assert lonely.select("a_desc", "a_port", "speed").rows() == [("ib-i4l1s01", 37, None), ("ib-i7l2s01", 80, "SDR")]


def test_ibnetdiscover_hdr_fabric_trims_descriptions(realdata):
    b = ibnetdiscover.parse(read(realdata, "ibnetdiscover-ports_hdr-sharp-spine.txt"), ts=TS)
    w = b.fabric_link.filter(pl.col("a_host") == "worker20").to_dicts()[0]
    assert (w["a_desc"], w["b_desc"], w["b_port"], w["width"], w["speed"], w["rate_gbps"]) == ("worker20 mlx5_3", "5FB0405-leaf-IB01", 79, "4X", "HDR", 200.0)
    assert "5FB0406-spine-IB02" in b.fabric_link["a_desc"].to_list()  # ' 5FB0406-spine-IB02 ' trimmed
    sharp = b.fabric_link.filter(pl.col("a_desc") == "Mellanox Technologies Aggregation Node").to_dicts()[0]
    assert sharp["a_host"] is None  # an aggregation node's description names no host


@pytest.mark.parametrize(("body", "words"), [
    (b"CA 1 1 0xabc 4x EDR - SW 2 3\n", "not an 'ibnetdiscover --ports' line"),
    (b"CA 1 1 0xabc 3x EDR 'x'\n", "width"),
    (b"CA 99999 1 0xabc 4x EDR 'x'\n", "16 bits"),
    (b"CA 1 1 0x" + b"a" * 17 + b" 4x EDR 'x'\n", "not an 'ibnetdiscover"),
    (b"CA 1 1 0xabc 4x EDR '" + b"d" * 300 + b"'\n", "longer than"),
])
def test_ibnetdiscover_bad_lines(body, words):
    with pytest.raises(ParseError, match=words) as e:
        ibnetdiscover.parse(body)
    assert e.value.line == 1


def test_nccl_topology_pairs_gpus_with_nics_by_pcie_switch(realdata):
    v5 = nccl_topo.parse(read(realdata, "nccl-topo_azure-ndv5_8xH100-8xIB.xml"), host="nd-h100").fabric_gpu_nic
    pairs = dict(v5.select("gpu_bus_id", "nic_bus_id").rows())
    assert pairs == {"0001:00:00.0": "0101:00:00.0", "0002:00:00.0": "0102:00:00.0", "0003:00:00.0": "0103:00:00.0",
                     "0008:00:00.0": "0104:00:00.0", "0009:00:00.0": "0105:00:00.0", "000a:00:00.0": "0106:00:00.0",
                     "000b:00:00.0": "0107:00:00.0", "000c:00:00.0": "0108:00:00.0"}
    assert set(v5["path"]) == {"PIX"} and v5["link_gts"].unique().to_list() == [32.0]
    assert v5.filter(pl.col("gpu_bus_id") == "0009:00:00.0")["numa_node"].item() == 1
    v4 = nccl_topo.parse(read(realdata, "nccl-topo_azure-ndv4_8xA100-8xIB.xml")).fabric_gpu_nic
    assert v4.height == 16  # two GPUs and two NICs per switch: affinity per switch
    assert sorted(v4.filter(pl.col("gpu_bus_id") == "0003:00:00.0")["nic_bus_id"]) == ["0103:00:00.0", "0104:00:00.0"]


@pytest.mark.parametrize(("body", "words"), [
    (b'<!DOCTYPE s [<!ENTITY a "aaaa">]><system>&a;</system>', "DOCTYPE"),
    (b"<system><cpu numaid='0'><pci busid='0001:00:00.0' class='0x030200'>", "well-formed"),
    (b"<topology/>", "root element"),
    (b"<system><cpu numaid='x'/></system>", "numaid"),
    (b"<system><cpu numaid='0'><pci busid='bad' class='0x030200'/></cpu></system>", "busid"),
    (b"<system><cpu numaid='0'><pci busid='0101:00:00.0' class='0x020700'/></cpu></system>", "no GPU"),
])
def test_nccl_topology_hostile_and_malformed(body, words):
    with pytest.raises(ParseError, match=words):
        nccl_topo.parse(body)


def test_nccl_topology_too_deep_is_refused():
    deep = b"<system><cpu numaid='0'>" + b"<pci busid='0000:00:01.0' class='0x060400'>" * 40 + b"</pci>" * 40 + b"</cpu></system>"
    with pytest.raises(ParseError, match="deeper"):
        nccl_topo.parse(deep)


def test_slurm_features_map_nodes_to_leaves_by_prefix(realdata):
    b = slurm_ib_features.parse(read(realdata, "sinfo-node-features_osc-owens_ib-leaf-switch-map.txt"), ts=TS)
    links = b.fabric_link
    assert b.meta == {"nodes": 816, "without_leaf": 0}
    assert links["b_node"].n_unique() == 31
    assert links.filter(pl.col("b_node") == "ib-i1l1s01").height == 26
    assert links.filter(pl.col("a_node").is_in(["o0001", "o0002"]))["b_node"].to_list() == ["ib-i1l1s01", "ib-i1l1s01"]
    assert links.filter(pl.col("a_node") == "o0001")["island"].item() == "ib-i1"


@pytest.mark.parametrize(("body", "words"), [
    (b"28\x1fo0001\x1fib-i1l1s01\n", "record separator"),
    (b"\x1e28\x1fo0001\n", "2 fields"),
    (b"\x1eNaN\x1fo0001\x1fib-i1l1s01\n", "cpus"),
    (b"\x1e28\x1f../x\x1fib-i1l1s01\n", "node name"),
    (b"\x1e28\x1fo1\x1fib-i1l1s01,ib-i2l1s01\n", "two IB leaf"),
    (b"\x1e28\x1fo1\x1fcpu,eth-rack1\n", "no node carries"),
    (b"\x1e28\x1fo1\x1f" + b"x" * 9000, "longer than"),
])
def test_slurm_features_bad_records(body, words):
    with pytest.raises(ParseError, match=words):
        slurm_ib_features.parse(body)


def test_ibswinfo_switch_vitals(realdata):
    bad = ibswinfo.parse(read(realdata, "ibswinfo_sb7790-edr-switch_fan-error.txt"), ts=TS).metric_sample
    vals = dict(bad.select("series", "value").rows())
    g = 'guid="0x1c34da0300010540"'
    assert vals[f"ib_switch_fan_ok{{{g}}}"] == 0.0  # fan status ERROR, although every fan reports rpm
    assert vals[f'ib_switch_fan_rpm{{fan="1",{g}}}'] == 8493.0
    assert vals[f'ib_switch_psu_power_w{{{g},psu="0"}}'] == 72.0
    assert vals[f"ib_switch_temperature_c{{{g}}}"] == 45.0
    assert vals[f"ib_switch_uptime_s{{{g}}}"] == ((160 * 24 + 10) * 60 + 38) * 60 + 53
    assert vals[f"ib_switch_ports{{{g}}}"] == 36.0
    good = dict(ibswinfo.parse(read(realdata, "ibswinfo_qm8790-hdr-switch.txt"), ts=TS).metric_sample.select("series", "value").rows())
    assert good['ib_switch_fan_ok{guid="0x08c0eb0300d9f672"}'] == 1.0
    assert good['ib_switch_psu_power_w{guid="0x08c0eb0300d9f672",psu="0"}'] == 154.0


@pytest.mark.parametrize(("body", "words"), [
    (b"part number | X\n", "no 'GUID"),
    (b"GUID | nope\n", "not a GUID"),
    (b"GUID | 0x1\nuptime (d-h:m:s) | yesterday\n", "uptime"),
    (b"GUID | 0x1\ntemperature (C) | hot\n", "not a number"),
    (b"GUID | 0x1\ntemperature (C) | 1e300\n", "out of range"),
])
def test_ibswinfo_bad_values(body, words):
    with pytest.raises(ParseError, match=words):
        ibswinfo.parse(body, ts=TS)
