"""Writers for the real formats: bytes out, as the real tools write them, for the real parsers to read.

- dcgm-exporter ``/metrics`` bodies (Prometheus text exposition 0.0.4): ``# HELP`` / ``# TYPE`` per
  family, then one sample per GPU with the exporter's labels ``gpu, UUID, pci_bus_id, device,
  modelName, Hostname, DCGM_FI_DRIVER_VERSION`` (and ``container, namespace, pod, pod_uid`` with
  Kubernetes pod attribution); integer fields printed as integers, double fields with six decimals, no
  timestamps (the scraper stamps them), as in the captures in ``shared/realdata/telemetry``.
- NCCL Inspector JSON Lines, format v4.0 (self-contained lines: ``header``, ``metadata``, ``coll_perf``
  with the verbose ``event_trace_ts``), one file per process in ``nccl-inspector-<SLURM_JOBID>/``.
  ``header.rank`` and ``n_ranks`` are the communicator's, as NCCL reports them.
- PyTorch profiler (Kineto) Chrome traces: ``ProfilerStep#N`` host spans, compute kernels on stream 7,
  ``ncclDevKernel_*`` kernels on the communicators' streams with PyTorch's collective args,
  ``distributedInfo`` and ``baseTimeNanoseconds``.
- Job lifecycle events (docs/job_events.md).
- OTLP/JSON ``ExportMetricsServiceRequest`` for facility meters and grid intensity.
- nccl-tests' ``all_reduce_perf`` stdout (NVIDIA/nccl-tests ``src/util.cu``'s table), an acceptance sweep.

Every writer takes the simulation's explicit start time; none reads the clock.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

import numpy as np
import orjson

from fleetscope.sim.fleet import Topology
from fleetscope.sim.jobs import GRAD_NORM_BYTES, JobRun, StepDetail, checksum
from fleetscope.sim.spec import GpuModel
from fleetscope.sim.telemetry import FIELDS

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def epoch_us(start: dt.datetime) -> int:
    return (start - EPOCH) // dt.timedelta(microseconds=1)


def iso_us(us: int) -> str:
    return (EPOCH + dt.timedelta(microseconds=int(us))).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _dumps(obj: Any) -> str:
    # orjson: ~10x the stdlib encoder, and its float formatting (shortest round-trip) is deterministic
    return orjson.dumps(obj).decode()


def iso_us_many(us: np.ndarray) -> np.ndarray:
    """RFC 3339 UTC strings with microseconds for an array of epoch microseconds (vectorised)."""
    return np.char.add(np.datetime_as_string(np.asarray(us, dtype="int64").astype("datetime64[us]"), unit="us"), "Z")


# --- dcgm-exporter ----------------------------------------------------------------------------------


def dcgm_label_blocks(topo: Topology, driver_version: str, pods: list[tuple[str, str, str] | None] | None = None) -> list[str]:
    """The label block of each GPU's samples, in the exporter's label order."""
    g = topo.gpus_per_node
    out = []
    for i, uuid in enumerate(topo.gpu_uuid):
        host, local = topo.hosts[i // g], i % g
        b = (f'gpu="{local}",UUID="{uuid}",pci_bus_id="{topo.pci_bus_id[i]}",device="nvidia{local}",'
             f'modelName="{topo.model_name}",Hostname="{host}",DCGM_FI_DRIVER_VERSION="{driver_version}"')
        pod = pods[i] if pods else None
        if pod is not None:
            b += f',container="{pod[0]}",namespace="{pod[1]}",pod="{pod[2]}",pod_uid=""'
        out.append(b)
    return out


class DcgmWriter:
    """Formats one scrape of the whole fleet into one body per host. The label blocks never change, so
    each ``NAME{labels} `` prefix is built once and only the values are formatted per scrape."""

    def __init__(self, topo: Topology, label_blocks: list[str]):
        self.topo = topo
        self.prefix = {name: np.array([f"{name}{{{b}}} " for b in label_blocks], dtype=object) for name, *_ in FIELDS}
        self.header = {name: f"# HELP {name} {help_}\n# TYPE {name} {kind}\n" for name, kind, help_, _ in FIELDS}

    def bodies(self, values: dict[str, np.ndarray]) -> list[bytes]:
        g = self.topo.gpus_per_node
        lines: dict[str, np.ndarray] = {}
        for name, _, _, fmt in FIELDS:
            v = values[name]
            if fmt == "i":
                s = np.rint(v).astype(np.int64).astype(str).astype(object)
            else:
                s = np.array([f"{x:f}" for x in v.tolist()], dtype=object)
            lines[name] = self.prefix[name] + s
        out = []
        for h in range(len(self.topo.hosts)):
            parts = []
            for name, *_ in FIELDS:
                parts.append(self.header[name])
                parts.append("\n".join(lines[name][h * g:(h + 1) * g]))
                parts.append("\n")
            out.append("".join(parts).encode())
        return out


# --- NCCL Inspector ----------------------------------------------------------------------------------


def comm_hash(run: JobRun, attempt: int, pg: str) -> str:
    """A communicator id like NCCL's (a 56-bit hash printed in hex); new communicators on every restart."""
    return "0x" + hashlib.sha1(f"{run.job_id}/{attempt}/{pg}".encode()).hexdigest()[:14]


def process_ids(run: JobRun, rank: int) -> int:
    return 20000 + (int(hashlib.sha1(f"{run.job_id}/{rank}".encode()).hexdigest()[:6], 16) % 400000)


def _collectives(run: JobRun, d: StepDetail, rank: int, resume_step: int) -> list[dict[str, Any]]:
    """The four collectives of one step on one rank: (op, pg, comm rank, comm size, nnodes, seq, bytes,
    start s, end s, busbw factor)."""
    g = run.plan.gpus_per_node
    n_nodes = len(run.plan.nodes)
    node, local = divmod(rank, g)
    k = d.step - resume_step  # collectives issued on this attempt's communicators before this step
    grad = 2.0 * run.plan.spec.params
    shard = grad / g
    out = [
        {"op": "ReduceScatter", "pg": f"node{node}", "crank": local, "cn": g, "nnodes": 1, "sn": 2 * k,
         "bytes": int(shard), "algbytes": grad, "t0": d.a_rs[rank], "t1": d.rs_end[rank], "bus": (g - 1) / g},
    ]
    if n_nodes > 1:
        out.append({"op": "AllReduce", "pg": f"rail{local}", "crank": node, "cn": n_nodes, "nnodes": n_nodes, "sn": k,
                    "bytes": int(shard), "algbytes": shard, "t0": d.rs_end[rank], "t1": d.ar_end[rank],
                    "bus": 2 * (n_nodes - 1) / n_nodes})
    n = n_nodes * g
    out.append({"op": "AllReduce", "pg": "world", "crank": rank, "cn": n, "nnodes": n_nodes, "sn": k,
                "bytes": GRAD_NORM_BYTES, "algbytes": GRAD_NORM_BYTES, "t0": d.ar_end[rank], "t1": d.gn_end[rank],
                "bus": 2 * (n - 1) / n})
    out.append({"op": "AllGather", "pg": f"node{node}", "crank": local, "cn": g, "nnodes": 1, "sn": 2 * k + 1,
                "bytes": int(shard), "algbytes": grad, "t0": d.opt_end[rank], "t1": d.ag_end[rank], "bus": (g - 1) / g})
    return out


def inspector_files(run: JobRun, topo: Topology, start: dt.datetime) -> dict[str, bytes]:
    """One JSON Lines file per process (rank) under ``nccl-inspector-<job_id>/``: the collectives of the
    detail steps (the Inspector dumps periodically; a sample of steps is what a dump interval leaves)."""
    base = epoch_us(start)
    g = run.plan.gpus_per_node
    resume = _resume_steps(run)
    files: dict[str, list[str]] = {}
    comm_ids: dict[tuple[int, str], str] = {}
    names = [f"nccl-inspector-{run.job_id}/{topo.hosts[run.plan.nodes[r // g]]}-pid{process_ids(run, r)}.log"
             for r in range(run.world_size)]
    for d in run.details:
        for rank in range(run.world_size):
            host = topo.hosts[run.plan.nodes[rank // g]]
            pid = process_ids(run, rank)
            buf = files.setdefault(names[rank], [])
            for c in _collectives(run, d, rank, resume[d.attempt]):
                key = (d.attempt, c["pg"])
                if key not in comm_ids:
                    comm_ids[key] = comm_hash(run, d.attempt, c["pg"])
                t0 = base + round(float(c["t0"]) * 1e6)
                t1 = base + round(float(c["t1"]) * 1e6)
                exec_us = max(t1 - t0, 1)
                algbw = c["algbytes"] / (exec_us * 1e-6) / 1e9
                rec = {
                    "header": {"id": comm_ids[key], "rank": c["crank"], "n_ranks": c["cn"], "nnodes": c["nnodes"]},
                    "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "", "rec_mechanism": "nccl_profiler_interface",
                                 "dump_timestamp_us": t1 + 500_000, "hostname": host, "pid": pid},
                    "coll_perf": {"coll": c["op"], "coll_sn": c["sn"], "coll_msg_size_bytes": c["bytes"], "coll_exec_time_us": exec_us,
                                  "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": round(algbw, 6),
                                  "coll_busbw_gbs": round(algbw * c["bus"], 6),
                                  "event_trace_ts": {"coll_start_ts": t0 - 4, "coll_stop_ts": t0 - 1,
                                                     "kernel_events": [{"channel_id": 0, "kernel_start_ts": t0, "kernel_stop_ts": t1,
                                                                        "kernel_record_ts": t1}]}},
                }
                buf.append(_dumps(rec))
    return {k: ("\n".join(v) + "\n").encode() for k, v in files.items()}


def _resume_steps(run: JobRun) -> dict[int, int]:
    """The first step of each attempt: communicators are created anew on every attempt and number
    their operations from 0. Attempt k > 0 starts at the step its checkpoint restore names."""
    out = {0: 0}
    for e in run.events:
        if e["kind"] == "checkpoint_restore_end":
            out[len(out)] = int(e["step"])
    return out


# --- Kineto ------------------------------------------------------------------------------------------

_COMPUTE_STREAM, _NODE_STREAM, _RAIL_STREAM, _WORLD_STREAM = 7, 20, 24, 28
_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
_FLASH_FWD = "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, true>(Flash_fwd_params)"
_FLASH_BWD = "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8>, true>(Flash_bwd_params)"
_OPT = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::BFloat16, 4>>(...)"
_NCCL = {
    "ReduceScatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "AllReduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "AllReduceF32": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "AllGather": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
}


def process_groups(run: JobRun) -> dict[str, str]:
    """PyTorch process-group names (numbers, the same on every rank): world "0", node groups, rails."""
    g = run.plan.gpus_per_node
    n_nodes = len(run.plan.nodes)
    pgs = {"world": "0"}
    for k in range(n_nodes):
        pgs[f"node{k}"] = str(1 + k)
    for j in range(g):
        pgs[f"rail{j}"] = str(1 + n_nodes + j)
    return pgs


def kineto_trace(run: JobRun, rank: int, topo: Topology, gpu: GpuModel, start: dt.datetime) -> bytes:
    """One rank's profiler trace over the job's profiling window (``run.kineto``)."""
    steps = run.kineto
    g = run.plan.gpus_per_node
    local = rank % g
    base_us = epoch_us(start) + round(float(steps[0].start.min()) * 1e6)  # trace origin, as Kineto's baseTime
    origin_s = float(steps[0].start.min())
    rel = lambda t: round((float(t) - origin_s) * 1e6, 3)  # noqa: E731  µs from the origin, ns resolution
    pgs = process_groups(run)
    resume = _resume_steps(run)
    pid_host = process_ids(run, rank)
    ev: list[dict[str, Any]] = []
    corr = [1000]  # correlation ids count up per trace

    def kernel(name: str, t0: float, t1: float, stream: int, extra: dict[str, Any] | None = None) -> None:
        if t1 - t0 <= 0:
            return
        corr[0] += 1
        c = corr[0]
        launch = max(rel(t0) - 6.0, 0.0)
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid_host, "tid": pid_host,
                   "ts": launch, "dur": 4.0, "args": {"correlation": c, "External id": c}})
        args = {"device": local, "stream": stream, "correlation": c, "External id": c}
        if extra:
            args.update(extra)
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": local, "tid": stream, "ts": rel(t0),
                   "dur": round(rel(t1) - rel(t0), 3), "args": args})

    for d in steps:
        S, E = d.start[rank], d.end[rank]
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{d.step}", "pid": pid_host, "tid": pid_host,
                   "ts": rel(S), "dur": round(rel(E) - rel(S), 3), "args": {"External id": 0}})
        c_end = d.compute_end[rank]
        c = c_end - S
        f = S + c / 3
        kernel(_GEMM, S, S + 0.6 * (f - S), _COMPUTE_STREAM)
        kernel(_FLASH_FWD, S + 0.6 * (f - S), f, _COMPUTE_STREAM)
        kernel(_GEMM, f, f + 0.6 * (c_end - f), _COMPUTE_STREAM)
        kernel(_FLASH_BWD, f + 0.6 * (c_end - f), c_end, _COMPUTE_STREAM)
        kernel(_OPT, d.gn_end[rank], d.opt_end[rank], _COMPUTE_STREAM)
        for col in _collectives(run, d, rank, resume[d.attempt]):
            pg = pgs[col["pg"]]
            if col["op"] == "AllReduce" and col["pg"] == "world":
                name, dtype, n_in, n_out = _NCCL["AllReduceF32"], "Float", 1, 1
            else:
                name, dtype = _NCCL[col["op"]], "BFloat16"
                full, shard = int(2 * run.plan.spec.params // 2), int(col["bytes"] // 2)
                n_in, n_out = {"ReduceScatter": (full, shard), "AllGather": (shard, full), "AllReduce": (shard, shard)}[col["op"]]
            stream = _WORLD_STREAM if col["pg"] == "world" else (_RAIL_STREAM if col["pg"].startswith("rail") else _NODE_STREAM)
            coll = {"ReduceScatter": "_reduce_scatter_base", "AllGather": "_allgather_base", "AllReduce": "allreduce"}[col["op"]]
            kernel(name, col["t0"], col["t1"], stream, {"Collective name": coll, "In msg nelems": n_in, "Out msg nelems": n_out,
                                                        "dtype": dtype, "Group size": col["cn"], "Process Group Name": pg,
                                                        "Process Group Description": col["pg"]})
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": local, "name": gpu.name, "totalGlobalMem": gpu.memory_mib * 2**20, "computeMajor": 9,
                              "computeMinor": 0, "numSms": 132}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": run.world_size, "pg_count": len(pgs),
                            "nccl_version": "2.21.5"},
        "baseTimeNanoseconds": base_us * 1000,
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "traceName": f"rank{rank}.pt.trace.json",
    }
    return _dumps(doc).encode()


# --- job events --------------------------------------------------------------------------------------


def job_events_jsonl(run: JobRun, topo: Topology, start: dt.datetime, uuids_of_rank: list[str]) -> bytes:
    """The job's lifecycle: job-level events (step starts for goodput, as ml-goodput-measurement records
    them) and, on detail steps, one step event per rank with its span, C³ parts, tokens, FLOPs, loss and
    the parameter checksum of its replica group (the shard it holds)."""
    base = epoch_us(start)
    g = run.plan.gpus_per_node
    spec = run.plan.spec
    rows: list[tuple[int, int, str]] = []
    for e in run.events:
        us = base + round(e["t"] * 1e6)
        rec: dict[str, Any] = {"job_id": run.job_id, "ts": iso_us(us), "kind": e["kind"]}
        for k, v in e.items():
            if k in ("t", "kind"):
                continue
            rec[k] = v
        if e["kind"] == "failure" and "rank" in e:
            r = e["rank"]
            rec["host"] = topo.hosts[run.plan.nodes[r // g]]
            rec["gpu_uuid"] = uuids_of_rank[r]
        if e["kind"] == "allocated" and "job" in e:
            rec["job"] = dict(e["job"], site_id=topo.host_site[run.plan.nodes[0]], submitted_at=iso_us(us))
        rows.append((us, -1, _dumps(rec)))
    flops_rank = 6.0 * spec.params * spec.tokens_per_gpu_step
    ranks = np.arange(run.world_size)
    for d in run.details:
        s_us = base + np.rint(d.start * 1e6).astype(np.int64)
        e_us = base + np.rint(d.end * 1e6).astype(np.int64)
        s_iso, e_iso = iso_us_many(s_us).tolist(), iso_us_many(e_us).tolist()
        comp = np.round((d.compute_end - d.start) + (d.opt_end - d.gn_end), 6).tolist()
        comm = np.round((d.gn_end - d.a_rs) + (d.ag_end - d.opt_end), 6).tolist()
        ov = np.round(d.compute_end - d.a_rs, 6).tolist()
        idle = np.round(d.end - d.ag_end, 6).tolist()
        dur = np.round((e_us - s_us) / 1e6, 6).tolist()
        loss = np.round(d.loss, 5).tolist()
        gnorm = np.round(0.9 + 0.2 * np.sin(d.step / 7.0 + ranks) ** 2, 5).tolist()
        sums = {(grp, bad): checksum(run.plan.checksum_salt, d.step, grp, bad) for grp in range(g) for bad in (False, True)}
        for r in range(run.world_size):
            rec = {"job_id": run.job_id, "ts": e_iso[r], "kind": "step", "rank": r, "step": d.step,
                   "start": s_iso[r], "duration_s": dur[r], "compute_s": comp[r], "comm_s": comm[r], "comm_overlap_s": ov[r],
                   "idle_s": idle[r], "tokens": spec.tokens_per_gpu_step, "model_flops": flops_rank, "loss": loss[r],
                   "grad_norm": gnorm[r], "param_checksum": sums[(r % g, bool(d.checksum_bad[r]))],
                   "replica_group": f"shard-{r % g}"}
            rows.append((int(e_us[r]), r, _dumps(rec)))
    rows.sort(key=lambda x: (x[0], x[1]))
    return ("\n".join(r[2] for r in rows) + "\n").encode()


# --- OTLP/JSON ---------------------------------------------------------------------------------------


def otlp_gauges_json(series: list[tuple[str, str, dict[str, str], list[tuple[int, float]]]]) -> bytes:
    """An OTLP/JSON ExportMetricsServiceRequest of gauges: (name, unit, attributes, [(epoch µs, value)]).

    No resource attributes: ``ingest.otlp`` folds them into the series labels, and the meter series keep
    exactly the labels Fleetscope's conventions name (``site``, ``point``)."""
    metrics: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for name, unit, attrs, points in series:
        dps = metrics.setdefault((name, unit), [])
        kv = [{"key": k, "value": {"stringValue": v}} for k, v in sorted(attrs.items())]
        for us, value in points:
            dps.append({"attributes": kv, "timeUnixNano": str(us * 1000), "asDouble": round(float(value), 6)})
    doc = {"resourceMetrics": [{"resource": {"attributes": []}, "scopeMetrics": [{"scope": {"name": "fleetscope.sim", "version": "1"},
           "metrics": [{"name": n, "unit": u, "gauge": {"dataPoints": dps}} for (n, u), dps in metrics.items()]}]}]}
    return _dumps(doc).encode()


def ib_node_exporter_body(hosts: list[str], t_s: float, flaps: tuple[int, tuple[float, ...]] | None) -> bytes:
    """One node_exporter ``infiniband`` scrape of every host's HCA port (mlx5_0 port 1, 4x NDR at
    400 Gb/s), hosts told apart by their ``instance`` label: data counters growing with training traffic,
    and on the flapping host the link-downed, link-recovery and symbol-error counters that rose at each flap."""
    lines = []
    for k, host in enumerate(hosts):
        downs = sum(1 for t in flaps[1] if t <= t_s) if flaps is not None and flaps[0] == k else 0
        labels = f'device="mlx5_0",instance="{host}:9100",port="1"'
        data = int(t_s * 6.0e9)
        values = {
            "port_data_received_bytes_total": data, "port_data_transmitted_bytes_total": data,
            "port_packets_received_total": data // 4096, "port_packets_transmitted_total": data // 4096,
            "link_downed_total": downs, "link_error_recovery_total": 3 * downs, "symbol_error_total": 40 * downs,
            "port_errors_received_total": 0, "port_discards_transmitted_total": 0, "port_transmit_wait_total": int(t_s * 1000),
            "rate_bytes_per_second": 50_000_000_000, "state_id": 4, "physical_state_id": 5,
        }
        lines += [f"node_infiniband_{name}{{{labels}}} {value}" for name, value in values.items()]
    return ("\n".join(lines) + "\n").encode()


# nccl-tests' all_reduce_perf sweep as a site runs it for acceptance: -b 8 -e 8G -f 2.
NCCL_TESTS_SIZES = tuple(2**e for e in range(3, 34))
# Latency of one inter-node all-reduce of a few bytes, on the order the p5 capture in shared/realdata prints (~80 µs).
NCCL_TESTS_LATENCY_S = 60e-6


def nccl_tests_all_reduce(hosts: list[str], gpus_per_node: int, gpu_name: str, busbw_peak_bytes_per_s: float, pid0: int) -> bytes:
    """``all_reduce_perf -b 8 -e 8G -f 2 -g 1`` over ``hosts`` × ``gpus_per_node`` ranks, as its stdout prints it.

    Times follow the alpha-beta model: a fixed latency plus the bytes each rank moves, ``2(n-1)/n`` × size for a
    ring all-reduce, at the bus bandwidth the fabric sustains; algbw = size / time and busbw = algbw × 2(n-1)/n,
    nccl-tests' own definitions (its doc/PERFORMANCE.md), so busbw climbs toward ``busbw_peak_bytes_per_s`` with
    the message size. The in-place column runs 1 % slower, as it often does. The average is nccl-tests' own: the
    mean of every busbw printed."""
    n = len(hosts) * gpus_per_node
    factor = 2 * (n - 1) / n
    lines = ["# Collective test starting: all_reduce_perf",
             f"# nThread 1 nGpus 1 minBytes {NCCL_TESTS_SIZES[0]} maxBytes {NCCL_TESTS_SIZES[-1]} step: 2(factor) warmup iters: 5 iters: 20 "
             "agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    for k, host in enumerate(hosts):
        for g in range(gpus_per_node):
            rank = k * gpus_per_node + g
            lines.append(f"#  Rank {rank:2d} Group  0 Pid {pid0 + rank:6d} on {host:>10} device {g:2d} [0x{0x18 + 0x11 * g:02x}] {gpu_name}")
    lines += ["#", "#                                                              out-of-place                       in-place",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"]
    printed = []
    for size in NCCL_TESTS_SIZES:
        cells = []
        for slower in (1.0, 1.01):
            time_s = (NCCL_TESTS_LATENCY_S + factor * size / busbw_peak_bytes_per_s) * slower
            algbw, busbw = size / time_s / 1e9, size / time_s / 1e9 * factor
            us = time_s * 1e6
            cells.append(f"{us:8.2f}" if us < 1e4 else f"{us:8.0f}")
            cells += [f"{algbw:7.2f}", f"{busbw:7.2f}", "     0"]
            printed.append(round(busbw, 2))
        lines.append(f"{size:12d}  {size // 4:12d}     float     sum      -1 " + " ".join(cells))
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {sum(printed) / len(printed):.3f}", "#", ""]
    return "\n".join(lines).encode()
