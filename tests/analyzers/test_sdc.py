"""analyzers.sdc: replica checksum vote (majority and ties), spikes, NaN onset, the rerun protocol, the
known-answer probe and the evidence chain; events go through the real job-event parser."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl
import pytest

from analyzers import sdc, sdc_probe
from fleetscope.devices import probe
from fleetscope.core.errors import ParseError, ValidationError
from fleetscope.core.frames import FINDING
from ingest import job_events

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def events(lines: list[dict]) -> pl.DataFrame:
    """Job events through the real parser, as the store would hold them."""
    body = "\n".join(json.dumps({"job_id": "j1", **ln}) for ln in lines).encode()
    return job_events.parse(body, source="test.jsonl").job_event


def step(rank: int, n: int, **payload) -> dict:
    return {"ts": (T0 + timedelta(seconds=10 * n)).isoformat(), "kind": "step", "rank": rank, "step": n, **payload}


def quiet_run(ranks: int = 4, steps: int = 60, overrides: dict | None = None) -> list[dict]:
    """A healthy run: losses vary a little, identical checksums every 10 steps. ``overrides[(rank, step)]``
    replaces that event's payload fields."""
    out = []
    for n in range(1, steps + 1):
        for r in range(ranks):
            p = {"loss": 2.0 + 0.01 * ((7 * n + r) % 5), "grad_norm": 1.0 + 0.01 * ((3 * n + r) % 7)}
            if n % 10 == 0:
                p["param_checksum"] = f"sha:{n}"
            p.update((overrides or {}).get((r, n), {}))
            out.append(step(r, n, **p))
    return out


# --- checksums -------------------------------------------------------------------------------------


def test_majority_decides_and_the_odd_rank_is_the_suspect():
    sig = sdc.step_signals(events(quiet_run(overrides={(2, 40): {"param_checksum": "sha:bad"}})))
    cm = sdc.checksum_mismatches(sig)
    assert cm.height == 1
    r = cm.row(0, named=True)
    assert (r["rank"], r["step"], r["verdict"], r["majority_checksum"]) == (2, 40, "suspect", "sha:40")
    assert r["strict_majority"] and (r["agreeing"], r["group_size"]) == (3, 4)


def test_a_tie_blames_nobody():
    # two replicas that disagree: the data cannot say which one is wrong
    sig = sdc.step_signals(events(quiet_run(ranks=2, overrides={(1, 20): {"param_checksum": "sha:other"}})))
    cm = sdc.checksum_mismatches(sig)
    assert cm["verdict"].to_list() == ["tie", "tie"] and cm["majority_checksum"].null_count() == 2
    assert sdc.sdc_findings(checksums=cm, signals=sig).height == 0


def test_plurality_without_strict_majority_is_a_weaker_suspect():
    # 4 ranks: a, a, b, c → a wins by plurality (2 of 4, not more than half)
    ov = {(2, 30): {"param_checksum": "b"}, (3, 30): {"param_checksum": "c"}}
    cm = sdc.checksum_mismatches(sdc.step_signals(events(quiet_run(overrides=ov))))
    assert sorted(cm["rank"].to_list()) == [2, 3] and not cm["strict_majority"].any()


def test_replica_groups_separate_shards():
    # tensor-parallel pairs: ranks {0,2} hold shard A, {1,3} shard B; checksums differ across shards by design
    lines = []
    for n in (10, 20):
        for r in range(4):
            lines.append(step(r, n, loss=1.0, param_checksum=("A" if r % 2 == 0 else "B") + str(n)))
    lines[-1]["param_checksum"] = "B20-corrupt"  # rank 3 at step 20
    sig = sdc.step_signals(events(lines), replica_groups={0: "tp0", 1: "tp1", 2: "tp0", 3: "tp1"})
    cm = sdc.checksum_mismatches(sig)
    assert cm["verdict"].to_list() == ["tie", "tie"] and set(cm["rank"]) == {1, 3}  # a 2-replica group can only tie
    assert sdc.checksum_mismatches(sdc.step_signals(events(lines[:4]), replica_groups={0: "tp0", 1: "tp1", 2: "tp0", 3: "tp1"})).height == 0
    # without the grouping every rank looks like a mismatch — the grouping matters
    assert sdc.checksum_mismatches(sdc.step_signals(events(lines[:4]))).height == 4


def test_integer_checksums_are_compared_as_values():
    lines = [step(r, 10, loss=1.0, param_checksum=123456789012) for r in range(3)]
    lines[1]["param_checksum"] = 123456789013
    cm = sdc.checksum_mismatches(sdc.step_signals(events(lines)))
    assert cm.row(0, named=True)["param_checksum"] == "123456789013" and cm["rank"][0] == 1


# --- spikes and NaN ---------------------------------------------------------------------------------------


def test_single_rank_loss_spike_is_found_and_flat_noise_is_not():
    sig = sdc.step_signals(events(quiet_run(overrides={(1, 50): {"loss": 9.0}})))
    sp = sdc.metric_spikes(sig, "loss")
    assert sp.select("rank", "step", "single_rank").rows() == [(1, 50, True)]
    assert sp["score"][0] > 100 and sp["baseline"][0] == pytest.approx(2.02, abs=0.03)


def test_job_wide_spike_is_not_single_rank():
    ov = {(r, 45): {"grad_norm": 50.0} for r in range(4)}
    sp = sdc.metric_spikes(sdc.step_signals(events(quiet_run(overrides=ov))), "grad_norm")
    assert sp.height == 4 and not sp["single_rank"].any() and (sp["ranks_spiking"] == 4).all()


def test_spike_needs_history_and_a_valid_window():
    sig = sdc.step_signals(events(quiet_run(steps=8, overrides={(0, 8): {"loss": 50.0}})))
    assert sdc.metric_spikes(sig, "loss", min_history=10).height == 0  # 7 earlier steps are too few
    with pytest.raises(ValueError):
        sdc.metric_spikes(sig, "loss", window_steps=5, min_history=10)
    with pytest.raises(ValueError):
        sdc.metric_spikes(sig, "throughput")


def test_nan_onset_on_one_rank_from_a_null_loss_with_a_cause():
    ov = {(3, 55): {"loss": None, "cause": "loss is nan"}}
    ov.update({(r, 56): {"loss": None} for r in range(4)})  # it spreads through the all-reduce a step later
    nf = sdc.nonfinite_onset(sdc.step_signals(events(quiet_run(overrides=ov))))
    r = nf.row(0, named=True)
    assert (r["step"], r["ranks_nonfinite"], r["pattern"]) == (55, [3], "single_rank")


def test_nan_tokens_from_a_lenient_writer_count_as_nonfinite():
    ev = pl.DataFrame({"job_id": ["j"] * 3, "ts": [T0] * 3, "kind": ["step"] * 3, "rank": [0, 1, 2], "step": [7] * 3,
                       "payload": ['{"loss": NaN}', '{"loss": 1.5, "grad_norm": Infinity}', '{"loss": 1.25}']},
                      schema_overrides={"ts": pl.Datetime("us", "UTC")})
    sig = sdc.step_signals(ev)
    assert sig["loss_nonfinite"].to_list() == [True, False, False] and sig["grad_norm_nonfinite"].to_list() == [False, True, False]
    assert sig["loss"].to_list() == [None, 1.5, 1.25]
    assert sdc.nonfinite_onset(sig)["pattern"][0] == "some_ranks"


def test_divergence_on_all_ranks_is_not_blamed_on_a_gpu():
    ov = {(r, 30): {"loss": None} for r in range(4)}
    nf = sdc.nonfinite_onset(sdc.step_signals(events(quiet_run(overrides=ov))))
    assert nf["pattern"][0] == "all_ranks"
    assert sdc.sdc_findings(nonfinite=nf).height == 0


# --- rerun protocol ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("same", "other", "expected", "verdict"),
    [
        (["good"], [], "good", "transient"),       # replay on the same GPU differs: did not reproduce
        (["bad"], ["good"], "good", "persistent"),  # reproduces there, other GPU gets the right answer
        (["bad"], ["bad"], None, "not_gpu"),        # reproduces everywhere: software or data
        (["bad"], [], None, "inconclusive"),        # needs a replay elsewhere
        ([], ["good"], None, "inconclusive"),       # needs a replay on the same GPU
        (["bad"], ["x", "y"], None, "inconclusive"),  # the other GPUs disagree
        ([], [], None, "inconclusive"),
    ],
)
def test_rerun_verdict(same, other, expected, verdict):
    assert sdc.rerun_verdict("bad", same, other, expected)[0] == verdict


def test_rerun_verdict_no_fault_when_the_original_was_right():
    assert sdc.rerun_verdict("good", ["good"], ["good"], "good")[0] == "no_fault"


def test_rerun_verdicts_over_recorded_runs_and_bad_records():
    rr = pl.DataFrame({
        "case_id": ["c1", "c1", "c1", "c2", "c2"], "suspect_gpu": ["G2"] * 3 + ["G5"] * 2,
        "gpu_uuid": ["G2", "G2", "G9", "G5", "G5"], "attempt": [0, 1, 2, 0, 1], "result": ["bad", "bad", "ok", "bad", "ok"],
        "job_id": ["j1"] * 5, "step": [40, 40, 40, 70, 70],
    })
    v = {r["case_id"]: r for r in sdc.rerun_verdicts(rr).to_dicts()}
    assert v["c1"]["verdict"] == "persistent" and v["c1"]["other_gpus"] == ["G9"] and v["c1"]["step"] == 40
    assert v["c2"]["verdict"] == "transient"
    with pytest.raises(ValidationError, match="exactly one original"):
        sdc.rerun_verdicts(rr.filter(pl.col("attempt") > 0))
    with pytest.raises(ValidationError, match="not on the suspect GPU"):
        sdc.rerun_verdicts(rr.with_columns(pl.when(pl.col("attempt") == 0).then(pl.lit("G7")).otherwise("gpu_uuid").alias("gpu_uuid")))
    with pytest.raises(ValidationError, match="result"):
        sdc.rerun_verdicts(rr.drop("result"))


# --- known-answer probe ---------------------------------------------------------------------------------------


def test_probe_matches_the_golden_hash_on_cpu():
    res = probe.run_probe("numpy")
    assert res.passed is True and res.digest == sdc_probe.PROBE_GOLDEN_SHA256[(sdc_probe.PROBE_N, sdc_probe.PROBE_ROUNDS, sdc_probe.PROBE_SEED)]


def test_golden_hash_is_the_exact_integer_answer_in_every_precision():
    """The golden digest was computed with exact int64 arithmetic (no BLAS); float64 and float32 BLAS must
    give bit-identical results because every partial sum is an integer below 2**24."""
    exact = sdc_probe.probe_matmul(dtype=np.int64)
    assert np.abs(exact).max() <= 8
    golden = sdc_probe.PROBE_GOLDEN_SHA256[(sdc_probe.PROBE_N, sdc_probe.PROBE_ROUNDS, sdc_probe.PROBE_SEED)]
    assert sdc_probe.probe_digest(exact) == golden
    assert sdc_probe.probe_digest(sdc_probe.probe_matmul(dtype=np.float32)) == golden
    # a small case against pure-Python integers, independent of numpy's matmul
    a, b = sdc_probe.probe_inputs(12, seed=1)
    x = a.tolist()
    for _ in range(2):
        x = [[(sum(x[i][k] * int(b[k][j]) for k in range(12)) % 17) - 8 for j in range(12)] for i in range(12)]
    assert sdc_probe.probe_matmul(12, 2, 1).tolist() == x


def test_one_flipped_element_fails_the_probe():
    res = sdc_probe.probe_matmul()
    res[123, 45] += 1  # any single element
    assert sdc_probe.check_probe(sdc_probe.probe_digest(res)) is False
    assert sdc_probe.check_probe(sdc_probe.probe_digest(res), n=64) is None  # no golden for an unblessed size: not a pass
    # the digest covers the shape: a truncated result cannot pass
    assert sdc_probe.probe_digest(sdc_probe.probe_matmul()[:-1]) != sdc_probe.PROBE_GOLDEN_SHA256[(sdc_probe.PROBE_N, sdc_probe.PROBE_ROUNDS, sdc_probe.PROBE_SEED)]


def _absent(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def test_probe_backends_report_clearly_when_unavailable():
    with pytest.raises(ValueError, match="unknown probe backend 'opencl'"):
        probe.run_probe("opencl")
    if not (_absent("torch") and _absent("cupy")):
        pytest.skip("a CUDA library is installed here: its absence cannot be tested")
    with pytest.raises(probe.ProbeUnavailable, match="probe backend torch: torch is not installed"):
        probe.run_probe("torch")
    with pytest.raises(probe.ProbeUnavailable, match="probe backend cupy: cupy is not installed"):
        probe.run_probe("cupy")
    with pytest.raises(probe.ProbeUnavailable, match="no CUDA probe backend can run here: .*torch is not installed.*cupy is not installed"):
        probe.run_probe("cuda")
    assert issubclass(probe.ProbeUnavailable, RuntimeError)


def _module(name: str, **attrs):
    import types

    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


def _fake_torch(cuda_version, available=False, count=0):
    """Stands in for a torch that is installed on a host where CUDA cannot run (no such torch here to test with)."""
    import types

    cuda = types.SimpleNamespace(is_available=lambda: available, device_count=lambda: count)
    return _module("torch", version=types.SimpleNamespace(cuda=cuda_version), cuda=cuda)


def _fake_cupy(count=None, error=None):
    import types

    def get_count():
        if error:
            raise error
        return count

    runtime = types.SimpleNamespace(getDeviceCount=get_count, getDeviceProperties=lambda i: {"name": b"NVIDIA H200"})
    return _module("cupy", cuda=types.SimpleNamespace(runtime=runtime))


@pytest.mark.parametrize(
    ("module", "fake", "index", "message"),
    [
        ("torch", _fake_torch(None), 0, r"CPU-only build \(torch.version.cuda is None\)"),
        ("torch", _fake_torch("12.4", available=False), 0, "torch sees no CUDA device .*no NVIDIA driver"),
        ("torch", _fake_torch("12.4", available=True, count=1), 3, r"no CUDA device 3 \(torch sees 1\)"),
        ("cupy", _fake_cupy(error=RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")), 0,
         "CUDA runtime is not usable: cudaErrorInsufficientDriver"),
        ("cupy", _fake_cupy(count=1), 3, r"no CUDA device 3 \(cupy sees 1\)"),
    ],
)
def test_probe_names_what_is_missing_when_the_library_is_there_but_cuda_is_not(monkeypatch, module, fake, index, message):
    monkeypatch.setitem(sys.modules, module, fake)
    with pytest.raises(probe.ProbeUnavailable, match=message):
        probe.run_probe(module, device_index=index)


# --- findings ------------------------------------------------------------------------------------------------


def test_evidence_chain_joins_signals_of_one_suspect():
    ov = {(2, 40): {"param_checksum": "sha:bad"}, (2, 41): {"loss": 30.0}, (1, 55): {"loss": None}}
    sig = sdc.step_signals(events(quiet_run(overrides=ov)))
    rr = pl.DataFrame({"case_id": ["c"] * 3, "suspect_gpu": ["GPU-2"] * 3, "gpu_uuid": ["GPU-2", "GPU-2", "GPU-7"],
                       "attempt": [0, 1, 2], "result": ["sha:bad", "sha:bad", "sha:40"]})
    jr = pl.DataFrame({"job_id": ["j1"] * 4, "rank": [0, 1, 2, 3], "gpu_uuid": [f"GPU-{i}" for i in range(4)]})
    probes = pl.DataFrame({"gpu_uuid": ["GPU-3"], "ts": [T0], "passed": [False], "digest": ["00ff"]},
                          schema_overrides={"ts": pl.Datetime("us", "UTC")})
    f = sdc.sdc_findings(checksums=sdc.checksum_mismatches(sig), spikes=sdc.metric_spikes(sig, "loss"),
                         nonfinite=sdc.nonfinite_onset(sig), reruns=sdc.rerun_verdicts(rr), probes=probes,
                         job_rank=jr, signals=sig)
    assert f.columns == list(FINDING.names)
    by = {r["subject"]: r for r in f.to_dicts()}
    assert set(by) == {"gpu:GPU-2", "gpu:GPU-1", "gpu:GPU-3"}
    g2 = by["gpu:GPU-2"]
    assert g2["severity"] == "critical" and g2["kind"] == "sdc_confirmed"
    chain = json.loads(g2["evidence"])
    assert [s["signal"] for s in chain["signals"]] == ["checksum_mismatch", "loss_spike", "rerun_persistent"]
    assert chain["signals"][0]["majority_checksum"] == "sha:40" and chain["job_rank"] == ["j1", 2]
    assert "steps 40–41" in g2["summary"]
    assert by["gpu:GPU-1"]["severity"] == "warning" and "nonfinite_onset" in by["gpu:GPU-1"]["summary"]
    assert by["gpu:GPU-3"]["kind"] == "sdc_confirmed"
    assert g2["window_start"] == T0 + timedelta(seconds=400)


def test_bad_input():
    with pytest.raises(ValidationError, match="payload"):
        sdc.step_signals(pl.DataFrame({"job_id": ["j"], "ts": [T0], "kind": ["step"], "rank": [0], "step": [1]}))
    with pytest.raises(TypeError):
        sdc.checksum_mismatches([])  # type: ignore[arg-type]
    empty = sdc.step_signals(events([{"ts": T0.isoformat(), "kind": "started"}]))
    assert empty.height == 0 and sdc.checksum_mismatches(empty).height == 0 and sdc.nonfinite_onset(empty).height == 0
    assert sdc.sdc_findings().height == 0


# --- the rerun protocol, recorded as job events ---------------------------------------------------------------

LATER = T0 + timedelta(days=2)  # replays run during the investigation, long after the step


def rerun(step_n: int, rank: int, gpu: str, result, minutes: float, suspect: str = "GPU-2", **extra) -> dict:
    return {"ts": (LATER + timedelta(minutes=minutes)).isoformat(), "kind": "sdc_rerun", "step": step_n, "rank": rank,
            "suspect_gpu": suspect, "gpu_uuid": gpu, "result": result, **extra}


def test_rerun_records_judged_against_the_step_checksum_and_the_replica_majority():
    lines = quiet_run(overrides={(2, 40): {"param_checksum": "sha:bad"}, (3, 20): {"param_checksum": "sha:flip"}})
    lines += [rerun(40, 2, "GPU-2", "sha:bad", 0), rerun(40, 2, "GPU-7", "sha:40", 5),  # reproduces; other GPU is right
              rerun(20, 3, "GPU-3", "sha:20", 10, suspect="GPU-3")]                       # same-GPU replay is right
    s = sdc.screen(events(lines))
    v = {r["case_id"]: r for r in s["verdicts"].to_dicts()}
    assert v["j1/step:40/rank:2"]["verdict"] == "persistent" and v["j1/step:20/rank:3"]["verdict"] == "transient"
    assert s["problems"].height == 0
    f = {(r["kind"], r["subject"]): r for r in s["findings"].to_dicts()}
    per_case = f[("sdc_rerun", "gpu:GPU-2")]
    ev = json.loads(per_case["evidence"])
    assert (ev["step"], ev["rank"], ev["verdict"], ev["gpus"]) == (40, 2, "persistent", ["GPU-2", "GPU-7"])
    assert [(r["attempt"], r["gpu_uuid"], r["result"], r["same_gpu"], r["source"]) for r in ev["runs"]] == [
        (0, "GPU-2", "sha:bad", True, "step event param_checksum"),
        (1, "GPU-2", "sha:bad", True, "sdc_rerun record"),
        (2, "GPU-7", "sha:40", False, "sdc_rerun record")]
    assert (ev["expected"], ev["expected_source"]) == ("sha:40", "replica majority")
    assert per_case["severity"] == "critical" and per_case["window_start"] == T0 + timedelta(seconds=400)
    assert per_case["window_end"] == LATER + timedelta(minutes=5)
    assert f[("sdc_rerun", "gpu:GPU-3")]["severity"] == "warning"
    # the rerun record names the rank's GPU, so the checksum mismatch and the verdict are one chain on gpu:GPU-2
    chain = f[("sdc_confirmed", "gpu:GPU-2")]
    assert [s_["signal"] for s_ in json.loads(chain["evidence"])["signals"]] == ["checksum_mismatch", "rerun_persistent"]
    assert ("sdc_suspect", "job:j1/rank:2") not in f


def test_rerun_original_from_an_attempt_zero_record_and_deterministic_software():
    # no checksums in the steps: the producer reports the original run's output digest itself
    lines = quiet_run(steps=12)
    lines += [rerun(7, 1, "GPU-1", "out:aa", 0, suspect="GPU-1", attempt=0), rerun(7, 1, "GPU-1", "out:aa", 1, suspect="GPU-1"),
              rerun(7, 1, "GPU-5", "out:aa", 2, suspect="GPU-1")]
    s = sdc.screen(events(lines))
    r = s["verdicts"].row(0, named=True)
    assert r["verdict"] == "not_gpu" and r["original_result"] == "out:aa"
    f = s["findings"].filter(pl.col("kind") == "sdc_rerun").row(0, named=True)
    assert f["severity"] == "info" and json.loads(f["evidence"])["expected"] is None  # a step checksum is not an output digest


def test_rerun_cases_that_cannot_be_judged_are_reported_not_guessed():
    lines = quiet_run(steps=12)
    lines += [rerun(5, 0, "GPU-0", "x", 0, suspect="GPU-0"),                                       # no original anywhere
              rerun(10, 1, "GPU-1", "a", 1, suspect="GPU-1"), rerun(10, 1, "GPU-9", "b", 2, suspect="GPU-9"),  # two suspects
              rerun(10, 2, "GPU-8", "a", 3, suspect="GPU-2", attempt=0)]                           # original elsewhere
    s = sdc.screen(events(lines))
    problems = dict(s["problems"].select("case_id", "problem").iter_rows())
    assert "original result unknown" in problems["j1/step:5/rank:0"]
    assert "2 different suspect GPUs" in problems["j1/step:10/rank:1"]
    assert "not on the suspect GPU GPU-2" in problems["j1/step:10/rank:2"]
    assert s["verdicts"].height == 0 and s["findings"].height == 0


def test_rerun_records_are_checked_at_ingest():
    base = {"job_id": "j1", "ts": LATER.isoformat(), "kind": "sdc_rerun", "step": 3, "rank": 1, "suspect_gpu": "G1",
            "gpu_uuid": "G1", "result": "r"}
    assert job_events.parse(json.dumps(base).encode()).job_event.height == 1
    for drop, field in (("step", "step"), ("rank", "rank"), ("suspect_gpu", "suspect_gpu"), ("gpu_uuid", "gpu_uuid"), ("result", "result")):
        bad = {k: v for k, v in base.items() if k != drop}
        with pytest.raises(ParseError, match=field):
            job_events.parse(json.dumps(bad).encode(), source="reruns.jsonl")
    for field, value in (("result", 1.5), ("result", ["a"]), ("attempt", -1), ("attempt", "0"), ("expected", True), ("gpu_uuid", "")):
        with pytest.raises(ParseError, match=field):
            job_events.parse(json.dumps({**base, field: value}).encode(), source="reruns.jsonl")


def test_rerun_records_do_not_stretch_the_job_lifecycle():
    from analyzers import goodput, reliability

    lines = [{"ts": T0.isoformat(), "kind": "started"}, *quiet_run(steps=12), {"ts": (T0 + timedelta(seconds=130)).isoformat(), "kind": "finished"}]
    ev = events(lines)
    with_rr = events(lines + [rerun(10, 1, "GPU-1", "sha:10", 0, suspect="GPU-1")])
    assert goodput.runtime_goodput(with_rr).total_s == goodput.runtime_goodput(ev).total_s == pytest.approx(130.0)
    assert reliability.fleet_mtbf(with_rr)["wall_hours"][0] == pytest.approx(130 / 3600)
