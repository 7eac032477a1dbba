"""Every shipped rule fires, is delivered to a real webhook receiver, and resolves.

Each scenario is a small fleet (one site, four hosts of two GPUs) whose telemetry arrives minute by minute
as an agent would send it, with one fault injected. Time moves in beat's ticks: each minute the job
analyses and the energy roll-up run, every five the health sweep, then the alerting tick evaluates the
shipped rules and delivers to a loopback receiver. Nothing is written to the series or finding tables
by the test: every alert comes from the analyzers that run in the service.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pytest
from cryptography.fernet import Fernet

from fleetscope.services import jobs as analysis
from fleetscope.services import audit as audit_service
from fleetscope.services import energy_rollup
from fleetscope.services import health as health_service
from fleetscope.services import governance as gs
from fleetscope.core import frames as F
from fleetscope.services.alerting import notifiers as N
from fleetscope.services.alerting import state as ST
from fleetscope.services.alerting.rules import load_config
from fleetscope.store import Store
from governance.registry import ModelEntry
from ingest import ibswinfo, nccl_log
from tests.alerting.receiver import Receiver
from tests.conftest import fresh_sqlite, make_settings

pytestmark = pytest.mark.slow

T = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)  # a whole five minutes: beat's health tick
MIN = dt.timedelta(minutes=1)
HOSTS = [f"n{h}" for h in range(4)]
GPUS = [(f"GPU-{h}-{g}", h) for h in HOSTS for g in range(2)]


@dataclass
class Scenario:
    """What goes wrong, as data: per-sample overrides, hosts that go silent, and extra frames by time."""

    gpu: Callable[[str, dt.datetime], dict] = lambda g, t: {}
    silent: Callable[[str, dt.datetime], bool] = lambda h, t: False
    gone: Callable[[str, dt.datetime], bool] = lambda g, t: False
    extra: Callable[[dt.datetime, dt.datetime], F.Batch | None] = lambda a, b: None
    meters: Callable[[dt.datetime], float] | None = None  # facility/IT ratio to meter, by time
    minutes: int = 90
    step_min: int = 1  # beat's minute, or coarser for rules whose lookback is a day
    act: Callable[[Store, dt.datetime, int, Path], None] | None = None  # what a person or beat does at a tick
    rules: tuple[str, ...] = ()
    muted: tuple[str, ...] = ()  # rules the same fault also trips, inhibited: one fault, one page
    notes: list[str] = field(default_factory=list)


def telemetry(s: Scenario, a: dt.datetime, b: dt.datetime) -> F.Batch:
    """The 10-second samples of [a, b) that reach the ingest door, with the scenario's fault applied."""
    rows = []
    t = a
    while t < b:
        for g, h in GPUS:
            if s.silent(h, t) or s.gone(g, t):
                continue
            secs = (t - T).total_seconds()
            rows.append({"ts": t, "gpu_uuid": g, "util_ratio": 0.95, "sm_clock_mhz": 1980.0, "clock_event_reasons": 0,
                         "power_w": 600.0, "energy_j": 1e9 + 600.0 * secs, "temp_c": 60.0, **s.gpu(g, t)})
        t += dt.timedelta(seconds=10)
    batch = F.Batch(source="agent", gpu_sample=pl.DataFrame(rows, schema_overrides={"ts": F.UTC_US, "clock_event_reasons": pl.Int64}))
    if s.meters is not None:
        ms = []
        t = a
        while t < b:
            it_w = 8 * 600.0 + 2000.0
            ms += [{"ts": t, "series": F.series_key("it_power_w", {"site": "dc1", "point": "it"}), "value": it_w},
                   {"ts": t, "series": F.series_key("facility_power_w", {"site": "dc1"}), "value": it_w * s.meters(t)}]
            t += dt.timedelta(seconds=30)
        batch.metric_sample = pl.DataFrame(ms, schema=F.METRIC_SAMPLE.schema)
    more = s.extra(a, b)
    return batch.merge(more) if more is not None else batch


def events(rows: list[tuple[dt.datetime, str, dict]], job: str = "train-1") -> pl.DataFrame:
    return pl.DataFrame([{"job_id": job, "ts": t, "kind": k, "rank": p.pop("rank", -1), "step": p.pop("step", None),
                          "payload": json.dumps(p) if p else None} for t, k, p in [(t, k, dict(p)) for t, k, p in rows]],
                        schema_overrides={"ts": F.UTC_US, "step": pl.Int64})


def between(rows: pl.DataFrame, col: str, a: dt.datetime, b: dt.datetime) -> pl.DataFrame:
    return rows.filter((pl.col(col) >= a) & (pl.col(col) < b))


# --- the faults ---------------------------------------------------------------------------------------


def idle_slurm_job(a: dt.datetime, b: dt.datetime) -> F.Batch:
    """A Slurm job (account ml, via slurmrestd) holds both GPUs of n0 from an hour and a half before the fault;
    scenario ``idle_allocation`` drops their utilisation to 0 from T to T + 50 min."""
    if not a <= T - 100 * MIN < b:
        return F.Batch()
    from fleetscope.core import scheduler_frames as SCH

    job = {"cluster": "hpc", "job_id": "4242", "scheduler": "slurm", "account": "ml", "user": "ana", "partition": "gpu", "state": "RUNNING",
           "submit_at": T - 95 * MIN, "start_at": T - 90 * MIN, "gpus": 2, "nodes": "n0", "node_count": 1}
    return F.Batch(sched_job=SCH.frame(SCH.SCHED_JOB, [job]),
                   sched_job_node=SCH.frame(SCH.SCHED_JOB_NODE, [{"cluster": "hpc", "job_id": "4242", "host": "n0", "gpus": 2}]))


def xid(code: int, at: dt.datetime, gpu: str = "GPU-n1-0") -> Callable:
    ev = pl.DataFrame({"ts": [at], "host": [gpu.split("-")[1]], "gpu_uuid": [gpu], "kind": ["xid"], "code": [code],
                       "message": [f"NVRM: Xid (PCI:0000:19:00): {code}"]}, schema_overrides={"ts": F.UTC_US})
    return lambda a, b: F.Batch(health_event=between(ev, "ts", a, b))


def watchdog_timeout(a: dt.datetime, b: dt.datetime) -> F.Batch:
    """Rank 3's NCCL log at minute 3: PyTorch's watchdog gives up on an all-reduce (ingest.nccl_log reads it)."""
    at = T + 3 * MIN
    if not a <= at < b:
        return F.Batch()
    log = (f"{(at - MIN).isoformat()} n2:4242:4242 [3] NCCL INFO comm 0x7f rank 3 nranks 8 cudaDev 3 busId 3a000 commId 0xc0ffee - Init COMPLETE\n"
           f"{at.isoformat()} [rank3]:[E1130 12:03:00.000000000 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation "
           "timeout: WorkNCCL(SeqNum=8812, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, Timeout(ms)=600000) ran for 600013 "
           "milliseconds before timing out.\n").encode()
    return F.Batch(health_event=nccl_log.parse(log, source="rank3.log", job_id="train-1").health_event)


def switch_vitals(fan: str = "OK", psu1: str = "OK") -> Callable[[dt.datetime, dt.datetime], F.Batch]:
    """An unmanaged EDR switch polled with ibswinfo every 5 minutes; its fan tray (or PSU1) fails from minute
    5 to 25."""
    def extra(a: dt.datetime, b: dt.datetime) -> F.Batch:
        out = F.Batch()
        t = T + 5 * MIN * -(-(a - T) // (5 * MIN))  # the polls inside [a, b)
        while t < b:
            bad = T + 5 * MIN <= t < T + 25 * MIN
            text = ("GUID               | 0x1c34da0300010540\nports              | 36\n"
                    f"PSU0 status        | OK\nPSU1 status        | {psu1 if bad else 'OK'}\n"
                    f"temperature (C)    | 45\nfan status         | {fan if bad else 'OK'}\nfan#1 (rpm)        | 8493\n").encode()
            out = out.merge(ibswinfo.parse(text, ts=t, source="ibswinfo"))
            t += 5 * MIN
        return out
    return extra


def probe_failure(a: dt.datetime, b: dt.datetime) -> F.Batch:
    at = T + 4 * MIN
    if not a <= at < b:
        return F.Batch()
    ev = {"ts": at, "host": "n2", "gpu_uuid": "GPU-n2-0", "kind": "sdc_probe", "code": 0, "value": 0.0,
          "message": json.dumps({"digest": "bad", "golden": "good", "backend": "torch", "device_type": "cuda", "mismatched_elements": 3, "seconds": 1.0}),
          "source": "fleetscope probe"}
    return F.Batch(health_event=pl.DataFrame([ev], schema_overrides={"ts": F.UTC_US, "value": pl.Float64}))


def slow_rank_steps(a: dt.datetime, b: dt.datetime) -> F.Batch:
    """An 8-rank job stepping every 10 s for an hour; rank 5 computes 60 % slower for the first 20 minutes."""
    rows = []
    t = max(a, T)
    end = T + 60 * MIN
    while t < min(b, end):
        s = int((t - T).total_seconds() // 10)
        for r in range(8):
            compute = 1.6 if r == 5 and t < T + 20 * MIN else 1.0
            rows.append({"job_id": "train-1", "rank": r, "step": s, "start": t, "end": t + dt.timedelta(seconds=compute + 0.2),
                         "compute_s": compute, "comm_s": 0.2, "comm_overlap_s": 0.0, "idle_s": 0.0})
        t += dt.timedelta(seconds=10)
    return F.Batch(step=pl.DataFrame(rows, schema_overrides={"start": F.UTC_US, "end": F.UTC_US}) if rows else None)


def stalled_steps(a: dt.datetime, b: dt.datetime) -> F.Batch:
    """The 8-rank job stops stepping from minute 10 to 30 (every rank stuck in a collective), then goes on."""
    batch = slow_rank_steps(a, b)
    if batch.step is not None:
        t = pl.col("start")
        batch.step = batch.step.with_columns(pl.lit(1.0).alias("compute_s")).filter((t < T + 10 * MIN) | (t >= T + 30 * MIN))
    return batch


def failing_job(a: dt.datetime, b: dt.datetime) -> F.Batch:
    """Steps every 10 s; a failure at 5 min, restarted at 15 min (ten minutes of recovery), done at 40."""
    rows = [(T, "started", {})]
    step = 0
    t = T + MIN
    while t < T + 40 * MIN:
        if T + 5 * MIN <= t < T + 15 * MIN:
            t = T + 15 * MIN
            rows += [(T + 5 * MIN, "failure", {"cause": "xid_79"}), (T + 15 * MIN, "restart", {})]
            step -= 3  # resumed from the last checkpoint
            continue
        rows.append((t, "step", {"step": step}))
        step += 1
        t += dt.timedelta(seconds=10)
    rows.append((T + 40 * MIN, "finished", {}))
    return F.Batch(job_event=between(events(rows), "ts", a, b))


def nccl_runs(a: dt.datetime, b: dt.datetime) -> F.Batch:
    """Three healthy all_reduce runs of the same 16-GPU benchmark, then one at half the bus bandwidth."""
    runs = [("base-1", T - 90 * MIN, 180.0), ("base-2", T - 60 * MIN, 181.0), ("base-3", T - 30 * MIN, 179.0), ("bad", T + 3 * MIN, 90.0)]
    rows = [{"run_id": rid, "op": "all_reduce", "size_bytes": size, "in_place": inplace, "ts": ts, "nranks": 16, "hosts": "n0,n1",
             "count": size // 4, "dtype": "float", "redop": "sum", "root": -1, "time_s": size / (bw * 1e9) * 16 / 30,
             "algbw_gbps": bw * 8 / 15, "busbw_gbps": bw, "wrong": 0}
            for rid, ts, bw in runs for size in (1 << 27, 1 << 28, 1 << 29) for inplace in (False, True)]
    return F.Batch(nccl_test=between(pl.DataFrame(rows, schema_overrides={"ts": F.UTC_US}), "ts", a, b))


def flapping_link(a: dt.datetime, b: dt.datetime) -> F.Batch:
    """Every host's HCA port sampled every 10 s as the node agent reads sysfs; n1's link goes down once a
    minute from minute 3 to 9 (LinkDownedCounter rises), then holds."""
    rows = []
    t = a
    while t < b:
        secs = (t - T).total_seconds()
        for h in HOSTS:
            downs = 2 + (max(0, min(int((t - T) / MIN), 9) - 2) if h == "n1" and t >= T + 3 * MIN else 0)
            rows.append({"ts": t, "node": h, "device": "mlx5_0", "port": 1, "host": h, "state": "ACTIVE", "width": "4X", "speed": "NDR",
                         "rate_gbps": 400.0, "xmit_bytes_total": int(1e12 + 2e9 * secs), "rcv_bytes_total": int(1e12 + 2e9 * secs),
                         "link_downed_total": downs, "symbol_errors_total": 0, "xmit_wait_total": 1000})
        t += dt.timedelta(seconds=10)
    return F.Batch(fabric_port_sample=pl.DataFrame(rows, schema_overrides={"ts": F.UTC_US}))


def hot(g: str, t: dt.datetime) -> dict:
    # SW and HW thermal slowdown (0x20 | 0x40) on one GPU from minute 2 to 25, its clock held down
    if g == "GPU-n2-1" and T + 2 * MIN <= t < T + 25 * MIN:
        return {"clock_event_reasons": 0x60, "sm_clock_mhz": 1410.0, "temp_c": 91.0}
    return {}


def audit_fails(store: Store, at: dt.datetime, m: int, data_dir: Path) -> None:
    """A model ranking job applicants (Annex III point 4) declared outside Annex III: the scheduled audit fails
    Art. 6 at the first tick. Five hours later the area is declared right and an audit is asked for: it passes,
    and the failure, which would otherwise stand until next week's audit, ends there."""
    if m == 1:
        gs.put_model(store, ModelEntry("ranker", "1", intended_purpose="rank job applicants for interviews"), actor="test")
        audit_service.declare(store, "ranker", "1", "area", {"area": "none"}, entered_by="test", now=at - MIN)
        audit_service.run_audit(store, make_settings(data_dir, str(store.engine.url)), trigger="beat", requested_by="beat", now=at)
    if m == 10:
        audit_service.declare(store, "ranker", "1", "area", {"area": "employment"}, entered_by="test", now=at - MIN)
        audit_service.run_audit(store, make_settings(data_dir, str(store.engine.url)), trigger="api", requested_by="test", now=at)


def model_degrades(store: Store, at: dt.datetime, m: int, data_dir: Path) -> None:
    """A credit-scoring model's predictions with outcomes: a day of reference, then two hours in a downturn
    (incomes fall, outcomes turn against the score) from a version that misses women who would repay. Beat's
    monitoring tick evaluates the closed windows each time it runs."""
    import numpy as np

    from fleetscope.door import ingestion
    from fleetscope.services import monitoring as monitoring_service
    from fleetscope.sim.predictions import credit_stream

    if m == 1:
        s = credit_stream("credit", "1", T - 25 * 60 * MIN, hours=26, rate=300, rng=np.random.default_rng(0), drift_from_hour=24,
                          bias=1.5, income_fall=0.6, concept_drift=0.15)
        ingestion.ingest_bytes(store, s.jsonl, source="credit.jsonl")
    monitoring_service.evaluate(store, "credit", "1", now=at, lookback_s=6 * 3600)


def slo_burns(store: Store, at: dt.datetime, m: int, data_dir: Path) -> None:
    """A serving deployment scraped each minute: 1,000 requests a minute at TTFT 0.1 s, half of them at 2 s
    from minute 5 to 30. A recorded SLO (TTFT <= 0.5 s for 99 %) burns at 50x: the 1 h window passes 14.4x
    after 18 minutes and pages; once the slow requests stop, the 5 m and then the 30 m windows fall under
    their rates, the findings stop, and the alert resolves. Beat's serving window runs each tick."""
    from fleetscope.core import serving_frames as SF
    from fleetscope.services import serving as serving_service
    from analyzers.slo import SLO

    slow = sum(500 for i in range(1, m + 1) if 5 <= i < 30)
    total = 1000 * m
    rows = [{"ts": at, "deployment": "chat", "replica": "chat-0", "metric": "ttft_seconds", "le": le, "cumulative_count": float(c)}
            for le, c in (("0.25", total - slow), ("0.5", total - slow), ("2.5", total), ("+Inf", total))]
    store.write(F.Batch(serving_replica=pl.DataFrame({"deployment": ["chat"], "replica": ["chat-0"], "server": ["vllm"]}),
                        serving_bucket=F.conform(SF.SERVING_BUCKET, pl.DataFrame(rows))))
    if m == 1:
        store.write(F.Batch(serving_bucket=F.conform(SF.SERVING_BUCKET, pl.DataFrame([{**r, "ts": at - MIN, "cumulative_count": 0.0} for r in rows]))))
        serving_service.put_slo(store, SLO("ttft", "chat", "latency", 0.99, "ttft_seconds", 0.5), actor="test", now=at)
    serving_service.window_findings(store, start=at - 15 * MIN, end=at)


def team_over_budget(store: Store, at: dt.datetime, m: int, data_dir: Path) -> None:
    """Finance maps Slurm account ml to team ml and gives it 1 GPU-hour for November; the Slurm job of
    ``idle_slurm_job`` has held 2 GPUs for 90 minutes, so the health sweep finds the team over. At minute 20 the
    quota is raised to 1,000 GPU-hours (and the run rate, 29.5 days in, projects far under it): the findings
    stop and the alert resolves."""
    from fleetscope.services import teams as teams_service

    if m == 1:
        teams_service.set_mapping(store, kind="slurm_account", match="ml", team="ml", recorded_by="finance", now=at)
        teams_service.set_budget(store, team="ml", month="2026-11", gpu_hour_quota=1.0, recorded_by="finance", now=at)
    if m == 20:
        teams_service.set_budget(store, team="ml", month="2026-11", gpu_hour_quota=1000.0, recorded_by="finance", now=at)


def dcgm_counter(field: str, on: Callable[[int], float]) -> Callable[[Store, dt.datetime, int, Path], None]:
    """GPU-n1-0's dcgm-exporter scrape, ingested as the agent's text each minute: one fault counter, valued
    ``on(minute)``, beside its temperature. The parser turns a counter above zero into a health event and
    the store keeps only a changed reading, so a counter held for many scrapes is one event."""
    from fleetscope.door import ingestion
    from ingest.format import Options

    def act(store: Store, at: dt.datetime, m: int, data_dir: Path) -> None:
        labels = ('gpu="0",UUID="GPU-n1-0",pci_bus_id="00000000:19:00.0",device="nvidia0",'
                  'modelName="NVIDIA H100 80GB HBM3",Hostname="n1"')
        body = f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 60\n{field}{{{labels}}} {on(m):g}\n".encode()
        ingestion.ingest_bytes(store, body, source="dcgm-exporter n1", fmt="dcgm", opts=Options(ts=at - dt.timedelta(seconds=5)))
    return act


SCENARIOS = {
    "xid79": Scenario(extra=xid(79, T + 3 * MIN), rules=("GpuFellOffBus",), muted=("GpuNeedsRepairOrDrain",)),
    "xid48": Scenario(extra=xid(48, T + 3 * MIN), rules=("GpuUncorrectableEcc",)),
    "xid64": Scenario(extra=xid(64, T + 3 * MIN), minutes=110, rules=("GpuRowRemapFailure",), muted=("GpuNeedsRepairOrDrain",)),
    # XID 157 (resource retirement failed: no spare resources left) has no XID rule: the sweep's repair advice pages
    "xid157": Scenario(extra=xid(157, T + 3 * MIN), minutes=110, rules=("GpuNeedsRepairOrDrain",)),
    # the counters alone, with no XID scraped: a double-bit error at minute 3, cleared by a GPU reset at 20; a
    # row remap that fails at minute 3 and stays failed (the GPU awaits repair; the sweep's advice takes over)
    "ecc_dbe_counter": Scenario(act=dcgm_counter("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", lambda m: 2.0 if 3 <= m < 20 else 0.0),
                                minutes=70, rules=("GpuUncorrectableEcc",)),
    "row_remap_counter": Scenario(act=dcgm_counter("DCGM_FI_DEV_ROW_REMAP_FAILURE", lambda m: 1.0 if m >= 3 else 0.0),
                                  minutes=110, rules=("GpuRowRemapFailure",), muted=("GpuNeedsRepairOrDrain",)),
    "sdc_probe": Scenario(extra=probe_failure, minutes=110, rules=("SdcSuspect",)),
    "straggler": Scenario(extra=slow_rank_steps, rules=("Straggler",)),
    "hang": Scenario(extra=stalled_steps, rules=("JobHung",)),
    "watchdog": Scenario(extra=watchdog_timeout, minutes=60, rules=("NcclCollectiveTimedOut",)),
    "switch_fan": Scenario(extra=switch_vitals(fan="ERROR"), minutes=60, rules=("InfiniBandSwitchFanFailed",)),
    "switch_psu": Scenario(extra=switch_vitals(psu1="FAILED"), minutes=60, rules=("InfiniBandSwitchPsuFailed",)),
    "thermal": Scenario(gpu=hot, rules=("GpuThermalThrottling",)),
    "goodput": Scenario(extra=failing_job, minutes=90, rules=("JobGoodputLow",)),
    "nccl": Scenario(extra=nccl_runs, minutes=160, rules=("NcclBandwidthRegression",)),
    "pue_high": Scenario(meters=lambda t: 1.9 if t < T + 40 * MIN else 1.3, rules=("PueOutOfRange",)),
    "pue_low": Scenario(meters=lambda t: 0.8 if t < T + 40 * MIN else 1.3, minutes=100, rules=("PueImplausible",)),
    "ib_flap": Scenario(extra=flapping_link, rules=("FabricLinkUnhealthy",)),
    # the audit runs in hours: half-hour ticks
    "audit": Scenario(act=audit_fails, step_min=30, minutes=20, rules=("AuditRuleFailed",)),
    "model_monitoring": Scenario(act=model_degrades, step_min=30, minutes=12,
                                 rules=("ModelDataDrift", "ModelPredictionDrift", "ModelAccuracyDropped", "ModelFairnessDegraded")),
    "host_down": Scenario(silent=lambda h, t: h == "n3" and T + 3 * MIN <= t < T + 20 * MIN, rules=("HostDown",)),
    "gpu_gone": Scenario(gone=lambda g, t: g == "GPU-n1-1" and T + 3 * MIN <= t < T + 20 * MIN, rules=("GpuStoppedReporting",)),
    "slo_burn": Scenario(act=slo_burns, minutes=80, rules=("ServingSloBurn",)),
    "idle_allocation": Scenario(gpu=lambda g, t: {"util_ratio": 0.0} if g.startswith("GPU-n0-") and T <= t < T + 50 * MIN else {},
                                extra=idle_slurm_job, minutes=80, rules=("IdleGpuAllocation",)),
    "team_budget": Scenario(extra=idle_slurm_job, act=team_over_budget, minutes=45, rules=("TeamOverBudget",)),
    "site_silent": Scenario(silent=lambda h, t: h != "n0" and T + 3 * MIN <= t < T + 20 * MIN, rules=("TelemetryAbsent",)),
}


def run(tmp_path, name: str, migrated: Path) -> tuple[Receiver, list[str]]:
    s = SCENARIOS[name]
    url = fresh_sqlite(migrated, tmp_path / "fs.db")
    store = Store.open(url)
    store.write(F.Batch(
        site=pl.DataFrame({"site_id": ["dc1"], "declared_pue": [1.3]}),
        host=pl.DataFrame({"host": HOSTS, "site_id": ["dc1"] * 4}),
        gpu=pl.DataFrame({"gpu_uuid": [g for g, _ in GPUS], "host": [h for _, h in GPUS], "model_name": ["NVIDIA H100 80GB HBM3"] * 8}),
        job_rank=pl.DataFrame({"job_id": ["train-1"] * 8, "rank": list(range(8)), "gpu_uuid": [g for g, _ in GPUS], "host": [h for _, h in GPUS],
                               "start": [T - 60 * MIN] * 8}, schema_overrides={"start": F.UTC_US}),
    ))
    rx = Receiver().start()
    rx.ticks = []  # the minute each request arrived in
    box = ST.SecretBox([Fernet.generate_key()])
    ST.put_receiver(store.engine, box, "default", "webhook", rx.url + "/hook", policy=N.OutboundPolicy(allow_loopback=True))
    config = load_config()
    deliver = ST.Deliverer(store, box, N.OutboundPolicy(allow_loopback=True), N.RetryPolicy(), timeout_s=5.0)
    feed = telemetry
    log: list[str] = []
    prev = T - 100 * MIN  # history before the fault: nccl-tests baselines, an hour and more of samples
    store.write(feed(s, prev, T))
    prev = T
    for m in range(1, s.minutes + 1):
        at = T + m * s.step_min * MIN
        store.write(feed(s, prev, at))
        prev = at
        for job in analysis.active_jobs(store, since=at - 15 * MIN):
            analysis.analyze_job(store, job, now=at)
        energy_rollup.rollup_window(store, at - 10 * MIN, at)
        if (m * s.step_min) % 5 == 0:
            health_service.health_window(store, at - 15 * MIN, at)
        if s.act is not None:
            s.act(store, at, m, tmp_path)
        res = ST.evaluate_and_dispatch(store, config, now=at)
        log.append(f"{m}: firing={sorted({st.labels['alertname'] for st in res.states.values() if st.state == 'firing'})}")
        if deliver.due(at):  # (a sweep opens an HTTP client; most ticks have nothing to send)
            deliver.deliver_due(now=at)
        rx.ticks.extend([m] * (len(rx.requests) - len(rx.ticks)))
    rx.stop()
    store.engine.dispose()
    return rx, log


def notified(rx: Receiver, rule: str) -> dict[str, list[str]]:
    """Per alert status, the group keys of the notifications that carried ``rule``."""
    out: dict[str, list[str]] = {"firing": [], "resolved": []}
    for req in rx.requests:
        body = req["json"]
        for a in body["alerts"]:
            if a["labels"]["alertname"] == rule:
                out[a["status"]].append(body["groupKey"])
    return out


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_shipped_rule_fires_and_resolves(tmp_path, name, sqlite_migrated):
    rx, log = run(tmp_path, name, sqlite_migrated)
    for rule in SCENARIOS[name].rules:
        got = notified(rx, rule)
        assert got["firing"], f"{rule} never fired in scenario {name}:\n" + "\n".join(log)
        assert got["resolved"], f"{rule} fired but never resolved in scenario {name}:\n" + "\n".join(log)
        assert rx.requests[-1]["json"]["alerts"], "the receiver got an empty notification"
    for rule in SCENARIOS[name].muted:
        assert any(rule in line for line in log), f"{rule} never fired in scenario {name}, so its muting proves nothing"
        # Alertmanager's inhibition holds while the source fires: the advice may page once the XID's own
        # alert has resolved (the GPU still needs the repair), never beside it
        cause_ended = min(rx.ticks[i] for i, req in enumerate(rx.requests) for a in req["json"]["alerts"]
                          if a["labels"]["alertname"] in SCENARIOS[name].rules and a["status"] == "resolved")
        beside = [rx.ticks[i] for i, req in enumerate(rx.requests) for a in req["json"]["alerts"]
                  if a["labels"]["alertname"] == rule and rx.ticks[i] < cause_ended]
        assert not beside, f"{rule} paged beside {SCENARIOS[name].rules}: one fault, two pages"


def test_the_scenarios_cover_every_shipped_rule():
    covered = {r for s in SCENARIOS.values() for r in s.rules}
    shipped = {r.name for r in load_config().rules}
    assert shipped == covered, f"rules without a firing scenario: {sorted(shipped - covered)}"
