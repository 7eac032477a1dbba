"""DCGM's field names in canonical terms: each field's ``gpu_sample`` column and factor to SI units, the
fault counters that raise health events, and the events a sample carries. Shared by every source that
carries DCGM names (dcgm-exporter text, the same series over OTLP or remote write) and by the store's
fault-counter de-duplication. Units and field ids from DCGM's ``dcgm_fields.h``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl

from fleetscope.core.frames import HEALTH_EVENT

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
    # In dcgm-exporter's default counters, so on every node: columns, not a series per GPU in metric_sample
    # (8 series and rows a node's push each, 16,384 rows a 16,384-GPU scrape).
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": ("vgpu_license_status", 1.0),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("nvlink_throughput_raw", 1.0),
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL": ("nvlink_throughput_raw", 1.0),  # the name of field 449 in newer DCGM releases
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


def health_event_rows(samples: Iterable[tuple[int, str, Mapping[str, Any]]], host_of: Mapping[str, str | None],
                      err_msg_of: Mapping[str, str | None], *, source: str) -> list[tuple[Any, ...]]:
    """:func:`dcgm_health_events` over plain rows, for the store's row writes (``Store.write_rows``): each sample is
    (ts in epoch microseconds, gpu_uuid, its fields by ``gpu_sample`` column, integer columns as ints); the events
    come back as rows in ``HEALTH_EVENT``'s column order, sorted as that function sorts them. ``host_of``: each
    GPU's host (its first inventory row's), ``err_msg_of`` its XID text, where the source has one."""
    out: list[tuple[Any, ...]] = []
    for ts, gpu, fields in samples:
        host = host_of.get(gpu) or ""
        xid = fields.get("xid_last")
        if xid:
            err = err_msg_of.get(gpu)
            out.append((ts, host, gpu, "xid", int(xid), float(xid), f"XID {int(xid)}" if err is None else f"XID {int(xid)}: {err}", source))
        for col, kind, fid, field_name in DCGM_HEALTH_COUNTERS:
            value = fields.get(col)
            if value is not None and value > 0:
                out.append((ts, host, gpu, kind, fid, float(value), f"{field_name}={int(value)}", source))
    return health_rows_in_order(out)


def health_rows_in_order(rows: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Health event rows (``HEALTH_EVENT``'s column order) sorted as :func:`dcgm_health_events` sorts its events:
    by time, GPU, kind and code."""
    return sorted(rows, key=lambda r: (r[0], r[2], r[3], r[4]))
