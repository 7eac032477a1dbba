"""analyzers.fabric: busbw = algbw × factor on the real nccl-tests and NCCL Inspector files, rank-count
inference, peak ratios, group testing for slow hosts / ranks, links, regressions and the all-to-all bound."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

from analyzers import fabric
from fleetscope.core.errors import ValidationError
from fleetscope.core.frames import FINDING, NCCL_TEST
from ingest import nccl_inspector, nccl_tests

REPO = Path(__file__).resolve().parents[2]
TELEMETRY = REPO.parent / "shared" / "realdata" / "telemetry"
P5 = "nccl-tests_all_reduce_perf_p5.48xlarge_H100_EFA_mpirun_excerpt.txt"
T4 = "nccl-debug-info+all_reduce_perf_2xT4_EFA_nccl-2.12.7_mpirun.log"
INSPECTOR = "nccl-inspector_output-examples_v4.0_from-README.jsonl"
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def real(name: str) -> bytes:
    path = TELEMETRY / name
    if not path.is_file():
        pytest.skip(f"real telemetry file not found at {path}")
    return path.read_bytes()


# --- factors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [("AllReduce", 8, 1.75), ("all_reduce", 16, 1.875), ("allgather", 8, 0.875), ("ReduceScatter", 32, 31 / 32),
     ("alltoall", 4, 0.75), ("Broadcast", 8, 1.0), ("reduce", 64, 1.0), ("sendrecv", 2, 1.0), ("nccl:all_gather", 2, 0.5)],
)
def test_busbw_factors_from_nccl_tests(op, n, factor):
    assert fabric.busbw_factor(op, n) == pytest.approx(factor)


def test_unknown_op_and_bad_rank_count():
    with pytest.raises(ValueError, match="unknown collective"):
        fabric.busbw_factor("allsum", 8)
    with pytest.raises(ValueError):
        fabric.busbw_factor("all_reduce", 0)


# --- the real files ---------------------------------------------------------------------------------------


def test_p5_h100_excerpt_busbw_is_algbw_times_2_n_minus_1_over_n_with_n_16():
    """The excerpt lacks the device list; its own numbers say 16 ranks (2 × p5.48xlarge, 8 H100 each):
    busbw/algbw = 2·15/16 = 1.875 on every printed row, to the printing's rounding."""
    t = nccl_tests.parse(real(P5), source=P5).nccl_test
    assert t["nranks"].null_count() == t.height
    top = t.sort("algbw_gbps").row(-1, named=True)
    assert fabric.infer_nranks("all_reduce", top["algbw_gbps"], top["busbw_gbps"]) == 16
    with pytest.raises(ValidationError, match="nranks"):
        fabric.check_bus_bandwidth(t)
    chk = fabric.check_bus_bandwidth(t, nranks=16)
    assert chk.height == 64 and chk["consistent"].all()
    assert chk["busbw_deviation_gbps"].abs().max() < 0.015
    # and a wrong rank count is caught: 8 ranks would give 1.75 × algbw
    assert not fabric.check_bus_bandwidth(t, nranks=8)["consistent"].all()


def test_p5_algbw_is_size_over_time():
    t = nccl_tests.parse(real(P5), source=P5).nccl_test.filter(pl.col("size_bytes") >= 1 << 20)
    implied = t["size_bytes"] / t["time_s"] / 1e9
    # time is printed with 4-5 significant digits, algbw to 0.01 GB/s
    assert ((implied - t["algbw_gbps"]).abs() <= 0.005 + 1e-3 * t["algbw_gbps"]).all()


def test_t4_two_ranks_factor_one():
    t = nccl_tests.parse(real(T4), source=T4).nccl_test
    assert t["nranks"].unique().to_list() == [2]
    chk = fabric.check_bus_bandwidth(t)
    assert chk["consistent"].all() and (chk["busbw_factor"] == 1.0).all()
    assert fabric.infer_nranks("all_reduce", 3.15, 3.15) == 2


def test_inspector_examples_busbw_matches_their_algbw():
    c = nccl_inspector.parse(real(INSPECTOR), source=INSPECTOR).collective
    chk = fabric.check_bus_bandwidth(c, rounding_gbps=1e-6)
    assert chk.height == 3 and chk["consistent"].all()
    assert chk["busbw_factor"].to_list() == pytest.approx([1.75, 0.875, 31 / 32])


def test_bandwidth_vs_peak_on_the_p5_run():
    t = nccl_tests.parse(real(P5), source=P5).nccl_test
    b = fabric.bandwidth_vs_peak(t, {"AllReduce": 480.0})
    top = b.filter(pl.col("size_bytes") == 17179869184).row(0, named=True)
    assert top["busbw_gbps"] == pytest.approx((480.87 + 482.82) / 2)
    assert top["peak_ratio"] == pytest.approx(top["busbw_gbps"] / 480.0)
    small = b.filter(pl.col("size_bytes") == 8).row(0, named=True)
    assert small["peak_ratio"] < 0.001  # 8-byte messages measure latency, not bandwidth
    with pytest.raises(ValueError):
        fabric.bandwidth_vs_peak(t, 0.0)


# --- slow members -------------------------------------------------------------------------------------------


def _runs(host_sets: list[tuple[str, ...]], slow_host: str | None = None, op: str = "all_reduce", start: datetime = T0) -> pl.DataFrame:
    rows = []
    for i, hosts in enumerate(host_sets):
        bw = 360.0 * (0.5 if slow_host in hosts else 1.0) * (1 + 0.01 * (i % 3))
        for size in (1 << 26, 1 << 28, 1 << 30):
            for in_place in (False, True):
                rows.append({"run_id": f"run{i}", "op": op, "size_bytes": size, "in_place": in_place, "ts": start + timedelta(hours=i),
                             "nranks": 16, "algbw_gbps": bw / 1.875, "busbw_gbps": bw, "hosts": ",".join(hosts)})
    return pl.DataFrame(rows, schema=NCCL_TEST.schema)


def test_pairwise_nccl_tests_localise_the_bad_node():
    hosts = [f"n{i}" for i in range(6)]
    pairs = [(a, b) for i, a in enumerate(hosts) for b in hosts[i + 1:]]
    m = fabric.slow_members(fabric.nccl_test_groups(_runs(pairs, slow_host="n3")))
    by = {r["member"]: r for r in m.to_dicts()}
    assert [h for h, r in by.items() if r["slow"]] == ["n3"]
    assert by["n3"]["innocent_groups"] == 0 and by["n3"]["groups"] == 5
    assert all(by[h]["innocent_groups"] == 4 for h in hosts if h != "n3")  # each other host shared one run with n3
    f = fabric.fabric_findings(members=m, window_start=T0, window_end=T0 + timedelta(days=1))
    assert f.columns == list(FINDING.names) and f["subject"].to_list() == ["host:n3"]


def test_a_single_run_has_no_peers_and_blames_nobody():
    assert fabric.slow_members(fabric.nccl_test_groups(_runs([("a", "b")], slow_host="a"))).height == 0


def test_slow_rank_from_communicators_despite_waiting():
    """8 ranks in 2-rank communicators (every pair); rank 5's link is slow. In each collective the faster
    peer waits for rank 5, so per-rank durations alone cannot tell them apart — the group figure can."""
    rows = []
    seq = 0
    for a in range(8):
        for b in range(a + 1, 8):
            slow = 5 in (a, b)
            transfer = 2.0 if slow else 1.0
            for rank, dur in ((a, transfer), (b, transfer + 0.3)):  # the later arriver waits less
                rows.append({"job_id": "j", "rank": rank, "comm_id": f"c{a}{b}", "seq": seq, "op": "AllReduce", "bytes": 1 << 28,
                             "nranks": 2, "duration_s": dur, "busbw_gbps": (1 << 28) / dur / 1e9, "host": f"h{rank // 4}"})
            seq += 1
    m = fabric.slow_members(fabric.collective_groups(pl.DataFrame(rows)))
    assert m.filter("slow")["member"].to_list() == ["5"]
    hosts = fabric.slow_members(fabric.collective_groups(pl.DataFrame(rows), member="host"), min_groups=2)
    assert not hosts["slow"].any()  # host h1 also carries healthy ranks 4, 6, 7: not blamed as a whole


def test_slow_link_between_two_hosts():
    rows = []
    for rank in range(4):
        peer = (rank + 1) % 4
        for k in range(5):
            bw = 10.0 if (rank, peer) == (1, 2) else 40.0
            rows.append({"job_id": "j", "rank": rank, "comm_id": "p2p", "seq": k, "op": "Send", "peer": peer, "bytes": 1 << 24,
                         "busbw_gbps": bw, "host": f"h{rank}"})
    links = fabric.slow_links(pl.DataFrame(rows))
    bad = links.filter("slow")
    assert bad.select("rank", "peer", "host", "peer_host").rows() == [(1, 2, "h1", "h2")]
    f = fabric.fabric_findings(links=links, window_start=T0, window_end=T0)
    assert "h1 → h2" in f["summary"][0]


# --- regressions -----------------------------------------------------------------------------------------------


def test_regression_of_a_run_against_its_history():
    healthy = _runs([("a", "b")] * 4)
    healthy = healthy.with_columns(pl.concat_str([pl.lit("h"), pl.col("run_id")]).alias("run_id"))
    bad = _runs([("a", "b")], slow_host="a", start=T0 + timedelta(days=1)).with_columns(pl.lit("today").alias("run_id"))
    r = fabric.nccl_test_regressions(pl.concat([healthy, bad]))
    assert r.height == 5 and r["baseline_runs"].to_list() == [0, 1, 2, 3, 4]
    today = r.filter(pl.col("run_id") == "today").row(0, named=True)
    assert today["regression"] and today["ratio"] == pytest.approx(0.5, abs=0.02)
    assert not r.filter(pl.col("run_id") != "today")["regression"].any()
    f = fabric.fabric_findings(regressions=r, window_start=T0, window_end=T0 + timedelta(days=2))
    assert f["kind"].to_list() == ["nccl_test_regression"] and json.loads(f["evidence"][0])["run_id"] == "today"
    # dated by its run, not by the sweep that found it: a later sweep updates the same finding
    assert f["window_start"][0] == f["window_end"][0] == today["ts"]


def test_regressions_need_timestamps():
    t = nccl_tests.parse(real(T4), source=T4).nccl_test  # nccl-tests prints no zone: ts stays null unless ingest stamps it
    with pytest.raises(ValidationError, match="timestamp"):
        fabric.nccl_test_regressions(t, min_size_bytes=0)
    stamped = nccl_tests.parse(real(T4), source=T4, ts=T0).nccl_test
    r = fabric.nccl_test_regressions(stamped)
    assert r.height == 1 and r["ratio"][0] is None and not r["regression"][0]


# --- all-to-all and bisection --------------------------------------------------------------------------------------


def test_alltoall_bounds():
    # full-bisection fat tree, 1,024 ranks at 50 GB/s each: bisection 512 × 50 GB/s, injection binds
    full = fabric.alltoall_bound_gbps(1024, 512 * 50.0, 50.0)
    assert full["limit"] == "injection" and full["algbw_gbps"] == pytest.approx(50.0 * 1024 / 1023)
    assert full["busbw_gbps"] == pytest.approx(50.0)  # busbw at the bound is the link speed
    # 4:1 oversubscribed: the cut binds at 4B/n = 4 · 6,400 / 1,024 = 25 GB/s
    over = fabric.alltoall_bound_gbps(1024, 512 * 50.0 / 4, 50.0)
    assert over["limit"] == "bisection" and over["algbw_gbps"] == pytest.approx(25.0)
    with pytest.raises(ValueError):
        fabric.alltoall_bound_gbps(1, 100.0)


def test_alltoall_utilization_of_rows():
    rows = pl.DataFrame({"op": ["alltoall", "all_reduce"], "algbw_gbps": [20.0, 100.0], "nranks": [1024, 1024]})
    u = fabric.alltoall_bisection_utilization(rows, 512 * 50.0 / 4, link_gbps=50.0)
    assert u.height == 1 and u["bound_ratio"][0] == pytest.approx(0.8)


def test_bad_input():
    with pytest.raises(ValidationError, match="busbw_gbps"):
        fabric.check_bus_bandwidth(pl.DataFrame({"op": ["all_reduce"], "algbw_gbps": [1.0]}), nranks=2)
    with pytest.raises(TypeError):
        fabric.slow_members([])  # type: ignore[arg-type]
    assert fabric.slow_members(pl.DataFrame(schema={"group_id": pl.String, "shape": pl.String, "members": pl.List(pl.String),
                                                    "busbw_gbps": pl.Float64})).height == 0
    assert fabric.fabric_findings(window_start=T0, window_end=T0).height == 0
