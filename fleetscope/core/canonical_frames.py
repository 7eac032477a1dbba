"""Canonical frames: one shape per kind of data, shared by ingest, store and analyzers.

Every source maps onto these frames and every analyzer reads them (see docs/ARCHITECTURE.md, "Canonical data").
Units are SI and carried in column names; times are UTC ``Datetime("us", "UTC")``. ``FRAMES`` lists them in
write order, the serving and scheduler frames (``core.serving_frames``, ``core.scheduler_frames``) included.

Pure: polars and the declarations of ``core.spec``, nothing of the database, HTTP or Celery, so that
``ingest`` and ``analyzers`` can depend on it. Readers import these names through ``core.frames``, beside
the ``Batch`` that carries them. ``fleetscope.store.schema`` builds the SQL tables from the same
definitions, so a column is declared exactly once.
"""

from __future__ import annotations

import polars as pl

from fleetscope.core.scheduler_frames import SCHEDULER_FRAMES
from fleetscope.core.serving_frames import SERVING_FRAMES
from fleetscope.core.spec import UTC_US, Col, FrameSpec, _f, _k, _r

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
    _f("vgpu_license_status", pl.Int64, doc="DCGM_FI_DEV_VGPU_LICENSE_STATUS, as exported (0 on a GPU that is not a licensed vGPU)"),
    # Raw: DCGM states no unit for field 449. dcgm-exporter's CSV types it a counter, newer DCGM releases rename it a
    # throughput, and users read it as B/s, KB/s or MB/s; the value is kept as exported until DCGM documents one.
    _f("nvlink_throughput_raw", doc="DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (field 449, NVLINK_THROUGHPUT_TOTAL in newer DCGM), as exported"),
)


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

DEVICE_UNION = FrameSpec(
    "device_union",
    (
        _k("job_id", pl.String),
        _k("rank", pl.Int64),
        _k("start", UTC_US, doc="the trace's first device event, rounded up to the µs: which of the rank's traces"),
        _k("window", pl.String, doc="HTA's event window: all, before_last_step (HTA's default) or through_last_step"),
        _r("events", pl.Int64, doc="device events the window keeps"),
        _r("span_us", pl.Float64, doc="HTA's kernel time: end of the last merged block minus start of the first"),
        _r("busy_us", pl.Float64, doc="union of the kept device events (kernel time minus idle)"),
        _r("compute_us", pl.Float64, doc="union of HTA's COMPUTATION kernels"),
        _r("comm_us", pl.Float64, doc="union of HTA's COMMUNICATION (NCCL) kernels"),
        _r("overlap_us", pl.Float64, doc="time a communication block and a computation block are both open"),
        _f("step_min", pl.Int64, doc="lowest N of the ProfilerStep#N the trace names; null when it names none"),
        _f("step_max", pl.Int64, doc="highest N of the ProfilerStep#N the trace names"),
    ),
    doc="One rank's device timeline in one Kineto trace over one of HTA's event windows, reduced to the unions "
        "HTA's temporal breakdown and communication/computation overlap are made of (fleetscope.core.kernels).",
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
        Col("minute", UTC_US, key=True, nullable=False, doc="start of the UTC minute", step_s=60),
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
        DEVICE_UNION,
        JOB_OP,
        JOB_EVENT,
        HEALTH_EVENT,
        NCCL_TEST,
        FABRIC_LINK,
        FABRIC_GPU_NIC,
        FABRIC_PORT_SAMPLE,
        *SERVING_FRAMES,
        *SCHEDULER_FRAMES,
        STEP_BREAKDOWN,
        GPU_ENERGY_MINUTE,
        JOB_ANALYSIS,
        FINDING,
    )
}
