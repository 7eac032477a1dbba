"""GPU-to-NIC pairing and NVLink counts from ``nvidia-smi topo -m`` (the "topology matrix").

The matrix, as nvidia-smi prints it (NVIDIA, ``nvidia-smi topo -h`` and the legend it prints): a header row
of device columns (``GPU0`` ... then ``NIC0`` ... , or on older drivers the NICs' own names such as
``mlx5_0``) followed by ``CPU Affinity``, ``NUMA Affinity`` and, on recent drivers, ``GPU NUMA ID``; then
one row per device, each cell the connection between the row's and the column's device:

    X    = Self
    SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
    NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
    PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
    PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
    PIX  = Connection traversing at most a single PCIe bridge
    NV#  = Connection traversing a bonded set of # NVLinks

and a ``NIC Legend`` naming each ``NICn`` (``NIC0: mlx5_0``). Columns are tab-separated; the header is
underlined with ANSI escapes on a terminal, cells are padded (`` X ``), and a GPU row may carry an empty
field before ``GPU NUMA ID`` (as driver 590's does); empty fields are dropped.

Each GPU is paired with its nearest NICs: the legend lists the paths nearest first (PIX, PXB, PHB, NODE,
SYS, read upwards), as NCCL's path classes order them (``src/graph/topo.h``), so the NICs at the GPU's
best path class are its rows (several on a tie, as the NCCL topology reader gives). A row's
``gpu_bus_id`` is ``GPU<index>`` and ``nic_bus_id`` the NIC's device name (``mlx5_0``): the matrix gives
no PCI addresses, and the device name is what the InfiniBand topology and port counters name
(``analyzers.fabric_attribution`` joins on it). NVLink counts between GPUs (``NV18``) go to
``meta["nvlinks"]``: ``fabric_link`` is keyed by fabric node GUID and port, which GPUs named per host
have not.

Pure: bytes in, a ``Batch`` with ``fabric_gpu_nic`` rows out; the caller may name the host.
"""

from __future__ import annotations

import re

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.errors import ParseError
from ingest.format import FormatSpec, Sniff, SniffView

MAX_INPUT_BYTES = 1 * 2**20
MAX_DEVICES = 512
PATH_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU = re.compile(r"^GPU(\d{1,4})$")
_NIC = re.compile(r"^NIC(\d{1,4})$")
_NV = re.compile(r"^NV(\d{1,3})$")
_LEGEND = re.compile(r"^\s*(NIC\d{1,4})\s*:\s*(\S{1,64})\s*$")
_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
_AFFINITY = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def _fields(line: str) -> list[str]:
    return [f.strip() for f in _ANSI.sub("", line).split("\t") if f.strip()]


def parse(data: bytes, *, host: str | None = None, source: str = "nvidia_smi_topo") -> F.Batch:
    """``fabric_gpu_nic`` rows for each GPU and its nearest NICs; meta: gpus, nics, nvlinks."""
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError("data must be bytes")
    if len(data) > MAX_INPUT_BYTES:
        raise ParseError(f"input of {len(data)} bytes exceeds {MAX_INPUT_BYTES}", source=source)
    if b"\x00" in data:
        raise ParseError("NUL byte in a text matrix", source=source)
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"not UTF-8 at byte {exc.start}", source=source) from None
    lines = text.splitlines()
    # the header is indented (its first cell is the empty corner); device rows start at column 0
    head = next((i for i, ln in enumerate(lines) if _ANSI.sub("", ln)[:1] in ("\t", " ") and _fields(ln)[:1] == ["GPU0"]), None)
    if head is None:
        raise ParseError("no topology matrix header (a tab-indented row of GPU0 ... columns)", source=source, field="header")
    cols = _fields(lines[head])
    if len(cols) > MAX_DEVICES + len(_AFFINITY):
        raise ParseError(f"{len(cols)} columns: more than {MAX_DEVICES} devices", source=source, line=head + 1, field="header")
    devices = [c for c in cols if c not in _AFFINITY]
    extra = [c for c in cols if c in _AFFINITY]
    if cols[:len(devices)] != devices:
        raise ParseError("affinity columns before device columns", source=source, line=head + 1, field="header")
    for c in devices:
        if not _NAME.match(c):
            raise ParseError(f"device column {c[:40]!r} is not a device name", source=source, line=head + 1, field="header")
    if len(set(devices)) != len(devices):
        raise ParseError("a device column repeats", source=source, line=head + 1, field="header")
    gpus = [c for c in devices if _GPU.match(c)]
    nics = [c for c in devices if not _GPU.match(c)]
    if not gpus:
        raise ParseError("no GPU column in the matrix", source=source, line=head + 1, field="header")
    legend: dict[str, str] = {}
    rows_seen: dict[str, tuple[list[str], list[str], int]] = {}
    in_legend = False
    for i in range(head + 1, len(lines)):
        raw = lines[i]
        if raw.strip().startswith(("Legend:", "NIC Legend:")):
            in_legend = True
            continue
        if in_legend:
            if m := _LEGEND.match(raw):
                if m.group(1) in legend:
                    raise ParseError(f"{m.group(1)} named twice in the NIC legend", source=source, line=i + 1, field="legend")
                legend[m.group(1)] = m.group(2)
            elif raw.strip().startswith("#"):  # the next section of a capture
                break
            continue
        f = _fields(raw)
        if not f:
            continue
        label = f[0]
        if label not in devices:
            raise ParseError(f"row {label[:40]!r} is not one of the matrix's devices", source=source, line=i + 1, field="row")
        if label in rows_seen:
            raise ParseError(f"row {label} appears twice", source=source, line=i + 1, field="row")
        cells, rest = f[1:1 + len(devices)], f[1 + len(devices):]
        if len(cells) < len(devices):
            raise ParseError(f"row {label} has {len(cells)} of {len(devices)} cells (cut short?)", source=source, line=i + 1, field="row")
        if len(rest) > len(extra):
            raise ParseError(f"row {label} has {len(rest) - len(extra)} field(s) more than its header", source=source, line=i + 1, field="row")
        for col, cell in zip(devices, cells):
            if cell != "X" and cell not in PATH_ORDER and not _NV.match(cell):
                raise ParseError(f"cell {label}/{col} is {cell[:20]!r}, not one of X, {', '.join(PATH_ORDER)}, NV#",
                                 source=source, line=i + 1, field=col)
        if cells[devices.index(label)] != "X":
            raise ParseError(f"row {label} is not X (self) in its own column", source=source, line=i + 1, field=label)
        rows_seen[label] = (cells, rest, i + 1)
    missing = [g for g in gpus if g not in rows_seen]
    if missing:
        raise ParseError(f"no row for {', '.join(missing[:5])} (truncated matrix?)", source=source, field="row")
    for n in nics:
        if _NIC.match(n) and legend and n not in legend:
            raise ParseError(f"{n} is missing from the NIC legend", source=source, field="legend")
    name = {n: legend.get(n, n) for n in nics}
    nvlinks: dict[str, int] = {}
    out = []
    for g in gpus:
        cells, rest, _ = rows_seen[g]
        aff = dict(zip(extra, rest))
        numa = aff.get("NUMA Affinity", "")
        by_nic = {n: cells[devices.index(n)] for n in nics}
        for other in gpus[gpus.index(g) + 1:]:  # each pair once
            if m := _NV.match(cells[devices.index(other)]):
                nvlinks[f"{g}-{other}"] = int(m.group(1))
        paths = {n: p for n, p in by_nic.items() if p in PATH_ORDER}
        if not paths:
            continue
        best = min(PATH_ORDER.index(p) for p in paths.values())
        for n, p in paths.items():
            if PATH_ORDER.index(p) == best:
                out.append({"host": host or "", "gpu_bus_id": g, "nic_bus_id": name[n], "path": p, "pcie_switch": None,
                            "numa_node": int(numa) if numa.isdigit() else None, "link_gts": None, "link_width": None, "source": source})
    meta = {"gpus": len(gpus), "nics": len(nics), "nvlinks": nvlinks, "nic_names": name}
    if not out:
        return F.Batch(source=source, meta=meta)
    df = pl.DataFrame(out, schema={c.name: c.dtype for c in F.FABRIC_GPU_NIC.columns})
    return F.Batch(source=source, fabric_gpu_nic=F.conform(F.FABRIC_GPU_NIC, df), meta=meta)


def _looks_like(view: SniffView) -> bool:
    head = _ANSI.sub("", view.text[:8192])
    return "\tGPU0" in head and ("CPU Affinity" in head or "NIC Legend" in head) and "X    = Self" in head and "$ nvidia-smi" not in head


FORMATS = (
    FormatSpec("nvidia_smi_topo", "nvidia-smi topo -m: GPU to nearest NIC (PIX/PXB/PHB/NODE/SYS) and NVLink counts",
               lambda d, s, o: parse(d, source=s), sniff=Sniff(23, _looks_like)),
)
