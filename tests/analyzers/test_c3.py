"""analyzers.c3: HTA parity on real traces, C³ identity, wait/transfer split, scaling and the Fleet Law."""

from __future__ import annotations

import gzip
import json
import math
from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl
import pytest

from analyzers import c3
from fleetscope.core.frames import COLLECTIVE, STEP
from ingest import kineto
# Meta's HTA's own figures for the real traces, and the check with its tolerances, shared with the service's tests.
from tests.hta_reference import HTA_DIR, HTA_REFERENCE, check_rank, needs_traces, trace_files


def _load_dir(d: str):
    traces = [kineto.load(p.read_bytes(), source=str(p)) for p in sorted((HTA_DIR / d).glob("*.json*"))]
    return pl.concat([t.device_events for t in traces]), pl.concat([t.profiler_steps for t in traces])


@needs_traces
@pytest.mark.parametrize("trace_dir", sorted(HTA_REFERENCE))
def test_temporal_breakdown_and_overlap_match_hta(trace_dir):
    dev, steps = _load_dir(trace_dir)
    tb = c3.hta_temporal_breakdown(dev, steps)
    ov = c3.hta_comm_comp_overlap(dev, steps)
    assert tb["rank"].to_list() == sorted(HTA_REFERENCE[trace_dir])
    for row, o in zip(tb.iter_rows(named=True), ov.iter_rows(named=True)):
        check_rank({**row, **o}, HTA_REFERENCE[trace_dir][row["rank"]])


@needs_traces
@pytest.mark.parametrize("trace_dir", sorted(HTA_REFERENCE))
def test_report_from_the_unions_kineto_stores_matches_hta(trace_dir):
    # what the service does: the reader's device_union rows, then hta_report; the same figures as HTA's
    b = kineto.parse_many([(p.name, p.read_bytes()) for p in trace_files(trace_dir)], job_id="j")
    rep = c3.hta_report(b.device_union)
    assert rep["reason"] is None and rep["window"] == ("all" if trace_dir == "critical_path_alexnet" else "before_last_step")
    assert [r["rank"] for r in rep["ranks"]] == sorted(HTA_REFERENCE[trace_dir])
    for row in rep["ranks"]:
        check_rank(row, HTA_REFERENCE[trace_dir][row["rank"]])
        assert row["traces"] == 1
    # the job's line is the ranks' sums: one rank, its own figures
    if len(rep["ranks"]) == 1:
        r = rep["ranks"][0]
        assert {k: rep["job"][k] for k in ("kernel_time_us", "idle_time_pctg", "comp_comm_overlap_pctg")} == {
            k: r[k] for k in ("kernel_time_us", "idle_time_pctg", "comp_comm_overlap_pctg")}


def _unions(rows) -> pl.DataFrame:
    """rows: (rank, start_offset_s, window, span, busy, compute, comm, overlap, step_min, step_max)."""
    return pl.DataFrame([{"job_id": "j", "rank": r, "start": T0 + timedelta(seconds=o), "window": w, "events": 5, "span_us": sp,
                          "busy_us": b, "compute_us": c, "comm_us": m, "overlap_us": ov, "step_min": lo, "step_max": hi}
                         for r, o, w, sp, b, c, m, ov, lo, hi in rows])


def test_report_takes_each_ranks_latest_trace_and_htas_window_rule():
    u = _unions([
        (0, 0, "all", 100.0, 60.0, 30.0, 20.0, 5.0, 7, 7), (0, 0, "before_last_step", 50.0, 40.0, 20.0, 10.0, 2.0, 7, 7),
        (0, 9, "all", 200.0, 150.0, 100.0, 40.0, 10.0, 8, 8), (0, 9, "before_last_step", 80.0, 60.0, 40.0, 0.0, 0.0, 8, 8),
        (1, 0, "all", 100.0, 100.0, 50.0, 0.0, 0.0, 8, 8),
    ])
    # the latest traces name one step each, the same one: HTA's rule leaves nothing out
    rep = c3.hta_report(u)
    assert rep["window"] == "all" and [(r["rank"], r["traces"], r["kernel_time_us"]) for r in rep["ranks"]] == [(0, 2, 200.0), (1, 1, 100.0)]
    r0 = rep["ranks"][0]
    assert (r0["idle_time_us"], r0["compute_time_us"], r0["non_compute_time_us"]) == (50.0, 100.0, 50.0)
    assert (r0["idle_time_pctg"], r0["comp_comm_overlap_ratio"], r0["comp_comm_overlap_pctg"]) == (25.0, 0.25, 25.0)
    assert rep["ranks"][1]["comp_comm_overlap_ratio"] is None  # no communication kernel
    assert rep["job"] == {"ranks": 2, "kernel_time_us": 300.0, "idle_time_us": 50.0, "compute_time_us": 150.0, "non_compute_time_us": 100.0,
                          "idle_time_pctg": 16.67, "compute_time_pctg": 50.0, "non_compute_time_pctg": 33.33,
                          "comp_comm_overlap_ratio": 0.25, "comp_comm_overlap_pctg": 25.0}
    # rank 1 names another step: two step names, so the last step is left out, and rank 1 has nothing before it
    u2 = u.with_columns(pl.when(pl.col("rank") == 1).then(9).otherwise(pl.col("step_min")).alias("step_min"))
    rep2 = c3.hta_report(u2)
    assert rep2["window"] == "before_last_step" and [r["rank"] for r in rep2["ranks"]] == [0]
    assert rep2["ranks"][0]["comp_comm_overlap_pctg"] is None and rep2["ranks"][0]["kernel_time_us"] == 80.0
    assert c3.hta_report(u2, include_last_step=True)["window"] == "through_last_step"
    assert c3.hta_report(u2, include_last_step=True)["reason"] == f"{c3.NO_EVENTS_IN_WINDOW} (through_last_step)"
    assert c3.hta_report(u.clear())["reason"] == "no Kineto kernel data: no device_union rows"


@needs_traces
@pytest.mark.parametrize("trace_dir", ["two_rank_sampled_128gpu_job", "nccl_data_rank0_of_2"])
def test_matches_hta_live_when_installed(trace_dir):
    hta = pytest.importorskip("hta.trace_analysis", reason="HTA (pip install holistictraceanalysis) not installed")
    ta = hta.TraceAnalysis(trace_dir=str(HTA_DIR / trace_dir))
    ref_tb = ta.get_temporal_breakdown(visualize=False)
    ref_ov = ta.get_comm_comp_overlap(visualize=False)
    dev, steps = _load_dir(trace_dir)
    tb = c3.hta_temporal_breakdown(dev, steps).sort("rank")
    ov = c3.hta_comm_comp_overlap(dev, steps).sort("rank")
    for col in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"):
        assert np.allclose(tb[col].to_numpy(), ref_tb.sort_values("rank")[col].to_numpy(), atol=0.1)
    assert np.allclose(ov["comp_comm_overlap_pctg"].to_numpy(), ref_ov.sort_values("rank")["comp_comm_overlap_pctg"].to_numpy(), atol=0.1)


def test_kernel_type_follows_hta_rules():
    assert c3.kernel_type("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)") == "COMMUNICATION"
    assert c3.kernel_type("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "COMMUNICATION"
    assert c3.kernel_type("Memcpy DtoH (Device -> Pinned)") == "MEMORY"
    assert c3.kernel_type("Memset (Device)") == "MEMORY"
    assert c3.kernel_type("sm80_xmma_gemm_f16f16_f16f32") == "COMPUTATION"
    assert c3.kernel_type("Stream Sync") == "OTHER"
    assert c3.kernel_type("void at::native::cudaMemcpyLike") == "OTHER"


def test_hta_window_leaves_out_last_step_and_uses_launch_time():
    # two steps on the host; a kernel launched in step 1 but running late is kept, one launched in the
    # last step is dropped; HTA rounds start up and end down to whole µs.
    dev = pl.DataFrame({
        "rank": [0, 0, 0], "cat": ["kernel"] * 3, "name": ["gemm", "ncclKernel_X", "gemm"],
        "stream": [7, 9, 7], "correlation": [1, 2, 3],
        "ts_us": [10.2, 20.0, 150.0], "dur_us": [9.9, 10.0, 10.0], "launch_ts_us": [1.0, 2.0, 101.0],
    })
    steps = pl.DataFrame({"rank": [0, 0], "step": [1, 2], "name": ["ProfilerStep#1", "ProfilerStep#2"],
                          "ts_us": [0.0, 100.0], "dur_us": [100.0, 100.0], "device_side": [False, False],
                          "cat": ["user_annotation"] * 2})
    tb = c3.hta_temporal_breakdown(dev, steps).row(0, named=True)
    # kept: gemm [11, 20) and nccl [20, 30) → kernel time 19, no idle, compute 9
    assert (tb["kernel_time_us"], tb["idle_time_us"], tb["compute_time_us"]) == (19.0, 0.0, 9.0)
    assert c3.hta_temporal_breakdown(dev, steps, include_last_step=True)["kernel_time_us"].item() == 149.0
    assert c3.hta_comm_comp_overlap(dev, steps)["comp_comm_overlap_ratio"].item() == 0.0


# --- C³ on hand-built frames ----------------------------------------------------------------------

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def _steps(rows) -> pl.DataFrame:
    """rows: (rank, step, start_offset_s, step_s, compute_s, comm_s, overlap_s)."""
    out = []
    for rank, step, off, dur, comp, comm, ov in rows:
        dur = round(dur, 6)  # the frame's timestamps are whole µs
        start = T0 + timedelta(seconds=off)
        out.append({"job_id": "j", "rank": rank, "step": step, "start": start, "end": start + timedelta(seconds=dur),
                    "compute_s": comp, "comm_s": comm, "comm_overlap_s": ov, "idle_s": dur - (comp + comm - ov),
                    "tokens": None, "model_flops": None})
    return pl.DataFrame(out, schema=STEP.schema)


def _colls(rows) -> pl.DataFrame:
    """rows: (rank, seq, start_offset_s, duration_s)."""
    out = [{"job_id": "j", "rank": r, "comm_id": "pg:0", "seq": s, "op": "all_reduce", "bytes": 1 << 20, "nranks": 4,
            "start": T0 + timedelta(seconds=off), "duration_s": d} for r, s, off, d in rows]
    return pl.DataFrame(out, schema={k: v for k, v in COLLECTIVE.schema.items() if k in out[0]})


def test_wait_transfer_split_on_four_rank_collective():
    # rank 3 arrives last and waits least: its 2 ms is the transfer; the others waited 1, 3, 5 ms
    col = _colls([(0, 0, 0.010, 0.005), (1, 0, 0.012, 0.003), (2, 0, 0.011, 0.007), (3, 0, 0.015, 0.002),
                  (0, 1, 0.050, 0.004), (1, 1, 0.050, 0.004), (2, 1, 0.050, 0.004), (3, 1, 0.050, 0.004)])
    w = c3.collective_wait(col).sort("seq", "rank")
    assert w.filter(pl.col("seq") == 0)["transfer_s"].to_list() == pytest.approx([0.002] * 4)
    assert w.filter(pl.col("seq") == 0)["wait_s"].to_list() == pytest.approx([0.003, 0.001, 0.005, 0.0])
    assert w.filter(pl.col("seq") == 1)["wait_s"].to_list() == pytest.approx([0.0] * 4)
    assert set(w["ranks_seen"]) == {4}


def test_c1_c2_c3_add_up_to_step_time_exactly():
    rng = np.random.default_rng(7)
    rows, crow = [], []
    for rank in range(4):
        for step in range(20):
            dur = float(rng.uniform(0.05, 0.2))
            comp = float(rng.uniform(0.2, 0.6)) * dur
            comm = float(rng.uniform(0.05, 0.3)) * dur
            ov = float(rng.uniform(0, 1)) * min(comp, comm)
            rows.append((rank, step, step * 1.0, dur, comp, comm, ov))
            crow.append((rank, step, step * 1.0 + 0.001, float(rng.uniform(0.001, 0.01))))
    st, col = _steps(rows), _colls(crow)
    b = c3.c3_breakdown(st, col)
    assert b.height == 80
    # exact, not approx: C1 + C2 + C3 reproduces step_s bit for bit, whichever order it is added in
    assert (b["c1_compute_s"] + b["c2_comm_s"] + b["c3_coord_s"] == b["step_s"]).all()
    assert (b["c3_coord_s"] + b["c2_comm_s"] + b["c1_compute_s"] == b["step_s"]).all()
    exact_us = st.select((pl.col("end") - pl.col("start")).dt.total_microseconds() / 1e6).to_series()
    assert np.allclose(b.sort("rank", "step")["step_s"].to_numpy(), exact_us.to_numpy(), rtol=0, atol=1e-9)
    # and the remainder is what the model says it is: idle + exposed wait
    j = b.join(st.select("rank", "step", "idle_s"), on=["rank", "step"])
    expected_c3 = j["idle_s"] + j["exposed_comm_s"] * j["wait_ratio"]
    assert np.allclose(j["c3_coord_s"].to_numpy(), expected_c3.to_numpy(), atol=1e-12)
    assert ((b["f_compute"] > 0) & (b["f_compute"] < 1)).all()


def test_c3_breakdown_assigns_wait_to_coordination():
    # one step per rank, 100 ms; 40 ms compute, 30 ms comm of which 10 ms hidden; collective as above
    st = _steps([(r, 0, 0.0, 0.1, 0.04, 0.03, 0.01) for r in range(4)])
    col = _colls([(0, 0, 0.05, 0.005), (1, 0, 0.05, 0.003), (2, 0, 0.05, 0.007), (3, 0, 0.05, 0.002)])
    b = c3.c3_breakdown(st, col).sort("rank")
    wr = [3 / 5, 1 / 3, 5 / 7, 0.0]
    assert b["wait_ratio"].to_list() == pytest.approx(wr)
    assert b["c2_comm_s"].to_list() == pytest.approx([0.02 * (1 - x) for x in wr])
    assert b["c3_coord_s"].to_list() == pytest.approx([0.1 - 0.04 - 0.02 + 0.02 * x for x in wr])
    # without collectives every exposed second is transfer
    alone = c3.c3_breakdown(st)
    assert alone["c2_comm_s"].to_list() == pytest.approx([0.02] * 4)


def test_job_summary_names_the_dominant_component():
    st = _steps([(r, s, s * 1.0, 0.1, 0.02, 0.01, 0.0) for r in range(2) for s in range(5)])  # idle 70 ms
    summ = c3.job_summary(c3.c3_breakdown(st), collective=_colls([(0, 0, 0.0, 0.01)]), flops=1e12)
    row = summ.row(0, named=True)
    assert row["dominant"] == "C3" and "straggler" in row["advice"].lower()
    assert row["c3_ratio"] == pytest.approx(0.7) and row["steps"] == 5 and row["ranks"] == 2
    assert row["step_s_p50"] == pytest.approx(0.1) and row["c1_compute_s_p99"] == pytest.approx(0.02)
    # 1 MiB all-reduce over 4 ranks puts 2·3/4 MiB on the wire
    assert row["comm_intensity_bytes_per_flop"] == pytest.approx((1 << 20) * 1.5 / 1e12)
    busy = _steps([(0, s, s * 1.0, 0.1, 0.09, 0.0, 0.0) for s in range(3)])
    assert c3.job_summary(c3.c3_breakdown(busy))["dominant"].item() == "C1"
    assert c3.communication_intensity(1e9, 0) is None


@needs_traces
def test_c3_on_real_two_rank_job():
    files = [(p.name, p.read_bytes()) for p in sorted((HTA_DIR / "two_rank_sampled_128gpu_job").glob("*.gz"))]
    b = kineto.parse_many(files, job_id="j")
    br = c3.c3_breakdown(b.step, b.collective)
    assert br.height == 4
    assert (br["c1_compute_s"] + br["c2_comm_s"] + br["c3_coord_s"] == br["step_s"]).all()
    assert (br["c2_comm_s"] >= 0).all() and (br["c3_coord_s"] >= 0).all()
    # HTA's window is step 551 (it leaves the last step out); its compute is the union of compute kernels,
    # where C1 also counts memcpy/memset (HTA books them as non-compute). Their durations come from the raw
    # trace; a memory op that overlaps a compute kernel counts once in C1, hence the 50 µs allowance.
    hta = HTA_REFERENCE["two_rank_sampled_128gpu_job"]
    for rank, (name, raw) in enumerate(files):
        events = json.loads(gzip.decompress(raw))["traceEvents"]
        lo, hi = next((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "ProfilerStep#551")
        mem_us = sum(e["dur"] for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset") and lo <= e["ts"] < hi)
        row = br.filter((pl.col("rank") == rank) & (pl.col("step") == 551)).row(0, named=True)
        idle_us, compute_us = hta[rank][0], hta[rank][1]
        assert row["c1_compute_s"] == pytest.approx((compute_us + mem_us) / 1e6, abs=50e-6), (name, mem_us)
        # idle device time is neither compute nor transfer, so it all lands in C3
        assert row["c3_coord_s"] >= idle_us / 1e6, name
    # HTA finds the GPUs idle for over half the kernel time on both ranks (53.56 %, 54.72 %): C3 dominates
    assert c3.job_summary(br)["dominant"].item() == "C3"


# --- scaling --------------------------------------------------------------------------------------


def test_scaling_efficiency():
    eff = c3.scaling_efficiency([8, 1, 2, 4], [0.15, 1.0, 0.52, 0.27])
    assert eff["world_size"].to_list() == [1, 2, 4, 8]
    assert eff["efficiency"].to_list() == pytest.approx([1.0, 1 / 1.04, 1 / 1.08, 1 / 1.2])
    assert eff["speedup"].to_list() == pytest.approx([1.0, 1 / 0.52, 1 / 0.27, 1 / 0.15])
    # no N=1 run: relative to the smallest one
    rel = c3.scaling_efficiency([4, 8], [0.25, 0.15])
    assert rel["efficiency"].to_list() == pytest.approx([1.0, 1.0 / 1.2])
    with pytest.raises(ValueError):
        c3.scaling_efficiency([1, 2], [1.0, -1.0])


@pytest.mark.parametrize(("term", "n_opt"), [("ring", math.sqrt(10.0 / (2 * 1e-3))), ("tree", 10.0 * math.log(2) / 0.05)])
def test_fleet_law_fit_recovers_known_parameters(term, n_opt):
    a, b, c = 10.0, (1e-3 if term == "ring" else 0.05), 0.2
    n = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256])
    f = {"ring": lambda x: 2 * (x - 1), "tree": np.log2}[term]
    t = a / n + b * f(n) + c
    t_noisy = t * (1 + np.random.default_rng(1).normal(0, 0.002, n.size))
    fit = c3.fit_fleet_law(n, t, comm_term=term)
    assert (fit.a_s, fit.b_s, fit.c_s) == pytest.approx((a, b, c), rel=1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.n_opt == pytest.approx(n_opt)
    assert fit.predict(n) == pytest.approx(t)
    noisy = c3.fit_fleet_law(n, t_noisy, comm_term=term)
    assert noisy.a_s == pytest.approx(a, rel=0.02) and noisy.n_opt == pytest.approx(n_opt, rel=0.1)
    # past n_opt, more GPUs make the step slower
    assert fit.predict(2 * n_opt) > fit.predict(n_opt)


def test_fleet_law_needs_three_world_sizes_and_flags_no_minimum():
    with pytest.raises(ValueError):
        c3.fit_fleet_law([1, 2, 2], [1.0, 0.6, 0.6])
    n = np.array([1, 2, 4, 8])
    fit = c3.fit_fleet_law(n, 4.0 / n + 0.5, comm_term="ring_bandwidth")
    assert math.isinf(fit.n_opt)
