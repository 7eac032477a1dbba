"""All-to-all utilisation against the topology's bound, and attribution of communication stragglers to the
port or leaf switch they share, on the real OSC topology and hand-built fat trees."""

from __future__ import annotations

import datetime as dt
import json

import polars as pl
import pytest

from analyzers import fabric, fabric_attribution as fa
from fleetscope.core.errors import ValidationError
from ingest import ibnetdiscover

T = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)
OSC = "fabric/ibnetdiscover-ports_osc_edr.txt"


def osc_links(realdata) -> pl.DataFrame:
    return ibnetdiscover.parse((realdata / OSC).read_bytes()).fabric_link


def a2a(run: str, hosts: str, nranks: int, algbw: float, *, size: int = 1 << 28, ts: dt.datetime = T) -> dict:
    return {"run_id": run, "op": "alltoall", "size_bytes": size, "in_place": False, "ts": ts, "nranks": nranks,
            "algbw_gbps": algbw, "busbw_gbps": algbw * (nranks - 1) / nranks, "hosts": hosts}


def runs_frame(*rows: dict) -> pl.DataFrame:
    return pl.DataFrame(list(rows), schema_overrides={"ts": pl.Datetime("us", "UTC")})


def fat_tree(leaves: int, hosts_per_leaf: int, uplinks_per_leaf: int, *, rate: float = 200.0, degrade: dict | None = None) -> pl.DataFrame:
    """Hosts with one HCA each (4X HDR) under ``leaves`` leaves, each with ``uplinks_per_leaf`` links to a spine."""
    rows = []
    for lf in range(leaves):
        for h in range(hosts_per_leaf):
            host = f"n{lf}{h}"
            rows.append({"a_node": f"0xca{lf}{h}", "a_port": 1, "a_kind": "CA", "a_desc": f"{host} mlx5_0", "a_host": host,
                         "b_node": f"0xleaf{lf}", "b_port": h + 1, "b_kind": "SW", "b_desc": f"leaf{lf}", "rate_gbps": rate, "connected": True})
        for u in range(uplinks_per_leaf):
            r = (degrade or {}).get((lf, u), rate)
            rows.append({"a_node": f"0xleaf{lf}", "a_port": 40 + u, "a_kind": "SW", "a_desc": f"leaf{lf}", "a_host": None,
                         "b_node": "0xspine", "b_port": lf * 10 + u, "b_kind": "SW", "b_desc": "spine", "rate_gbps": r, "connected": True})
    return pl.DataFrame(rows)


def test_host_ports_and_uplinks_from_the_real_osc_topology(realdata):
    links = osc_links(realdata)
    ports = fa.host_ports(links)
    assert ports.select("host", "device", "leaf_desc", "rate_gbps").rows() == [
        ("o0001", "HCA-1", "ib-i1l1s01", 100.0), ("o0002", "HCA-1", "ib-i1l1s01", 100.0), ("p0001", "HCA-1", "ib-i4l1s01", 100.0)]
    up = fa.leaf_uplinks_gbps(links, ports)
    assert up.rows() == [("0x7cfe9003009ce5b0", 12.5, 1)]  # one 4X EDR uplink = 100 Gb/s


def test_alltoall_bound_on_the_real_osc_topology(realdata):
    links = osc_links(realdata)
    # two hosts on one leaf: only their NICs bind. algbw <= b*n/(n-r) = 12.5*2/1 = 25 GB/s; busbw bound 12.5
    util = fa.alltoall_utilization(runs_frame(a2a("r1", "o0001,o0002", 2, 20.0)), links)
    r = util.row(0, named=True)
    assert r["limit"] == "injection" and r["bound_algbw_gbps"] == pytest.approx(25.0) and r["bound_busbw_gbps"] == pytest.approx(12.5)
    assert r["utilization_ratio"] == pytest.approx(10.0 / 12.5) and not r["low"]
    # a leaf whose uplinks are not in the excerpt (p0001's) gives no bound; the other leaf's does
    util = fa.alltoall_utilization(runs_frame(a2a("r2", "o0001,o0002,p0001", 3, 5.0)), links)
    r = util.row(0, named=True)
    # leaf i1l1s01: n*U/(n_l(n-n_l)) = 3*12.5/(2*1) = 18.75; injection 12.5*3/2 = 18.75 (a tie: injection first)
    assert r["bound_algbw_gbps"] == pytest.approx(18.75) and r["leaves"] == 2
    assert r["utilization_ratio"] == pytest.approx((5.0 * 2 / 3) / (18.75 * 2 / 3)) and r["low"]


def test_the_per_leaf_bound_is_the_bisection_bound_for_two_halves():
    # 2 leaves x 4 hosts, 8 ranks per host (8 HCAs would be usual; here one 200 Gb/s HCA per host)
    links = fat_tree(2, 4, 2)
    hosts = ",".join(f"n{lf}{h}" for lf in range(2) for h in range(4))
    util = fa.alltoall_utilization(runs_frame(a2a("r", hosts, 64, 1.0)), links)
    r = util.row(0, named=True)
    B = 2 * 200 / 8  # two 200 Gb/s uplinks per leaf, GB/s
    assert r["leaf_algbw_gbps"] == pytest.approx(fabric.alltoall_bound_gbps(64, B)["bisection_algbw_gbps"])
    assert r["leaf_algbw_gbps"] == pytest.approx(4 * B / 64)
    # injection: 25 GB/s per host over 8 ranks, (64-8)/64 of each rank's traffic leaves the host
    assert r["injection_algbw_gbps"] == pytest.approx(25 / 8 * 64 / 56)
    assert r["limit"] == "leaf_uplinks" and r["leaf"] in ("0xleaf0", "0xleaf1")


def test_a_degraded_uplink_lowers_the_bound_and_flags_a_run_that_reaches_it():
    healthy = fat_tree(2, 2, 2)
    bad = fat_tree(2, 2, 2, degrade={(1, 0): 50.0, (1, 1): 50.0})  # leaf1's uplinks trained down to 1X
    run = runs_frame(a2a("r", "n00,n01,n10,n11", 4, 10.0))
    ok = fa.alltoall_utilization(run, healthy).row(0, named=True)
    worse = fa.alltoall_utilization(run, bad).row(0, named=True)
    # healthy: leaf 4*50/(2*2) = 50 GB/s, injection 25*4/3 = 33.3: the NICs bind
    assert ok["limit"] == "injection" and ok["bound_algbw_gbps"] == pytest.approx(100 / 3)
    # degraded: leaf1 has 12.5 GB/s up, 4*12.5/4 = 12.5 GB/s binds, the run reaches 80 % of it
    assert worse["limit"] == "leaf_uplinks" and worse["leaf"] == "0xleaf1" and worse["bound_algbw_gbps"] == pytest.approx(12.5)
    assert worse["utilization_ratio"] == pytest.approx(0.8)
    slow = fa.alltoall_utilization(runs_frame(a2a("r", "n00,n01,n10,n11", 4, 10.0)), healthy)
    assert slow["utilization_ratio"][0] == pytest.approx(0.3) and slow["low"][0]
    f = fa.utilization_findings(slow)
    assert f["kind"].to_list() == ["alltoall_low_utilization"] and f["subject"].to_list() == ["nccl_test:r"]
    assert f["window_start"][0] == T and "30%" in f["summary"][0]
    assert json.loads(f["evidence"][0])["bound_busbw_gbps"] == pytest.approx(25.0)


def test_runs_without_topology_small_sizes_or_other_ops_give_no_ratio():
    links = fat_tree(1, 2, 0)
    other = runs_frame(a2a("x", "n00,n01", 2, 5.0) | {"op": "all_reduce"}, a2a("s", "n00,n01", 2, 5.0, size=1024))
    assert fa.alltoall_utilization(other, links).height == 0
    unknown = fa.alltoall_utilization(runs_frame(a2a("u", "elsewhere1,elsewhere2", 2, 5.0)), links)
    assert unknown["utilization_ratio"][0] is None and not unknown["low"][0]
    # a NIC rate from elsewhere (the ports' own rate) stands in for a host the topology lacks
    assumed = fa.alltoall_utilization(runs_frame(a2a("u", "elsewhere1,elsewhere2", 2, 5.0)), links, nic_rate_gbps=200.0)
    assert assumed["bound_algbw_gbps"][0] == pytest.approx(50.0)
    with pytest.raises(ValidationError, match="nranks"):
        fa.alltoall_utilization(pl.DataFrame({"run_id": ["a"], "op": ["alltoall"], "size_bytes": [1], "algbw_gbps": [1.0],
                                              "busbw_gbps": [1.0], "hosts": ["a"], "ts": [T]}), links)


def job_ranks(hosts: list[str], per_host: int, job: str = "j1") -> pl.DataFrame:
    return pl.DataFrame([{"job_id": job, "rank": i * per_host + k, "host": h, "gpu_uuid": f"GPU-{h}-{k}"}
                         for i, h in enumerate(hosts) for k in range(per_host)])


def test_slow_ranks_under_one_host_port_point_at_it_and_an_unhealthy_finding_confirms():
    links = fat_tree(2, 2, 2)
    ports = fa.host_ports(links)
    ranks = job_ranks(["n00", "n01", "n10", "n11"], 2)
    place = fa.rank_placement(ranks, ports)
    assert place.filter(pl.col("rank") == 0).select("level", "component").rows() == [("host", "n00"), ("leaf", "0xleaf0"), ("port", "n00/mlx5_0")]
    flap = pl.DataFrame({"kind": ["ib_link_flapping"], "subject": ["host:n00/ib:mlx5_0:1"], "summary": ["down 3 times"]})
    bad = fa.unhealthy_components(flap, ports)
    assert bad.select("level", "component").rows() == [("port", "n00/mlx5_0")]
    attr = fa.attribute_stragglers(place, pl.DataFrame({"job_id": ["j1", "j1"], "rank": [0, 1]}), unhealthy=bad)
    best = attr.filter("best").row(0, named=True)
    assert (best["level"], best["component"], best["slow"], best["ranks"], best["slow_ranks"]) == ("port", "n00/mlx5_0", 2, 2, [0, 1])
    assert best["coverage_ratio"] == 1.0 and best["lift_ratio"] == float("inf") and best["unhealthy"] == ["host:n00/ib:mlx5_0:1"]
    # the leaf covers them too but holds healthy ranks: a suspect, not the best
    leaf = attr.filter(pl.col("component") == "0xleaf0").row(0, named=True)
    assert leaf["suspect"] and not leaf["best"] and leaf["ranks"] == 4
    f = fa.attribution_findings(attr, window_start=T, window_end=T + dt.timedelta(minutes=5), sources={"j1": ["straggler_communication_slow"]})
    assert f["subject"].to_list() == ["job:j1/ib:n00/mlx5_0"] and f["severity"].to_list() == ["critical"]
    ev = json.loads(f["evidence"][0])
    assert ev["slow_ranks"] == [0, 1] and ev["slow_from"] == ["straggler_communication_slow"] and [o["component"] for o in ev["other_suspects"]] == ["n00", "0xleaf0"]


def test_slow_ranks_spread_over_one_leafs_hosts_point_at_the_leaf():
    links = fat_tree(2, 2, 2)
    ports = fa.host_ports(links)
    place = fa.rank_placement(job_ranks(["n00", "n01", "n10", "n11"], 2), ports)
    # both hosts of leaf0 slow, none elsewhere: each port holds half of the slow ranks, the leaf all of them
    slow = pl.DataFrame({"job_id": ["j1"] * 4, "rank": [0, 1, 2, 3]})
    attr = fa.attribute_stragglers(place, slow)
    best = attr.filter("best").row(0, named=True)
    assert (best["level"], best["component"], best["slow"]) == ("leaf", "0xleaf0", 4)
    assert attr.filter(pl.col("level") == "port")["suspect"].to_list() == [True, True]  # each port: 2 of 4 = half, lift inf
    assert attr.filter(pl.col("level") == "host")["suspect"].to_list() == [True, True]
    # no unhealthy link on the leaf: a warning
    f = fa.attribution_findings(attr, window_start=T, window_end=T)
    assert f["severity"].to_list() == ["warning"] and f["subject"].to_list() == ["job:j1/ib:0xleaf0"]


def test_no_suspect_when_slow_ranks_are_everywhere_or_the_component_is_shared_by_all():
    links = fat_tree(1, 2, 1)
    ports = fa.host_ports(links)
    place = fa.rank_placement(job_ranks(["n00", "n01"], 2), ports)
    # slow ranks on both hosts evenly: no lift; the only leaf is shared by every rank
    attr = fa.attribute_stragglers(place, pl.DataFrame({"job_id": ["j1", "j1"], "rank": [0, 2]}))
    assert not attr["suspect"].any() and not attr["best"].any()
    assert fa.attribution_findings(attr, window_start=T, window_end=T).height == 0
    assert fa.attribute_stragglers(place, pl.DataFrame({"job_id": [], "rank": []}, schema={"job_id": pl.String, "rank": pl.Int64})).height == 0


def test_the_gpu_nic_pairing_chooses_the_port_of_a_multi_hca_host():
    # one host with two HCAs on two leaves (rail-optimised); GPU 0 pairs with mlx5_0, GPU 1 with mlx5_1
    rows = [{"a_node": f"0xca{i}", "a_port": 1, "a_kind": "CA", "a_desc": f"h mlx5_{i}", "a_host": "h", "b_node": f"0xleaf{i}",
             "b_port": 1, "b_kind": "SW", "b_desc": f"rail{i}", "rate_gbps": 400.0, "connected": True} for i in range(2)]
    rows += [{"a_node": f"0xca{i}", "a_port": 1, "a_kind": "CA", "a_desc": f"g mlx5_{i}", "a_host": "g", "b_node": f"0xleaf{i}",
              "b_port": 2, "b_kind": "SW", "b_desc": f"rail{i}", "rate_gbps": 400.0, "connected": True} for i in range(2)]
    ports = fa.host_ports(pl.DataFrame(rows))
    ranks = pl.DataFrame({"job_id": ["j"] * 4, "rank": [0, 1, 2, 3], "host": ["h", "h", "g", "g"], "gpu_uuid": ["G0", "G1", "G2", "G3"]})
    gpus = pl.DataFrame({"gpu_uuid": ["G0", "G1", "G2", "G3"], "pci_bus_id": ["0000:1A:00.0", "0000:3B:00.0", None, None], "gpu_index": [0, 1, 0, 1]})
    # h: NCCL topology by bus id; g: nvidia-smi topo -m rows (GPU<i>, device names), a machine-type row
    gpu_nic = pl.DataFrame({"host": ["h", "h", "", ""], "gpu_bus_id": ["0000:1a:00.0", "0000:3b:00.0", "GPU0", "GPU1"],
                            "nic_bus_id": ["mlx5_0", "mlx5_1", "mlx5_0", "mlx5_1"]})
    place = fa.rank_placement(ranks, ports, gpus=gpus, gpu_nic=gpu_nic)
    assert place.filter(pl.col("level") == "port").sort("rank")["component"].to_list() == ["h/mlx5_0", "h/mlx5_1", "g/mlx5_0", "g/mlx5_1"]
    assert place.filter(pl.col("level") == "leaf").sort("rank")["component"].to_list() == ["0xleaf0", "0xleaf1", "0xleaf0", "0xleaf1"]
    # rail 1 slow on both hosts: its leaf is the common cause
    attr = fa.attribute_stragglers(place, pl.DataFrame({"job_id": ["j", "j"], "rank": [1, 3]}))
    assert attr.filter("best")["component"].to_list() == ["0xleaf1"]
    # without a pairing, a host's ranks sit under every leaf it reaches and no port is named
    loose = fa.rank_placement(ranks, ports)
    assert loose.filter(pl.col("level") == "port").height == 0 and loose.filter((pl.col("rank") == 0) & (pl.col("level") == "leaf")).height == 2


def test_ports_named_only_by_counter_findings_still_place_ranks():
    # no topology at all (the simulator's fleet): the flapping port comes from node_exporter's counters
    empty = pl.DataFrame(schema=fa.PORTS_SCHEMA)
    ranks = job_ranks(["a", "b"], 2)
    bad = fa.unhealthy_components(pl.DataFrame({"kind": ["ib_link_flapping", "gpu_absent"], "subject": ["host:b/ib:mlx5_0:1", "gpu:x"],
                                                "summary": ["", ""]}), empty)
    extra = bad.select(pl.col("component").str.split("/").list.get(0).alias("host"), pl.col("component").str.split("/").list.get(1).alias("device"))
    place = fa.rank_placement(ranks, empty, extra_ports=extra)
    assert place.filter(pl.col("level") == "port").rows() == [("j1", 2, "port", "b/mlx5_0"), ("j1", 3, "port", "b/mlx5_0")]
    assert place.filter(pl.col("level") == "host").height == 4
    best = fa.attribute_stragglers(place, pl.DataFrame({"job_id": ["j1", "j1"], "rank": [2, 3]}), unhealthy=bad).filter("best")
    assert best["component"].to_list() == ["b/mlx5_0"] and best["unhealthy"].to_list() == [["host:b/ib:mlx5_0:1"]]


def test_bad_input_is_refused_with_the_frame_named():
    with pytest.raises(ValidationError, match="fabric_link"):
        fa.host_ports(pl.DataFrame({"a_node": ["x"]}))
    with pytest.raises(ValidationError, match="job_rank"):
        fa.rank_placement(pl.DataFrame({"job_id": ["j"]}), pl.DataFrame(schema=fa.PORTS_SCHEMA))
    with pytest.raises(TypeError):
        fa.attribute_stragglers({"job_id": []}, pl.DataFrame())  # type: ignore[arg-type]
