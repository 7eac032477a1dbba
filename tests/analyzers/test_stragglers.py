"""analyzers.stragglers: detection, attribution, persistence, cost, what-if on ByteDance's real traces and
on hand-built pipelines, findings, and bad input; ingest.bytedance_whatif's loader."""

from __future__ import annotations

import io
import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

from analyzers import stragglers as s
from fleetscope.core.errors import ParseError
from fleetscope.core.frames import FINDING, UTC_US
from ingest import bytedance_whatif as bw

REPO = Path(__file__).resolve().parents[2]
WHATIF_DIR = REPO.parent / "shared" / "realdata" / "traces" / "bytedance_straggler_whatif"
needs_whatif = pytest.mark.skipif(not WHATIF_DIR.is_dir(), reason=f"ByteDance what-if traces not found at {WHATIF_DIR}")
T0 = datetime(2025, 3, 1, tzinfo=timezone.utc)


def steps_frame(n_ranks=8, n_steps=6, *, compute=None, comm=None, idle=None, overlap=0.0, step_s=None):
    """A job whose ranks all span the same step time (they sync every step). compute/comm/idle: dict
    rank -> seconds (default 1.0 / 0.2 / 0.05)."""
    rows = []
    for st in range(n_steps):
        for r in range(n_ranks):
            c = (compute or {}).get(r, 1.0)
            m = (comm or {}).get(r, 0.2)
            i = (idle or {}).get(r, 0.05)
            span = step_s if step_s is not None else c + m + i
            start = T0 + timedelta(seconds=10 * st)
            rows.append({"job_id": "j", "rank": r, "step": st, "start": start, "end": start + timedelta(seconds=span),
                         "compute_s": c, "comm_s": m, "comm_overlap_s": overlap, "idle_s": i})
    return pl.DataFrame(rows).with_columns(pl.col("start").cast(UTC_US), pl.col("end").cast(UTC_US))


# --- detection and attribution ---------------------------------------------------------------------


def test_compute_slow_rank_with_collective_wait_removed():
    # rank 5 computes for 2 s, the others 1 s and then wait 1 s inside the all-reduce for it
    n, steps = 8, 6
    rows, coll = [], []
    for st in range(steps):
        start = T0 + timedelta(seconds=10 * st)
        for r in range(n):
            c = 2.0 if r == 5 else 1.0
            wait = 2.0 - c
            rows.append({"job_id": "j", "rank": r, "step": st, "start": start, "end": start + timedelta(seconds=2.2),
                         "compute_s": c, "comm_s": 0.2 + wait, "comm_overlap_s": 0.0, "idle_s": 0.0})
            coll.append({"job_id": "j", "rank": r, "comm_id": "dp", "seq": st, "op": "all_reduce",
                         "start": start + timedelta(seconds=c), "duration_s": 0.2 + wait})
    st_df = pl.DataFrame(rows).with_columns(pl.col("start").cast(UTC_US), pl.col("end").cast(UTC_US))
    cl = pl.DataFrame(coll).with_columns(pl.col("start").cast(UTC_US))
    det = s.detect_stragglers(st_df, cl)
    flagged = det.filter("flagged")
    assert flagged["rank"].unique().to_list() == [5]
    assert flagged["attribution"].unique().to_list() == ["compute_slow"]
    r5 = det.filter(pl.col("rank") == 5).row(0, named=True)
    # C³ parts sit on a 2^-32 s grid (analyzers.c3), hence the absolute tolerance
    assert r5["busy_s"] == pytest.approx(2.2, abs=1e-9) and r5["wait_s"] == pytest.approx(0.0, abs=1e-9)
    assert r5["relative_score"] == pytest.approx(1.2 / 2.2)
    # its excess (1 s) holds up all 8 ranks every step
    assert r5["gpu_s_lost"] == pytest.approx(8 * 1.0)
    # without the collectives the waiting ranks' exposed comm is not known to be waiting: they look busy
    # for 2.2 s too, and nobody stands out
    assert s.detect_stragglers(st_df).filter("flagged").height == 0


def test_communication_slow_attribution():
    det = s.detect_stragglers(steps_frame(comm={3: 1.5}))
    f = det.filter("flagged")
    assert f["rank"].unique().to_list() == [3]
    assert f["attribution"].unique().to_list() == ["communication_slow"]


def test_host_bound_attribution():
    det = s.detect_stragglers(steps_frame(idle={6: 1.0}))
    f = det.filter("flagged")
    assert f["rank"].unique().to_list() == [6]
    assert f["attribution"].unique().to_list() == ["host_bound"]


def test_a_comm_outlier_hidden_in_busy_time_noise_is_flagged_by_its_c2_part():
    # a compute-heavy step (1.6 s ± 2 %) whose transfers (0.13 s) barely vary; a third of the ranks (one node
    # of the three profiled) move their data 2.5x slower: 0.2 s more busy time, 11 %, under the relative
    # threshold, and with a third of the ranks slow the busy-time MAD is the compute noise's
    n = 24
    compute = {r: 1.6 * (1 + 0.02 * ((r * 7) % 5 - 2) / 2) for r in range(n)}
    comm = {r: (0.33 if 8 <= r < 16 else 0.13) + 0.0005 * (r % 3) for r in range(n)}
    det = s.detect_stragglers(steps_frame(n_ranks=n, compute=compute, comm=comm))
    slow = det.filter(pl.col("rank").is_between(8, 15))
    assert slow["relative_score"].min() > 0.85 and slow["robust_z"].max() < 3.5  # the busy-time rules alone miss them
    f = det.filter("flagged")
    assert sorted(f["rank"].unique()) == list(range(8, 16)) and f["attribution"].unique().to_list() == ["communication_slow"]
    assert det.filter("persistent")["rank"].n_unique() == 8
    # a part outlier that costs under 5 % of the busy time is not material: not flagged
    comm = {r: (0.19 if 8 <= r < 16 else 0.13) + 0.0005 * (r % 3) for r in range(n)}
    assert s.detect_stragglers(steps_frame(n_ranks=n, compute=compute, comm=comm)).filter("flagged").height == 0


def test_robust_z_flags_a_clear_outlier_above_relative_threshold():
    # 10 % slower: relative score 0.91 (> 0.75), but far outside a tight cluster
    compute = {r: 1.0 + 0.001 * r for r in range(16)}
    compute[9] = 1.125
    det = s.detect_stragglers(steps_frame(n_ranks=16, compute=compute))
    row = det.filter((pl.col("rank") == 9) & (pl.col("step") == 0)).row(0, named=True)
    assert 0.75 < row["relative_score"] < 0.95 and row["robust_z"] > 3.5 and row["flagged"]
    # a 1 % outlier is significant but not material: not flagged
    compute[9] = 1.0125 + 0.01
    det = s.detect_stragglers(steps_frame(n_ranks=16, compute=compute))
    assert not det.filter(pl.col("rank") == 9)["flagged"].any()


def test_persistence_k_of_m():
    st = steps_frame(n_steps=8)
    slow_steps = {2, 5, 6, 7}
    st = st.with_columns(
        pl.when((pl.col("rank") == 1) & pl.col("step").is_in(list(slow_steps))).then(3.0).otherwise(pl.col("compute_s")).alias("compute_s"))
    st = st.with_columns((pl.col("start") + pl.duration(microseconds=((pl.col("compute_s") + 0.25) * 1e6).cast(pl.Int64))).alias("end"))
    det = s.detect_stragglers(st, persist_k=3, persist_m=5).filter(pl.col("rank") == 1).sort("step")
    assert det["flagged"].to_list() == [st_ in slow_steps for st_ in range(8)]
    # flagged in ≥ 3 of the last 5 steps only from step 6 on (steps 2, 5, 6)
    assert det["persistent"].to_list() == [False] * 6 + [True, True]


def test_findings_are_canonical_and_costed():
    det = s.detect_stragglers(steps_frame(compute={2: 4.0}))
    f = s.straggler_findings(det)
    assert f.columns == list(FINDING.names) and f.schema == pl.Schema(FINDING.schema)
    row = f.row(0, named=True)
    assert row["subject"] == "job:j/rank:2" and row["kind"] == "straggler_compute_slow"
    assert row["severity"] == "critical"  # 1.25 s / 4.25 s: under half the median pace
    ev = json.loads(row["evidence"])
    # 3 s excess × 8 ranks × 6 steps
    assert ev["gpu_hours_lost"] == pytest.approx(3.0 * 8 * 6 / 3600)
    assert row["summary"].count(". ") == 0 and row["summary"].endswith(".")
    assert s.straggler_findings(s.detect_stragglers(steps_frame())).height == 0


def test_findings_priced_in_energy_and_emissions():
    f = s.straggler_findings(s.detect_stragglers(steps_frame(compute={2: 4.0})))
    hours = 3.0 * 8 * 6 / 3600  # as above: 0.04 GPU-hours
    price = s.EnergyPrice(power_w=700.0, power_basis="measured", g_per_kwh=400.0, intensity_basis="annual", pue=1.1, pue_basis="declared")
    ev = json.loads(s.price_findings(f, price)["evidence"][0])
    # 0.04 GPU-h × 0.7 kW = 0.028 kWh of GPU energy; × PUE 1.1 = 0.0308 kWh at the facility; × 400 g/kWh
    assert ev["energy_kwh_lost"] == pytest.approx(hours * 0.7) == pytest.approx(0.028)
    assert ev["facility_kwh_lost"] == pytest.approx(0.0308)
    assert ev["kgco2e_lost"] == pytest.approx(0.0308 * 0.4)
    assert ev["cost_basis"]["pue"] == 1.1 and ev["gpu_hours_lost"] == pytest.approx(hours)
    summary = s.price_findings(f, price)["summary"][0]
    assert summary.endswith("(≈0.0308 kWh at the facility and 0.0123 kgCO2e).") and summary.count(". ") == 0
    # without a PUE, IT energy is priced and said to be GPU energy; without an intensity, no kgCO2e
    bare = s.price_findings(f, s.EnergyPrice(power_w=700.0, power_basis="measured"))
    ev = json.loads(bare["evidence"][0])
    assert ev["facility_kwh_lost"] is None and ev["kgco2e_lost"] is None
    assert bare["summary"][0].endswith("(≈0.028 kWh of GPU energy).")
    # findings without a GPU-hour cost pass through untouched
    other = f.with_columns(pl.lit('{"x": 1}').alias("evidence"))
    assert s.price_findings(other, price).equals(other)
    assert s.price_findings(f.clear(), price).height == 0


@pytest.mark.parametrize(("kw", "field"), [({"power_w": -1.0}, "power_w"), ({"power_w": float("nan")}, "power_w"),
                                           ({"power_w": 500.0, "pue": 0.9}, "pue"),
                                           ({"power_w": 500.0, "g_per_kwh": float("inf")}, "g_per_kwh")])
def test_energy_price_rejects_impossible_values(kw, field):
    with pytest.raises(ValueError, match=field):
        s.EnergyPrice(power_basis="x", **kw)


# --- what-if on hand-built pipelines --------------------------------------------------------------


def pipeline_ops(dp=2, pp=2, mbs=2, steps=3, slow=None, stage_factor=None):
    """Ops of a DP×PP job with a 1F1B-like order; slow: {(dp, stage): factor} on compute;
    stage_factor: {stage: factor}."""
    rows = []
    for st in range(steps):
        for d in range(dp):
            for p in range(pp):
                f = (slow or {}).get((d, p), 1.0) * (stage_factor or {}).get(p, 1.0)
                t = 0.0

                def op(optype, seq, dur, mb=-1):
                    nonlocal t
                    rows.append({"dp_rank": d, "stage": p, "rank": d * pp + p, "step": st, "optype": optype,
                                 "start_s": t, "duration_s": dur, "seq_id": seq, "mc": 0, "mb_id": mb, "gmc": p})
                    t += dur

                op("params-all-gather", 0, 0.05)
                for m in range(mbs):
                    op("forward-compute", m, 1.0 * f, m)
                    op("forward-send", m, 0.01)
                for m in range(mbs):
                    op("backward-compute", m, 2.0 * f, m)
                op("grads-reduce-scatter", 0, 0.1)
                op("optimizer-clip-main-grad", 0, 0.02)
                op("optimizer", 0, 0.05)
    return pl.DataFrame(rows)


def test_whatif_balanced_job_has_no_slowdown():
    r = s.whatif(pipeline_ops())
    assert r.slowdown == pytest.approx(1.0)
    assert r.verdict == "no_slowdown"


def test_whatif_names_a_slow_worker():
    r = s.whatif(pipeline_ops(dp=4, slow={(1, 0): 2.0}))
    assert r.slowdown > 1.3
    assert r.verdict == "slow_worker" and r.culprits == ["dp1/stage0/rank2"]
    assert r.m_w > 0.9


def test_whatif_names_a_slow_stage():
    r = s.whatif(pipeline_ops(dp=4, pp=4, mbs=4, stage_factor={3: 1.8}))
    assert r.verdict == "slow_stage" and r.culprits == ["stage3"]
    assert r.m_w < 0.5 and r.m_s > 0.8


# --- what-if on ByteDance's real traces (OSDI'25 artifact) -------------------------------------------


@pytest.fixture(scope="module")
def real_results():
    if not WHATIF_DIR.is_dir():
        pytest.skip(f"ByteDance what-if traces not found at {WHATIF_DIR}")
    out = {}
    for name in ("AR", "ST", "SE"):
        tr = bw.parse((WHATIF_DIR / f"trace-{name}.parquet").read_bytes(),
                      meta=(WHATIF_DIR / f"meta-{name}.yaml").read_bytes(), source=name)
        out[name] = (tr, s.whatif(tr.ops, tr.meta))
    return out


# The artifact's published results at commit 8efcd7f (github.com/ByteDance-Seed/StragglerAnalysis):
# S = "blocking_slowdown" of data/result-<trace>.json, M_W = "Mw" of data/mw-<trace>.json, M_S = "Ms" of
# data/ms-<trace>.json, and the ideal step time "tideal" of those files. The metas hold only the sizes,
# so the figures are written out here. AR: one slow worker (dp 0, stage 0); ST: a slow last stage (fixing
# it removes more than the whole gap, M_S > 1); SE: the slowdown spread across workers.
PUBLISHED = {
    "AR": {"slowdown": 1.9730450967262543, "m_w": 1.0017012777290497, "m_s": -0.00121196404622606, "ideal_step_s": 23.484700209738318},
    "ST": {"slowdown": 1.1787021836556841, "m_w": 0.031404269124045224, "m_s": 1.2193563788811714, "ideal_step_s": 1.843295824372035},
    "SE": {"slowdown": 1.5373613711484118, "m_w": 0.025062266911209777, "m_s": 0.6877108929755429, "ideal_step_s": 5.897478331588793},
}


@needs_whatif
@pytest.mark.parametrize("name", ["AR", "ST", "SE"])
def test_real_traces_match_the_published_artifact(real_results, name):
    """Issue 21's bar: S within 2 % of the artifact's, M_W and M_S within 0.02."""
    _, r = real_results[name]
    pub = PUBLISHED[name]
    assert abs(r.slowdown / pub["slowdown"] - 1) < 0.02, (r.slowdown, pub["slowdown"])
    assert abs(r.m_w - pub["m_w"]) < 0.02, (r.m_w, pub["m_w"])
    assert abs(r.m_s - pub["m_s"]) < 0.02, (r.m_s, pub["m_s"])
    # the ideal timeline is the artifact's: every op type at its mean (compute) or median (communication)
    assert abs(r.ideal_step_s / pub["ideal_step_s"] - 1) < 0.02, (r.ideal_step_s, pub["ideal_step_s"])


@needs_whatif
def test_real_median_everywhere_departs_from_the_artifact(real_results):
    """The median for every op type (not the artifact's definition) misses ST's published S by > 10 %."""
    tr, _ = real_results["ST"]
    r = s.whatif(tr.ops, tr.meta, typical="median")
    assert r.slowdown / PUBLISHED["ST"]["slowdown"] - 1 > 0.10


@needs_whatif
def test_real_AR_names_the_slow_worker(real_results):
    tr, r = real_results["AR"]
    assert tr.meta["world_size"] == 64 and tr.ops.height == 117216
    assert r.verdict == "slow_worker" and r.culprits == ["dp0/stage0/rank0"]
    assert r.steps_analysed == 44 and r.steps_dropped == 0  # the artifact's result-AR.json lists 44 steps
    assert abs(r.simulated_step_s - r.measured_step_s) / r.measured_step_s < 0.02  # replay reproduces the run
    f = s.whatif_findings(r, job_id="AR", window_start=T0)
    assert f["kind"][0] == "whatif_slow_worker" and "dp0/stage0/rank0" in f["summary"][0]


@needs_whatif
def test_real_ST_names_the_slow_last_stage(real_results):
    tr, r = real_results["ST"]
    last = int(tr.ops["stage"].max())
    assert r.verdict == "slow_stage" and r.culprits == [f"stage{last}"]
    assert r.steps_analysed == 32  # result-ST.json lists 32 steps
    f = s.whatif_findings(r, job_id="ST", window_start=T0)
    assert f["kind"][0] == "whatif_slow_stage" and f"stage {last}" in f["summary"][0]


@needs_whatif
def test_real_SE_slowdown_is_spread_across_workers(real_results):
    _, r = real_results["SE"]
    assert r.verdict == "spread" and r.culprits == []
    assert r.steps_analysed == 43  # result-SE.json lists 43 steps
    f = s.whatif_findings(r, job_id="SE", window_start=T0, window_end=T0 + timedelta(hours=1))
    assert f.columns == list(FINDING.names)
    assert "spread across workers" in f["summary"][0]
    ev = json.loads(f["evidence"][0])
    assert ev["gpu_hours_lost"] == pytest.approx(r.gpu_hours_lost) and ev["world_size"] == 128


# --- bad input --------------------------------------------------------------------------------------


def test_detection_bad_input():
    with pytest.raises(ValueError, match="empty"):
        s.detect_stragglers(steps_frame().clear())
    with pytest.raises(ValueError, match="lacks column"):
        s.detect_stragglers(steps_frame().drop("idle_s"))
    nan = steps_frame().with_columns(pl.when(pl.col("rank") == 2).then(math.nan).otherwise(pl.col("compute_s")).alias("compute_s"))
    with pytest.raises(ValueError, match="compute_s must be a finite number"):
        s.detect_stragglers(nan)
    with pytest.raises(ValueError, match="persist_k"):
        s.detect_stragglers(steps_frame(), persist_k=6, persist_m=5)
    with pytest.raises(ValueError, match="detect_stragglers"):
        s.straggler_findings(steps_frame())


def test_whatif_bad_input():
    ops = pipeline_ops()
    with pytest.raises(ValueError, match="lacks column"):
        s.whatif(ops.drop("gmc"))
    with pytest.raises(ValueError, match="empty"):
        s.whatif(ops.clear())
    with pytest.raises(ValueError, match="finite"):
        s.whatif(ops.with_columns(pl.lit(math.nan).alias("duration_s")))
    with pytest.raises(ValueError, match="typical must be 'artifact'"):
        s.whatif(ops, typical="mode")
    # a step missing an operation cannot share the graph: it is dropped and counted
    short = ops.filter(~((pl.col("step") == 2) & (pl.col("optype") == "optimizer") & (pl.col("rank") == 0)))
    assert s.whatif(short).steps_dropped == 1


def test_loader_bad_input():
    with pytest.raises(ParseError, match="not a readable Parquet"):
        bw.parse(b"not parquet at all", source="x.parquet")
    buf = io.BytesIO()
    pipeline_ops().drop("seq_id").write_parquet(buf)
    with pytest.raises(ParseError, match="missing column"):
        bw.parse(buf.getvalue(), source="x.parquet")
    buf = io.BytesIO()
    pipeline_ops().with_columns(pl.lit(-1.0).alias("duration_s")).write_parquet(buf)
    with pytest.raises(ParseError, match="negative duration"):
        bw.parse(buf.getvalue())
    buf = io.BytesIO()
    pipeline_ops().with_columns(pl.lit(math.nan).alias("start_s")).write_parquet(buf)
    with pytest.raises(ParseError, match="non-finite"):
        bw.parse(buf.getvalue())
    with pytest.raises(ParseError, match="non-negative integer"):
        bw.parse_meta(b"dp_size: four\n", source="meta.yaml")
    with pytest.raises(TypeError):
        bw.parse("a string")
    assert bw.parse_meta(b"trial_name: AR\ndp_size: 4\n# comment\n") == {"trial_name": "AR", "dp_size": 4}
