"""What the InfiniBand readers share: link widths and speeds, port states, GUIDs, and the mapping of the
Linux sysfs counter files onto ``fabric_port_sample`` columns.

Link rate = lanes x per-lane data rate. The per-lane figures are the nominal ones the Linux RDMA core
prints in ``/sys/class/infiniband/<dev>/ports/<n>/rate`` (``drivers/infiniband/core/sysfs.c``,
``rate_show``: "100 Gb/sec (4X EDR)") and ``ibnetdiscover`` prints as ``4x EDR``: SDR 2.5, DDR 5,
QDR 10, FDR10 10, FDR 14, EDR 25, HDR 50, NDR 100, XDR 200 Gb/s, so 4X HDR is 200 Gb/s.

Port states follow the IBTA PortInfo attribute (vol. 1, 14.2.5.6): PortState 1 DOWN, 2 INIT, 3 ARMED,
4 ACTIVE, 5 ACTIVE_DEFER; PortPhysicalState 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining,
5 LinkUp, 6 LinkErrorRecovery, 7 Phy Test.

Pure: strings in, values out.
"""

from __future__ import annotations

import re

LANE_GBPS: dict[str, float] = {
    "SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0, "EDR": 25.0, "HDR": 50.0, "NDR": 100.0, "XDR": 200.0,
}
WIDTH_LANES: dict[str, int] = {"1X": 1, "2X": 2, "4X": 4, "8X": 8, "12X": 12}
PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATES = {0: "NoChange", 1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
               6: "LinkErrorRecovery", 7: "PhyTest"}

MAX_TEXT = 256  # longest value of one sysfs attribute or description we keep

# sysfs file (under ports/<n>/counters/) -> (column, multiplier). port_*_data counts 4-octet words.
SYSFS_COUNTERS: dict[str, tuple[str, int]] = {
    "port_xmit_data": ("xmit_bytes_total", 4),
    "port_rcv_data": ("rcv_bytes_total", 4),
    "port_xmit_packets": ("xmit_packets_total", 1),
    "port_rcv_packets": ("rcv_packets_total", 1),
    "unicast_xmit_packets": ("unicast_xmit_packets_total", 1),
    "unicast_rcv_packets": ("unicast_rcv_packets_total", 1),
    "multicast_xmit_packets": ("multicast_xmit_packets_total", 1),
    "multicast_rcv_packets": ("multicast_rcv_packets_total", 1),
    "symbol_error": ("symbol_errors_total", 1),
    "link_error_recovery": ("link_error_recovery_total", 1),
    "link_downed": ("link_downed_total", 1),
    "port_rcv_errors": ("rcv_errors_total", 1),
    "port_rcv_remote_physical_errors": ("rcv_remote_physical_errors_total", 1),
    "port_rcv_switch_relay_errors": ("rcv_switch_relay_errors_total", 1),
    "port_xmit_discards": ("xmit_discards_total", 1),
    "port_rcv_discards": ("rcv_discards_total", 1),
    "port_xmit_constraint_errors": ("xmit_constraint_errors_total", 1),
    "port_rcv_constraint_errors": ("rcv_constraint_errors_total", 1),
    "local_link_integrity_errors": ("local_link_integrity_errors_total", 1),
    "excessive_buffer_overrun_errors": ("excessive_buffer_overrun_errors_total", 1),
    "VL15_dropped": ("vl15_dropped_total", 1),
    "port_xmit_wait": ("xmit_wait_total", 1),
}
# ports/<n>/counters_ext/ (64-bit PortCountersExtended, mlx4). Where a counter is in both directories the
# larger value is the true one (``merge_counter``).
SYSFS_COUNTERS_EXT: dict[str, tuple[str, int]] = {
    "port_xmit_data_64": ("xmit_bytes_total", 4),
    "port_rcv_data_64": ("rcv_bytes_total", 4),
    "port_xmit_packets_64": ("xmit_packets_total", 1),
    "port_rcv_packets_64": ("rcv_packets_total", 1),
    "port_unicast_xmit_packets": ("unicast_xmit_packets_total", 1),
    "port_unicast_rcv_packets": ("unicast_rcv_packets_total", 1),
    "port_multicast_xmit_packets": ("multicast_xmit_packets_total", 1),
    "port_multicast_rcv_packets": ("multicast_rcv_packets_total", 1),
}
# ports/<n>/hw_counters/ (mlx5 RDMA counters) kept as columns; others are ignored.
HW_COUNTERS: tuple[str, ...] = (
    "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart", "roce_slow_restart_cnps", "out_of_buffer",
    "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err", "implied_nak_seq_err",
    "duplicate_request", "req_cqe_error", "resp_cqe_error", "np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets",
)

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec\s*\((\d+X)(?:\s+([A-Z0-9]+))?\)\s*$")
_GUID_SYSFS = re.compile(r"^[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){3}$")
_GUID_HEX = re.compile(r"^0x[0-9a-fA-F]{1,16}$")


def rate_gbps(width: str | None, speed: str | None) -> float | None:
    """Data rate of a link of ``width`` lanes (``4X``/``4x``) at ``speed`` (``EDR``); None when either is
    unknown (``ibnetdiscover`` prints ``???`` for a speed it cannot name)."""
    if not width or not speed:
        return None
    lanes = WIDTH_LANES.get(width.upper())
    lane = LANE_GBPS.get(speed.upper())
    return None if lanes is None or lane is None else lanes * lane


def parse_rate(text: str) -> tuple[float, str, str | None]:
    """``"100 Gb/sec (4X EDR)"`` -> (100.0, "4X", "EDR"); ``"10 Gb/sec (4X)"`` -> (10.0, "4X", None).
    Raises ValueError for anything else."""
    m = _RATE.match(text)
    if not m:
        raise ValueError(f"not a link rate like '100 Gb/sec (4X EDR)': {text[:60]!r}")
    return float(m.group(1)), m.group(2), m.group(3)


def parse_state(text: str, names: dict[int, str]) -> str:
    """``"4: ACTIVE"`` -> ``ACTIVE`` (the kernel prints the number and the name); a bare number is named
    from ``names``. Raises ValueError for anything else."""
    num, _, name = text.strip().partition(":")
    if not num.strip().isdigit():
        raise ValueError(f"not a port state like '4: ACTIVE': {text[:60]!r}")
    return name.strip() or names.get(int(num), num.strip())


def guid(text: str) -> str:
    """A GUID as ``0x`` and 16 lower-case hex digits, from sysfs' ``0a7f:bc12:45ef:d23b`` or ``0x...``."""
    t = text.strip()
    if _GUID_SYSFS.match(t):
        return "0x" + t.replace(":", "").lower()
    if _GUID_HEX.match(t):
        return "0x" + t[2:].lower().rjust(16, "0")
    raise ValueError(f"not a GUID: {t[:40]!r}")


def counter(text: str) -> int:
    """A counter file's value: a non-negative decimal integer that fits 64 bits. Raises ValueError."""
    t = text.strip()
    if not t.isdigit() or len(t) > 20 or int(t) >= 2**64:
        raise ValueError(f"not a counter value: {t[:40]!r}")
    return int(t)


def merge_counter(a: int | None, b: int | None) -> int | None:
    """One counter read from both the legacy PortCounters and PortCountersExtended (sysfs ``counters/``
    and ``counters_ext/``, node_exporter's ``port_*`` and ``legacy_*`` series): the larger. The legacy
    value is 32 bits wide and stops at its maximum, and a device reads 0 from the attribute it does not
    maintain (mlx4: ``counters/port_rcv_data`` 0 on port 2 beside a live ``counters_ext`` value, and
    ``counters_ext/port_rcv_packets_64`` 0 beside a live legacy one), so neither source wins always."""
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def host_of(desc: str | None) -> str | None:
    """The host in an HCA's node description (``"o0001 HCA-1"``, ``"worker20 mlx5_3"``): its first word,
    which is how ``ibnetdiscover`` shows the hostname the HCA reported (``/sys/class/infiniband/*/node_desc``)."""
    if not desc:
        return None
    words = desc.split()
    return words[0] if words else None
