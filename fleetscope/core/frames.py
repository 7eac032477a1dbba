"""Canonical frames: one shape per kind of data, shared by ingest, store and analyzers.

Every source maps onto these frames and every analyzer reads them (see docs/ARCHITECTURE.md, "Canonical data").
Units are SI and carried in column names; times are UTC ``Datetime("us", "UTC")``.

This module is pure: it imports polars and nothing of the database, HTTP or Celery, so that
``ingest`` and ``analyzers`` can depend on it. ``fleetscope.store.schema`` builds the SQL tables from the
same definitions, so a column is declared exactly once.
"""

from __future__ import annotations

import json

import dataclasses
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from fleetscope.core.errors import ValidationError

UTC_US = pl.Datetime("us", "UTC")


@dataclass(frozen=True)
class Col:
    """One canonical column.

    ``key`` columns form the natural key: two rows with equal keys are the same fact, so writing a
    row twice keeps one copy. Keys are never null; where "no value" is meaningful (a host-level
    health event has no GPU) the column carries ``default`` instead.
    """

    name: str
    dtype: pl.DataType
    key: bool = False
    nullable: bool = True
    default: Any = None
    doc: str = ""

    @property
    def required(self) -> bool:
        """A column the writer must supply (no default to fill in)."""
        return (self.key or not self.nullable) and self.default is None


@dataclass(frozen=True)
class FrameSpec:
    """A canonical frame: its columns, natural key and how a re-sent row is treated.

    ``on_conflict``: ``"ignore"`` keeps the first copy (telemetry is immutable once observed);
    ``"fill"`` keeps the first copy of each field and fills in the fields the stored row lacks from a later
    copy (a wide sample whose fields a sender split over several requests, as Prometheus remote write
    and OpenTelemetry Collectors do past their batch size); ``"update"`` lets the newer row win (inventory
    and findings describe current state).
    """

    name: str
    columns: tuple[Col, ...]
    on_conflict: str = "ignore"
    doc: str = ""

    @property
    def schema(self) -> dict[str, pl.DataType]:
        return {c.name: c.dtype for c in self.columns}

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.key)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def col(self, name: str) -> Col:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    def empty(self) -> pl.DataFrame:
        return pl.DataFrame(schema=self.schema)


def _k(name: str, dtype: pl.DataType, default: Any = None, doc: str = "") -> Col:
    return Col(name, dtype, key=True, nullable=False, default=default, doc=doc)


def _f(name: str, dtype: pl.DataType = pl.Float64, doc: str = "") -> Col:
    return Col(name, dtype, doc=doc)


def _r(name: str, dtype: pl.DataType, doc: str = "") -> Col:
    """Required, not part of the key."""
    return Col(name, dtype, nullable=False, doc=doc)


# --- telemetry -------------------------------------------------------------------------------

# Wide GPU samples: one row per GPU per instant, one column per field. docs/ARCHITECTURE.md's performance notes
# measured wide rows 4-10x faster to write than one row per value, so GPU telemetry stays wide.
# Field names follow DCGM's meaning (DCGM_FI_DEV_* / DCGM_FI_PROF_*) converted to SI units.
GPU_FIELDS: tuple[Col, ...] = (
    _f("util_ratio", doc="DCGM_FI_DEV_GPU_UTIL / 100"),
    _f("mem_copy_util_ratio", doc="DCGM_FI_DEV_MEM_COPY_UTIL / 100"),
    _f("enc_util_ratio", doc="DCGM_FI_DEV_ENC_UTIL / 100"),
    _f("dec_util_ratio", doc="DCGM_FI_DEV_DEC_UTIL / 100"),
    _f("gr_engine_active_ratio", doc="DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    _f("sm_active_ratio", doc="DCGM_FI_PROF_SM_ACTIVE"),
    _f("sm_occupancy_ratio", doc="DCGM_FI_PROF_SM_OCCUPANCY"),
    _f("tensor_active_ratio", doc="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    _f("fp64_active_ratio", doc="DCGM_FI_PROF_PIPE_FP64_ACTIVE"),
    _f("fp32_active_ratio", doc="DCGM_FI_PROF_PIPE_FP32_ACTIVE"),
    _f("fp16_active_ratio", doc="DCGM_FI_PROF_PIPE_FP16_ACTIVE"),
    _f("dram_active_ratio", doc="DCGM_FI_PROF_DRAM_ACTIVE"),
    _f("fb_used_bytes", pl.Int64, doc="DCGM_FI_DEV_FB_USED (MiB) * 2**20"),
    _f("fb_free_bytes", pl.Int64, doc="DCGM_FI_DEV_FB_FREE (MiB) * 2**20"),
    _f("fb_reserved_bytes", pl.Int64, doc="DCGM_FI_DEV_FB_RESERVED (MiB) * 2**20"),
    _f("power_w", doc="DCGM_FI_DEV_POWER_USAGE"),
    _f("energy_j", doc="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ) / 1000; counter since boot"),
    _f("temp_c", doc="DCGM_FI_DEV_GPU_TEMP"),
    _f("mem_temp_c", doc="DCGM_FI_DEV_MEMORY_TEMP"),
    _f("sm_clock_mhz", doc="DCGM_FI_DEV_SM_CLOCK"),
    _f("mem_clock_mhz", doc="DCGM_FI_DEV_MEM_CLOCK"),
    _f("pcie_tx_bytes_per_s", doc="DCGM_FI_PROF_PCIE_TX_BYTES"),
    _f("pcie_rx_bytes_per_s", doc="DCGM_FI_PROF_PCIE_RX_BYTES"),
    _f("nvlink_tx_bytes_per_s", doc="DCGM_FI_PROF_NVLINK_TX_BYTES"),
    _f("nvlink_rx_bytes_per_s", doc="DCGM_FI_PROF_NVLINK_RX_BYTES"),
    _f("pcie_replay_total", pl.Int64, doc="DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
    _f("xid_last", pl.Int64, doc="DCGM_FI_DEV_XID_ERRORS: value of the last XID seen"),
    _f("ecc_sbe_volatile_total", pl.Int64, doc="DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
    _f("ecc_dbe_volatile_total", pl.Int64, doc="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    _f("ecc_sbe_aggregate_total", pl.Int64, doc="DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
    _f("ecc_dbe_aggregate_total", pl.Int64, doc="DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
    _f("retired_sbe_total", pl.Int64, doc="DCGM_FI_DEV_RETIRED_SBE"),
    _f("retired_dbe_total", pl.Int64, doc="DCGM_FI_DEV_RETIRED_DBE"),
    _f("retired_pending_total", pl.Int64, doc="DCGM_FI_DEV_RETIRED_PENDING"),
    _f("remap_correctable_total", pl.Int64, doc="DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
    _f("remap_uncorrectable_total", pl.Int64, doc="DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
    _f("remap_failure", pl.Int64, doc="DCGM_FI_DEV_ROW_REMAP_FAILURE (0/1)"),
    _f("remap_pending", pl.Int64, doc="DCGM_FI_DEV_ROW_REMAP_PENDING (0/1)"),
    _f("power_violation_s", doc="DCGM_FI_DEV_POWER_VIOLATION (ns) / 1e9; counter"),
    _f("thermal_violation_s", doc="DCGM_FI_DEV_THERMAL_VIOLATION (ns) / 1e9; counter"),
    _f("clock_event_reasons", pl.Int64, doc="DCGM_FI_DEV_CLOCKS_EVENT_REASONS bitmask"),
)

# DCGM field name -> (gpu_sample column, factor to SI). One table for every source that carries DCGM
# names: dcgm-exporter text, and the same series forwarded over OTLP by an OpenTelemetry Collector.
# Units from DCGM's field documentation (dcgm_fields.h): MiB, mJ, percent, ns.
DCGM_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_ratio", 0.01),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_copy_util_ratio", 0.01),
    "DCGM_FI_DEV_ENC_UTIL": ("enc_util_ratio", 0.01),
    "DCGM_FI_DEV_DEC_UTIL": ("dec_util_ratio", 0.01),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active_ratio", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active_ratio", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("fp64_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("fp32_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("fp16_active_ratio", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active_ratio", 1.0),
    "DCGM_FI_DEV_FB_USED": ("fb_used_bytes", 2.0**20),
    "DCGM_FI_DEV_FB_FREE": ("fb_free_bytes", 2.0**20),
    "DCGM_FI_DEV_FB_RESERVED": ("fb_reserved_bytes", 2.0**20),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", 1e-3),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_MEMORY_TEMP": ("mem_temp_c", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_bytes_per_s", 1.0),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replay_total", 1.0),
    "DCGM_FI_DEV_XID_ERRORS": ("xid_last", 1.0),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_sbe_volatile_total", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_dbe_volatile_total", 1.0),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_sbe_aggregate_total", 1.0),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_dbe_aggregate_total", 1.0),
    "DCGM_FI_DEV_RETIRED_SBE": ("retired_sbe_total", 1.0),
    "DCGM_FI_DEV_RETIRED_DBE": ("retired_dbe_total", 1.0),
    "DCGM_FI_DEV_RETIRED_PENDING": ("retired_pending_total", 1.0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remap_correctable_total", 1.0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remap_uncorrectable_total", 1.0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remap_failure", 1.0),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remap_pending", 1.0),
    "DCGM_FI_DEV_POWER_VIOLATION": ("power_violation_s", 1e-9),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("thermal_violation_s", 1e-9),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clock_event_reasons", 1.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("clock_event_reasons", 1.0),  # the pre-3.2 name of the same field
}

# ECC / row-remap counters that raise a health event when above zero: (gpu_sample column, kind, DCGM field
# id used as the event's code, DCGM field name). Field ids from dcgm_fields.h.
DCGM_HEALTH_COUNTERS: tuple[tuple[str, str, int, str], ...] = (
    ("ecc_sbe_volatile_total", "ecc", 310, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
    ("ecc_dbe_volatile_total", "ecc", 311, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    ("ecc_sbe_aggregate_total", "ecc", 312, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
    ("ecc_dbe_aggregate_total", "ecc", 313, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
    ("remap_uncorrectable_total", "row_remap", 393, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
    ("remap_failure", "row_remap", 395, "DCGM_FI_DEV_ROW_REMAP_FAILURE"),
    ("remap_pending", "row_remap", 396, "DCGM_FI_DEV_ROW_REMAP_PENDING"),
)

# dcgm-exporter's own pod: on idle GPUs a Prometheus scrape without honorLabels shows the exporter pod in the
# pod/container labels. A name containing this is that exporter, never a workload.
EXPORTER_POD_MARK = "dcgm-exporter"


def dcgm_health_events(gpu_sample: pl.DataFrame, inventory: pl.DataFrame, *, source: str) -> pl.DataFrame | None:
    """Health events a GPU sample carries: XID (``xid_last`` nonzero, code = the XID), ECC and row-remap
    counters above zero (``DCGM_HEALTH_COUNTERS``). ``inventory`` has ``gpu_uuid``, ``host`` and optionally
    ``err_msg`` (dcgm-exporter's XID text). Shared by every source that carries DCGM fields (the exporter's
    text and the same series over OTLP), so a fault reads the same whichever way it arrived."""
    if gpu_sample is None or not gpu_sample.height:
        return None
    parts = []
    if "xid_last" in gpu_sample.columns:
        xid = gpu_sample.filter(pl.col("xid_last").is_not_null() & (pl.col("xid_last") != 0))
        if xid.height:
            if "err_msg" in inventory.columns:
                xid = xid.join(inventory.select("gpu_uuid", "err_msg"), on="gpu_uuid", how="left")
            else:
                xid = xid.with_columns(err_msg=pl.lit(None, pl.String))
            parts.append(
                xid.select(
                    "ts",
                    "gpu_uuid",
                    kind=pl.lit("xid"),
                    code=pl.col("xid_last").cast(pl.Int64),
                    value=pl.col("xid_last").cast(pl.Float64),
                    message=pl.concat_str(
                        [pl.lit("XID "), pl.col("xid_last").cast(pl.Int64).cast(pl.String), pl.lit(": ") + pl.col("err_msg")],
                        ignore_nulls=True,
                    ),
                )
            )
    for col, kind, fid, field_name in DCGM_HEALTH_COUNTERS:
        if col not in gpu_sample.columns:
            continue
        hit = gpu_sample.filter(pl.col(col).is_not_null() & (pl.col(col) > 0))
        if hit.height:
            parts.append(
                hit.select(
                    "ts",
                    "gpu_uuid",
                    kind=pl.lit(kind),
                    code=pl.lit(fid, pl.Int64),
                    value=pl.col(col).cast(pl.Float64),
                    message=pl.lit(f"{field_name}=") + pl.col(col).cast(pl.Int64).cast(pl.String),
                )
            )
    if not parts:
        return None
    ev = (
        pl.concat(parts)
        .join(inventory.select("gpu_uuid", "host").unique("gpu_uuid", keep="first", maintain_order=True), on="gpu_uuid", how="left")
        .with_columns(host=pl.col("host").fill_null(""), source=pl.lit(source))
    )
    return ev.select([pl.col(c.name).cast(c.dtype) for c in HEALTH_EVENT.columns]).sort("ts", "gpu_uuid", "kind", "code")


GPU_SAMPLE = FrameSpec(
    "gpu_sample",
    (_k("ts", UTC_US), _k("gpu_uuid", pl.String), *GPU_FIELDS),
    on_conflict="fill",
    doc="One GPU at one instant (wide).",
)

METRIC_SAMPLE = FrameSpec(
    "metric_sample",
    (
        _k("ts", UTC_US),
        _k("series", pl.String, doc='canonical series key: name{label="value",...}, labels sorted'),
        _r("value", pl.Float64),
    ),
    doc="Any other numeric series (facility power, node CPU power, switch counters).",
)

COLLECTIVE = FrameSpec(
    "collective",
    (
        _k("job_id", pl.String),
        _k("rank", pl.Int64),
        _k("comm_id", pl.String),
        _k("seq", pl.Int64, doc="per-communicator sequence number (NCCL opCount)"),
        # op and peer are in the key: NCCL numbers p2p operations apart from collectives, and grouped
        # Send/Recv calls share one opCount.
        _k("op", pl.String),
        _k("peer", pl.Int64, default=-1, doc="peer rank of a Send/Recv; -1 for a collective"),
        _f("bytes", pl.Int64),
        _f("nranks", pl.Int64),
        _f("start", UTC_US),
        _f("duration_s"),
        _f("algbw_gbps", doc="algorithm bandwidth in GB/s (1e9 bytes/s, as NCCL and nccl-tests report)"),
        _f("busbw_gbps", doc="bus bandwidth in GB/s (1e9 bytes/s): algbw scaled by the collective's factor"),
        _f("algo", pl.String),
        _f("proto", pl.String),
        _f("dtype", pl.String),
        _f("host", pl.String),
        _f("gpu_uuid", pl.String),
    ),
    doc="One NCCL collective or p2p operation on one rank.",
)

STEP = FrameSpec(
    "step",
    (
        _k("job_id", pl.String),
        _k("rank", pl.Int64),
        _k("step", pl.Int64),
        _k("start", UTC_US, doc="a step re-run after a restart is a new row"),
        _r("end", UTC_US),
        _f("compute_s"),
        _f("comm_s"),
        _f("comm_overlap_s"),
        _f("idle_s"),
        _f("tokens", pl.Int64),
        _f("model_flops"),
    ),
    doc="One training step on one rank, with its breakdown.",
)

JOB_OP = FrameSpec(
    "job_op",
    (
        _k("job_id", pl.String),
        _k("step", pl.Int64),
        _k("rank", pl.Int64),
        _k("optype", pl.String, doc="forward/backward-compute, forward/backward-send/recv, a data-parallel collective, optimizer, gc"),
        _k("seq_id", pl.Int64, doc="numbers the ops of one type on one worker in one step"),
        _r("ts", UTC_US, doc="when the trace was received: the ops carry only step-relative times"),
        _f("dp_rank", pl.Int64),
        _f("stage", pl.Int64, doc="pipeline stage"),
        _f("start_s", doc="seconds from the start of the step"),
        _f("duration_s"),
        _f("mb_id", pl.Int64, doc="micro-batch of a compute op; -1 otherwise"),
        _f("gmc", pl.Int64, doc="global model chunk"),
        _f("mc", pl.Int64, doc="model chunk on this stage"),
    ),
    doc="One recorded operation of one worker in one training step (the input of the straggler what-if).",
)

JOB_LIFECYCLE_KINDS = (
    "allocated",
    "started",
    "initialized",
    "step",
    "checkpoint_save_start",
    "checkpoint_save_end",
    "checkpoint_restore_start",
    "checkpoint_restore_end",
    "failure",
    "preempted",
    "restart",
    "finished",
)
# Records about a job that are not part of its lifecycle: they may arrive long after the job ended (a
# suspect step replayed during an investigation), so lifecycle analyses (goodput, MTBF spans) skip them.
JOB_RECORD_KINDS = ("sdc_rerun",)
JOB_EVENT_KINDS = JOB_LIFECYCLE_KINDS + JOB_RECORD_KINDS

JOB_EVENT = FrameSpec(
    "job_event",
    (
        _k("job_id", pl.String),
        _k("ts", UTC_US),
        _k("kind", pl.String, doc="one of JOB_EVENT_KINDS"),
        _k("rank", pl.Int64, default=-1, doc="-1 for a job-level event"),
        _f("step", pl.Int64),
        _f("payload", pl.String, doc="JSON object: cause, tokens, loss, grad_norm, checksum, ..."),
    ),
    doc="A job lifecycle event.",
)

HEALTH_EVENT = FrameSpec(
    "health_event",
    (
        _k("ts", UTC_US),
        _k("host", pl.String, default=""),
        _k("gpu_uuid", pl.String, default="", doc='"" for a host-level event'),
        _k("kind", pl.String, doc="xid, ecc, row_remap, nvlink, thermal, power, sdc, nccl_warn, ..."),
        _k("code", pl.Int64, default=0),
        _f("value"),
        _f("message", pl.String),
        _f("source", pl.String),
    ),
    doc="XID, ECC, row remap, NVLink error, throttle, SDC suspicion.",
)

GPU_WORKLOAD = FrameSpec(
    "gpu_workload",
    (
        _k("ts", UTC_US),
        _k("gpu_uuid", pl.String),
        _f("namespace", pl.String),
        _f("pod", pl.String),
        _f("container", pl.String),
    ),
    doc="Which Kubernetes workload held a GPU at an instant (dcgm-exporter's pod attribution).",
)

NCCL_TEST = FrameSpec(
    "nccl_test",
    (
        _k("run_id", pl.String, doc="stable id of one nccl-tests invocation (hash of its output)"),
        _k("op", pl.String, doc="all_reduce, all_gather, ..."),
        _k("size_bytes", pl.Int64),
        _k("in_place", pl.Boolean),
        _f("ts", UTC_US),
        _f("nranks", pl.Int64),
        _f("count", pl.Int64),
        _f("dtype", pl.String),
        _f("redop", pl.String),
        _f("root", pl.Int64),
        _f("time_s"),
        _f("algbw_gbps", doc="GB/s (1e9 bytes/s)"),
        _f("busbw_gbps", doc="GB/s (1e9 bytes/s)"),
        _f("wrong", pl.Int64),
        _f("hosts", pl.String, doc="comma-separated hosts of the run"),
    ),
    doc="One row of an nccl-tests result table: a fabric benchmark measurement.",
)

# --- fabric (InfiniBand / RoCE) --------------------------------------------------------------

# Port counters as the IBTA PortCounters / PortCountersExtended attributes define them (InfiniBand
# Architecture Specification vol. 1, ch. 16.1.3), data counters converted from 4-octet words to bytes.
# Every counter is cumulative; the analyzer takes deltas (ingest never subtracts).
FABRIC_COUNTERS: tuple[Col, ...] = (
    _f("xmit_bytes_total", pl.Int64, doc="PortXmitData x 4 (the counter is in 4-octet words)"),
    _f("rcv_bytes_total", pl.Int64, doc="PortRcvData x 4"),
    _f("xmit_packets_total", pl.Int64, doc="PortXmitPkts"),
    _f("rcv_packets_total", pl.Int64, doc="PortRcvPkts"),
    _f("unicast_xmit_packets_total", pl.Int64, doc="PortUnicastXmitPkts"),
    _f("unicast_rcv_packets_total", pl.Int64, doc="PortUnicastRcvPkts"),
    _f("multicast_xmit_packets_total", pl.Int64, doc="PortMulticastXmitPkts"),
    _f("multicast_rcv_packets_total", pl.Int64, doc="PortMulticastRcvPkts"),
    _f("symbol_errors_total", pl.Int64, doc="SymbolErrorCounter (16 bits in PortCounters)"),
    _f("link_error_recovery_total", pl.Int64, doc="LinkErrorRecoveryCounter (8 bits)"),
    _f("link_downed_total", pl.Int64, doc="LinkDownedCounter (8 bits)"),
    _f("rcv_errors_total", pl.Int64, doc="PortRcvErrors"),
    _f("rcv_remote_physical_errors_total", pl.Int64, doc="PortRcvRemotePhysicalErrors"),
    _f("rcv_switch_relay_errors_total", pl.Int64, doc="PortRcvSwitchRelayErrors"),
    _f("xmit_discards_total", pl.Int64, doc="PortXmitDiscards"),
    _f("rcv_discards_total", pl.Int64, doc="port_rcv_discards (mlx4 sysfs)"),
    _f("xmit_constraint_errors_total", pl.Int64, doc="PortXmitConstraintErrors"),
    _f("rcv_constraint_errors_total", pl.Int64, doc="PortRcvConstraintErrors"),
    _f("local_link_integrity_errors_total", pl.Int64, doc="LocalLinkIntegrityErrors"),
    _f("excessive_buffer_overrun_errors_total", pl.Int64, doc="ExcessiveBufferOverrunErrors"),
    _f("vl15_dropped_total", pl.Int64, doc="VL15Dropped"),
    _f("qp1_dropped_total", pl.Int64, doc="QP1Dropped"),
    _f("xmit_wait_total", pl.Int64, doc="PortXmitWait: ticks with data to send but none sent (32 bits in PortCounters)"),
    _f("rcv_local_physical_errors_total", pl.Int64, doc="PortRcvErrorDetails: PortLocalPhysicalErrors"),
    _f("rcv_malformed_packet_errors_total", pl.Int64, doc="PortRcvErrorDetails: PortMalformedPktErrors"),
    _f("rcv_buffer_overrun_errors_total", pl.Int64, doc="PortRcvErrorDetails: PortBufferOverrunErrors"),
    _f("rcv_dlid_mapping_errors_total", pl.Int64, doc="PortRcvErrorDetails: PortDLIDMappingErrors"),
    _f("rcv_vl_mapping_errors_total", pl.Int64, doc="PortRcvErrorDetails: PortVLMappingErrors"),
    _f("rcv_looping_errors_total", pl.Int64, doc="PortRcvErrorDetails: PortLoopingErrors"),
    # RDMA hw_counters of mlx5 (sysfs ports/N/hw_counters), for RoCE and IB alike
    _f("roce_adp_retrans_total", pl.Int64, doc="hw_counters/roce_adp_retrans"),
    _f("roce_adp_retrans_to_total", pl.Int64, doc="hw_counters/roce_adp_retrans_to"),
    _f("roce_slow_restart_total", pl.Int64, doc="hw_counters/roce_slow_restart"),
    _f("roce_slow_restart_cnps_total", pl.Int64, doc="hw_counters/roce_slow_restart_cnps"),
    _f("out_of_buffer_total", pl.Int64, doc="hw_counters/out_of_buffer: packets dropped for lack of receive WQEs"),
    _f("out_of_sequence_total", pl.Int64, doc="hw_counters/out_of_sequence"),
    _f("packet_seq_err_total", pl.Int64, doc="hw_counters/packet_seq_err"),
    _f("local_ack_timeout_err_total", pl.Int64, doc="hw_counters/local_ack_timeout_err"),
    _f("rnr_nak_retry_err_total", pl.Int64, doc="hw_counters/rnr_nak_retry_err"),
    _f("implied_nak_seq_err_total", pl.Int64, doc="hw_counters/implied_nak_seq_err"),
    _f("duplicate_request_total", pl.Int64, doc="hw_counters/duplicate_request"),
    _f("req_cqe_error_total", pl.Int64, doc="hw_counters/req_cqe_error"),
    _f("resp_cqe_error_total", pl.Int64, doc="hw_counters/resp_cqe_error"),
    _f("np_cnp_sent_total", pl.Int64, doc="hw_counters/np_cnp_sent (RoCE congestion notifications sent)"),
    _f("rp_cnp_handled_total", pl.Int64, doc="hw_counters/rp_cnp_handled"),
    _f("np_ecn_marked_roce_packets_total", pl.Int64, doc="hw_counters/np_ecn_marked_roce_packets"),
)

FABRIC_PORT_SAMPLE = FrameSpec(
    "fabric_port_sample",
    (
        _k("ts", UTC_US),
        _k("node", pl.String, doc="the host for host-side readers (sysfs, node_exporter), the node GUID 0x... "
                                  "for fabric-side ones (perfquery by GUID), lid:<n> when only the LID is known"),
        _k("device", pl.String, default="", doc="HCA name (mlx5_0); empty for fabric-side readers"),
        _k("port", pl.Int64),
        _f("host", pl.String),
        _f("node_guid", pl.String, doc="0x-prefixed, 16 hex digits"),
        _f("lid", pl.Int64),
        _f("link_layer", pl.String, doc="InfiniBand or Ethernet (RoCE)"),
        _f("state", pl.String, doc="ACTIVE, DOWN, INIT, ARMED, ..."),
        _f("phys_state", pl.String, doc="LinkUp, Polling, Disabled, ..."),
        _f("width", pl.String, doc="lanes: 1X, 2X, 4X, 8X, 12X"),
        _f("speed", pl.String, doc="SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR"),
        _f("rate_gbps", doc="the port's data rate in Gb/s (1e9 bit/s), e.g. 200 for 4X HDR"),
        *FABRIC_COUNTERS,
        _f("source", pl.String),
    ),
    on_conflict="fill",
    doc="One InfiniBand/RoCE port at one instant: cumulative counters, width, speed and state.",
)

FABRIC_LINK = FrameSpec(
    "fabric_link",
    (
        _k("a_node", pl.String, doc="node GUID (0x...) of end A, or the host name of a placement row"),
        _k("a_port", pl.Int64, default=0),
        _f("a_kind", pl.String, doc="CA (HCA), SW (switch), or host (a placement row from node features)"),
        _f("a_desc", pl.String, doc="node description, trimmed"),
        _f("a_lid", pl.Int64),
        _f("a_host", pl.String, doc="the host of an HCA end (first word of its description)"),
        _f("b_node", pl.String, doc="node GUID of end B; null for an unconnected port"),
        _f("b_port", pl.Int64),
        _f("b_kind", pl.String),
        _f("b_desc", pl.String),
        _f("b_lid", pl.Int64),
        _f("b_host", pl.String),
        _f("width", pl.String, doc="lanes: 1X, 4X, ..."),
        _f("speed", pl.String, doc="SDR ... XDR"),
        _f("rate_gbps", doc="width x per-lane data rate, Gb/s"),
        _f("connected", pl.Boolean, doc="false for a port with no peer (not a slow link)"),
        _f("island", pl.String, doc="IB island / spine group of a placement row"),
        _f("observed_at", UTC_US),
        _f("source", pl.String),
    ),
    on_conflict="update",
    doc="Fabric topology: one row per link (listed once, HCA end first), per unconnected port, or per host-to-leaf placement.",
)

FABRIC_GPU_NIC = FrameSpec(
    "fabric_gpu_nic",
    (
        _k("host", pl.String, default="", doc="empty for a topology that describes a machine type, not one host"),
        _k("gpu_bus_id", pl.String),
        _k("nic_bus_id", pl.String),
        _f("path", pl.String, doc="PIX (same PCIe switch), NODE (same NUMA node), SYS (across NUMA nodes)"),
        _f("pcie_switch", pl.String, doc="bus id of the shared PCIe switch (PIX)"),
        _f("numa_node", pl.Int64),
        _f("link_gts", doc="PCIe link speed of the GPU, GT/s"),
        _f("link_width", pl.Int64, doc="PCIe lanes of the GPU"),
        _f("source", pl.String),
    ),
    on_conflict="update",
    doc="Which NIC each GPU reaches best over PCIe (NCCL topology), one row per nearest GPU-NIC pair.",
)

FABRIC_FRAMES = (FABRIC_PORT_SAMPLE, FABRIC_LINK, FABRIC_GPU_NIC)

# --- inventory ------------------------------------------------------------------------------

SITE = FrameSpec(
    "site",
    (
        _k("site_id", pl.String),
        _f("name", pl.String),
        _f("country", pl.String, doc="ISO 3166-1 alpha-3"),
        _f("grid_region", pl.String),
        _f("declared_pue", pl.Float64),
        _f("timezone", pl.String),
    ),
    on_conflict="update",
)

HOST = FrameSpec(
    "host",
    (
        _k("host", pl.String),
        _f("site_id", pl.String),
        _f("rack", pl.String),
        _f("cpu_model", pl.String),
    ),
    on_conflict="update",
)

GPU = FrameSpec(
    "gpu",
    (
        _k("gpu_uuid", pl.String),
        _f("host", pl.String),
        _f("gpu_index", pl.Int64),
        _f("pci_bus_id", pl.String),
        _f("model_name", pl.String),
        _f("mig_profile", pl.String),
        _f("mig_instance_id", pl.Int64),
        _f("driver_version", pl.String),
    ),
    on_conflict="update",
)

JOB = FrameSpec(
    "job",
    (
        _k("job_id", pl.String),
        _f("name", pl.String),
        _f("kind", pl.String, doc="training or inference"),
        _f("model_name", pl.String),
        _f("world_size", pl.Int64),
        _f("site_id", pl.String),
        _f("owner", pl.String),
        _f("submitted_at", UTC_US),
        _f("started_at", UTC_US),
        _f("ended_at", UTC_US),
        _f("status", pl.String),
    ),
    on_conflict="update",
)

JOB_RANK = FrameSpec(
    "job_rank",
    (
        _k("job_id", pl.String),
        _k("rank", pl.Int64),
        _k("start", UTC_US),
        _f("end", UTC_US, doc="null while the rank still runs there"),
        _r("gpu_uuid", pl.String),
        _f("host", pl.String),
    ),
    on_conflict="update",
    doc="Which rank ran on which GPU when.",
)

FINDING = FrameSpec(
    "finding",
    (
        _k("analyzer", pl.String),
        _k("kind", pl.String),
        _k("subject", pl.String, doc="what it is about: gpu:<uuid>, host:<name>, job:<id>/rank:<n>, ..."),
        _k("window_start", UTC_US),
        _f("window_end", UTC_US),
        _r("severity", pl.String, doc="info, warning or critical"),
        _f("score", pl.Float64),
        _f("summary", pl.String),
        _f("evidence", pl.String, doc="JSON object"),
    ),
    on_conflict="update",
    doc="What an analyzer concluded; re-running it over the same window updates, never duplicates.",
)

# --- analysis results --------------------------------------------------------------------------

STEP_BREAKDOWN = FrameSpec(
    "step_breakdown",
    (
        _k("job_id", pl.String),
        _k("rank", pl.Int64),
        _k("step", pl.Int64),
        _k("start", UTC_US),
        _r("step_s", pl.Float64),
        _f("c1_compute_s", doc="C1: compute"),
        _f("c2_comm_s", doc="C2: exposed communication (transfer)"),
        _f("c3_coord_s", doc="C3: coordination (idle plus waiting for peers)"),
        _f("overlap_s"),
        _f("exposed_comm_s"),
        _f("wait_ratio"),
        _f("f_compute", doc="C1 / step_s"),
    ),
    on_conflict="update",
    doc="The C3 breakdown of one rank's step (analyzers.c3.c3_breakdown); C1 + C2 + C3 = step_s.",
)

GPU_ENERGY_MINUTE = FrameSpec(
    "gpu_energy_minute",
    (
        _k("minute", UTC_US, doc="start of the UTC minute"),
        _k("gpu_uuid", pl.String),
        _f("energy_j", doc="counter_energy_j + integrated_energy_j"),
        _f("counter_energy_j", doc="part from the cumulative energy counter"),
        _f("integrated_energy_j", doc="part from trapezoid integration of power_w"),
        _f("covered_s", doc="seconds of the minute with energy data"),
        _f("method", pl.String, doc="counter, power_integration or counter+power_integration"),
    ),
    on_conflict="update",
    doc="Per-minute per-GPU energy roll-up (analyzers.energy.energy_rollup); a window's roll-up is rewritten idempotently.",
)

JOB_ANALYSIS = FrameSpec(
    "job_analysis",
    (
        _k("job_id", pl.String),
        _k("analyzer", pl.String, doc="c3, goodput, stragglers, ..."),
        _r("computed_at", UTC_US),
        _f("window_start", UTC_US),
        _f("window_end", UTC_US),
        _r("result", pl.String, doc="JSON object: the analyzer's per-job summary"),
    ),
    on_conflict="update",
    doc="The latest per-job summary of each analyzer.",
)

# Contractual instruments for market-based Scope 2 (GHG Protocol Scope 2 Guidance, 2015, ch. 7). Not a
# telemetry frame: recorded one at a time through the admin API or the CLI, which check them
# (analyzers.carbon.check_instrument) before they are stored, so it is kept out of FRAMES and /batches.
ENERGY_INSTRUMENT = FrameSpec(
    "energy_instrument",
    (
        _k("instrument_id", pl.String, doc="contract or certificate id (PPA contract, REC / GO serial range, supplier tariff); claimed by one site only"),
        _r("site_id", pl.String),
        _r("kind", pl.String, doc="ppa, virtual_ppa, rec, go, i_rec, green_tariff or supplier_specific"),
        _r("start", UTC_US, doc="start of the consumption period the instrument applies to"),
        _r("end", UTC_US, doc="end of that period (exclusive)"),
        _r("volume_mwh", pl.Float64, doc="electricity the instrument conveys over [start, end), MWh"),
        _r("g_per_kwh", pl.Float64, doc="its emission factor, gCO2e/kWh (0 for renewable PPAs and certificates)"),
        _f("supplier", pl.String, doc="supplier, generator or issuing registry"),
        _r("recorded_at", UTC_US),
        _f("recorded_by", pl.String, doc="the token or CLI user that recorded it"),
    ),
    on_conflict="update",
    doc="Contractual instruments (PPAs, certificates, supplier-specific rates) per site and period, for market-based Scope 2.",
)

SITE_ENERGY_MINUTE = FrameSpec(
    "site_energy_minute",
    (
        _k("minute", UTC_US, doc="start of the UTC minute"),
        _k("site_id", pl.String),
        _f("energy_j", doc="GPU energy of the site's GPUs in that minute (sum of gpu_energy_minute)"),
        _f("gpus", pl.Int64, doc="GPUs with a roll-up row in that minute"),
    ),
    on_conflict="update",
    doc=("Per-minute per-site GPU energy, written with the per-GPU roll-up: a site's energy and carbon over any "
         "period reads one row per minute instead of one per GPU-minute."),
)

JOB_ENERGY_MINUTE = FrameSpec(
    "job_energy_minute",
    (
        _k("minute", UTC_US, doc="start of the UTC minute"),
        _k("job_id", pl.String),
        _k("site_id", pl.String, doc="site of the GPUs; empty where the inventory places them at no site"),
        _f("energy_j", doc="the job's share of its GPUs' energy in that minute (analyzers.energy.attribute_to_jobs)"),
        _f("covered_s", doc="GPU-seconds of the job's share with energy data"),
        _f("allocated_s", doc="GPU-seconds the job held in that minute"),
        _f("gpus", pl.Int64, doc="GPUs the job held in that minute"),
    ),
    on_conflict="update",
    doc=("Per-minute per-job GPU energy by site, written with the per-GPU roll-up from the rank-to-GPU "
         "assignments known then: a job's energy over any period reads one row per minute and site."),
)

ENERGY_FRAMES: dict[str, FrameSpec] = {
    ENERGY_INSTRUMENT.name: ENERGY_INSTRUMENT, SITE_ENERGY_MINUTE.name: SITE_ENERGY_MINUTE, JOB_ENERGY_MINUTE.name: JOB_ENERGY_MINUTE,
}

# Order matters: inventory before the facts that point at it.
FRAMES: dict[str, FrameSpec] = {
    s.name: s
    for s in (
        SITE,
        HOST,
        GPU,
        JOB,
        JOB_RANK,
        GPU_SAMPLE,
        GPU_WORKLOAD,
        METRIC_SAMPLE,
        COLLECTIVE,
        STEP,
        JOB_OP,
        JOB_EVENT,
        HEALTH_EVENT,
        NCCL_TEST,
        FABRIC_LINK,
        FABRIC_GPU_NIC,
        FABRIC_PORT_SAMPLE,
        STEP_BREAKDOWN,
        GPU_ENERGY_MINUTE,
        JOB_ANALYSIS,
        FINDING,
    )
}


def series_key(name: str, labels: Mapping[str, str] | None = None) -> str:
    """The canonical series key ``name{a="1",b="2"}``: labels sorted, values escaped as Prometheus does."""
    if not labels:
        return name
    parts = []
    for k in sorted(labels):
        v = str(labels[k]).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
        parts.append(f'{k}="{v}"')
    return name + "{" + ",".join(parts) + "}"


_SERIES_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_series_key(key: str) -> tuple[str, dict[str, str]]:
    """The inverse of :func:`series_key`: ``name{a="1",b="2"}`` → (name, labels), values unescaped."""
    name, brace, rest = key.partition("{")
    labels: dict[str, str] = {}
    if brace:
        for m in _SERIES_LABEL.finditer(rest):
            labels[m.group(1)] = re.sub(r"\\(.)", lambda g: "\n" if g.group(1) == "n" else g.group(1), m.group(2))
    return name, labels


@dataclass
class Batch:
    """The unit ingest produces and the store writes in one transaction.

    Each field is a canonical frame or ``None``. ``source`` says where the data came from (a file
    path, an endpoint, an exporter URL) so errors and the audit trail can name it.
    """

    source: str = ""
    site: pl.DataFrame | None = None
    host: pl.DataFrame | None = None
    gpu: pl.DataFrame | None = None
    job: pl.DataFrame | None = None
    job_rank: pl.DataFrame | None = None
    gpu_sample: pl.DataFrame | None = None
    gpu_workload: pl.DataFrame | None = None
    metric_sample: pl.DataFrame | None = None
    collective: pl.DataFrame | None = None
    step: pl.DataFrame | None = None
    job_op: pl.DataFrame | None = None
    job_event: pl.DataFrame | None = None
    health_event: pl.DataFrame | None = None
    nccl_test: pl.DataFrame | None = None
    fabric_link: pl.DataFrame | None = None
    fabric_gpu_nic: pl.DataFrame | None = None
    fabric_port_sample: pl.DataFrame | None = None
    step_breakdown: pl.DataFrame | None = None
    gpu_energy_minute: pl.DataFrame | None = None
    job_analysis: pl.DataFrame | None = None
    finding: pl.DataFrame | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def frames(self) -> Iterator[tuple[FrameSpec, pl.DataFrame]]:
        """The non-empty frames, in write order (inventory first)."""
        for name, spec in FRAMES.items():
            df = getattr(self, name)
            if df is not None and df.height:
                yield spec, df

    def rows(self) -> dict[str, int]:
        return {spec.name: df.height for spec, df in self.frames()}

    def values(self) -> int:
        """Metric values carried: non-key fields of telemetry rows (a wide GPU row of 30 fields is 30)."""
        n = 0
        if self.gpu_sample is not None and self.gpu_sample.height:
            fields = [c.name for c in GPU_FIELDS if c.name in self.gpu_sample.columns]
            if fields:
                n += int(self.gpu_sample.select(pl.sum_horizontal(pl.col(fields).is_not_null())).sum().item() or 0)
        if self.metric_sample is not None:
            n += self.metric_sample.height
        return n

    def merge(self, other: Batch) -> Batch:
        """Concatenate another batch's frames into a new batch (diagonal: missing columns become null)."""
        out = dataclasses.replace(self, meta={**self.meta, **other.meta})
        for name in FRAMES:
            a, b = getattr(self, name), getattr(other, name)
            if a is None or b is None:
                setattr(out, name, a if b is None else b)
            else:
                setattr(out, name, pl.concat([a, b], how="diagonal_relaxed"))
        return out


def _first_bad(mask: pl.Series) -> int | None:
    if not mask.any():  # an aggregate is a fraction of arg_true's cost, and most checks find nothing
        return None
    idx = mask.arg_true()
    return int(idx[0]) if len(idx) else None


# Up to this many rows a text column is checked for NUL in Python: a polars string expression costs
# ~0.2 ms whatever its size, and a group commit's frames of a few hundred rows are checked per column.
_SMALL_ROWS = 4096


def _has_nul(s: pl.Series) -> int | None:
    """The first row whose text holds a NUL character, or None."""
    if s.null_count() == s.len():
        return None
    if s.len() <= _SMALL_ROWS:
        return next((i for i, v in enumerate(s.to_list()) if v and "\x00" in v), None)
    return _first_bad(s.str.contains("\x00", literal=True).fill_null(False))


def _first_nonfinite(s: pl.Series) -> int | None:
    """The first row holding NaN or an infinity, or None. A finite sum proves every value finite (an
    aggregate costs microseconds, ``is_finite`` a fraction of a millisecond); only a sum that is not
    finite (a bad value, or an overflow) looks row by row."""
    if s.null_count() == s.len():
        return None
    total = s.sum()
    if total is not None and math.isfinite(total):
        return None
    return _first_bad((s.is_not_null() & ~s.is_finite()).fill_null(False))


def _cast_column(spec: FrameSpec, col: Col, s: pl.Series) -> pl.Series:
    """Cast one column to its canonical dtype, or raise naming the first row that does not fit."""
    target = col.dtype
    if s.dtype == target:
        out = s
    elif target == UTC_US:
        if isinstance(s.dtype, pl.Datetime):
            out = s.dt.replace_time_zone("UTC") if s.dtype.time_zone is None else s.dt.convert_time_zone("UTC")
            out = out.dt.cast_time_unit("us")
        elif s.dtype == pl.String:
            out = s.str.to_datetime(time_unit="us", time_zone="UTC", strict=False)
        elif s.dtype == pl.Null:
            out = s.cast(target)
        else:
            raise ValidationError(f"expected a UTC timestamp, got a column of {s.dtype}", frame=spec.name, row=0, field=col.name)
    elif target == pl.String and s.dtype not in (pl.Null, pl.Categorical, pl.Enum) and not isinstance(s.dtype, (pl.Categorical, pl.Enum)):
        # Numbers silently turned into strings hide a column mix-up (a key read from the wrong field).
        raise ValidationError(f"expected text, got a column of {s.dtype}", frame=spec.name, row=0, field=col.name)
    elif target in (pl.Int64,) and s.dtype.is_float():
        # A float is an integer only where it has no fraction; 1.5 GPUs is a bad row, not 1.
        frac = s.is_not_null() & (s != s.round(0))
        bad = _first_bad(frac.fill_null(False) | (s.is_not_null() & ~s.is_finite()).fill_null(False))
        if bad is not None:
            raise ValidationError(f"{s[bad]!r} is not an integer", frame=spec.name, row=bad, field=col.name)
        out = s.cast(target, strict=False)
    else:
        out = s.cast(target, strict=False)
    # A cast that lost values (text that is no number or time) has more nulls than its input.
    if out is not s and s.dtype != pl.Null and out.null_count() != s.null_count():
        bad = _first_bad(s.is_not_null() & out.is_null())
        if bad is not None:
            want = "UTC timestamp (RFC 3339)" if target == UTC_US else str(target)
            raise ValidationError(f"{s[bad]!r} is not a valid {want}", frame=spec.name, row=bad, field=col.name)
    if target == pl.String and out.dtype == pl.String:
        # Neither database stores NUL in text (PostgreSQL refuses it mid-COPY); refuse it up front.
        bad = _has_nul(out)
        if bad is not None:
            raise ValidationError("text contains a NUL character", frame=spec.name, row=bad, field=col.name)
    if target == pl.Float64:
        bad = _first_nonfinite(out)
        if bad is not None:
            raise ValidationError(f"{out[bad]!r} is not a finite number", frame=spec.name, row=bad, field=col.name)
    return out


def require_columns(df: object, frame: str, cols: Iterable[str]) -> None:
    """The check an analyzer makes of its input: a polars frame (TypeError otherwise) holding ``cols``
    (ValidationError naming the frame and the first missing column)."""
    if not isinstance(df, pl.DataFrame):
        raise TypeError(f"{frame} must be a polars DataFrame, not {type(df).__name__}")
    for c in cols:
        if c not in df.columns:
            raise ValidationError("missing required column", frame=frame, field=c)


def findings_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Finding rows (dicts with the ``finding`` columns) as a conformed frame; the empty frame for none."""
    if not rows:
        return FINDING.empty()
    return conform(FINDING, pl.DataFrame(rows, schema_overrides={"window_start": UTC_US, "window_end": UTC_US}))


def conform(spec: FrameSpec, df: pl.DataFrame) -> pl.DataFrame:
    """Check ``df`` against ``spec`` and return it in canonical shape: every column, canonical dtypes,
    defaults filled, rows with a repeated natural key collapsed to one.

    Raises ``ValidationError`` naming the frame, the first bad row (0-based, in ``df``'s order) and the
    field: an unknown column, a value that does not cast, a non-finite float, a missing key.
    """
    unknown = [c for c in df.columns if c not in spec.schema]
    if unknown:
        raise ValidationError(f"unknown column (expected some of {', '.join(spec.names)})", frame=spec.name, field=unknown[0])
    out: dict[str, pl.Series] = {}
    for col in spec.columns:
        if col.name in df.columns:
            s = _cast_column(spec, col, df.get_column(col.name))
            if col.default is not None and s.null_count():
                s = s.fill_null(col.default)
        elif col.default is not None:
            s = pl.repeat(col.default, df.height, dtype=col.dtype, eager=True)
        elif col.required:
            raise ValidationError("missing required column", frame=spec.name, row=0 if df.height else None, field=col.name)
        else:
            s = pl.Series(col.name, [None] * df.height, dtype=col.dtype)
        if (not col.nullable or col.key) and s.null_count():
            bad = _first_bad(s.is_null())
            if bad is not None:
                raise ValidationError("missing value in a required field", frame=spec.name, row=bad, field=col.name)
        out[col.name] = s.alias(col.name)
    frame = pl.DataFrame(out)
    if spec.key and frame.height > 1:
        if spec.on_conflict == "fill":
            key = list(spec.key)
            if frame.select(pl.struct(key).is_duplicated().any()).item():
                frame = frame.group_by(key, maintain_order=True).agg(pl.exclude(key).drop_nulls().first()).select(frame.columns)
        else:
            keep = "last" if spec.on_conflict == "update" else "first"
            frame = frame.unique(subset=list(spec.key), keep=keep, maintain_order=True)
    return frame


def _json_type_ok(dtype: pl.DataType, value: Any) -> bool:
    if dtype == pl.String or dtype == UTC_US:
        return isinstance(value, str)
    if dtype == pl.Boolean:
        return isinstance(value, bool)
    if dtype == pl.Int64:
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if dtype == pl.Float64:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False


_JSON_TYPE_NAME = {pl.String: "a string", pl.Boolean: "true or false", pl.Int64: "an integer", pl.Float64: "a number"}


def from_records(spec: FrameSpec, records: list[Any]) -> pl.DataFrame:
    """Build a canonical frame from JSON-like records (a list of objects), checking each value's type.

    Raises ``ValidationError`` naming the first bad record (0-based) and field: a record that is not an
    object, an unknown field, or a value of the wrong JSON type (timestamps are RFC 3339 strings).
    The result still goes through ``conform`` on write.
    """
    columns: dict[str, list[Any]] = {}
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise ValidationError(f"expected an object, got {type(rec).__name__}", frame=spec.name, row=i)
        for k, v in rec.items():
            if k not in spec.schema:
                raise ValidationError(f"unknown field (expected some of {', '.join(spec.names)})", frame=spec.name, row=i, field=str(k)[:100])
            if v is not None and not _json_type_ok(spec.schema[k], v):
                want = "an RFC 3339 timestamp string" if spec.schema[k] == UTC_US else _JSON_TYPE_NAME.get(spec.schema[k], str(spec.schema[k]))
                raise ValidationError(f"{str(v)[:80]!r} is not {want}", frame=spec.name, row=i, field=k)
            if k not in columns:
                columns[k] = [None] * i
            columns[k].append(v)
        for k, col in columns.items():
            if len(col) < i + 1:
                col.append(None)
    data = {}
    for k, values in columns.items():
        dtype = spec.schema[k]
        src = pl.String if dtype == UTC_US else dtype
        data[k] = pl.Series(k, [float(v) if src == pl.Float64 and v is not None else v for v in values], dtype=src, strict=False)
    return pl.DataFrame(data, height=len(records)) if data else pl.DataFrame(height=len(records))


def batch_to_json(batch: Batch) -> dict[str, Any]:
    """The JSON body of POST /api/v1/batches for ``batch``."""
    return {"source": batch.source, "frames": {spec.name: json.loads(df.write_json()) for spec, df in batch.frames()}}
