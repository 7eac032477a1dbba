"""GPU-to-NIC pairing from an NCCL topology file (``NCCL_TOPO_FILE``, or the dump NCCL writes with
``NCCL_TOPO_DUMP_FILE``): ``<system>`` of ``<cpu numaid=...>`` holding ``<pci>`` trees.

PCI class codes (PCI Code and ID Assignment Specification): ``0x0302xx`` / ``0x0300xx`` a GPU (3D or VGA
controller), ``0x0207xx`` an InfiniBand controller, ``0x0200xx`` an Ethernet controller (RoCE, EFA),
``0x0604xx`` a PCI bridge (a PCIe switch). NCCL pairs a GPU with the NIC it reaches through the fewest
hops; its path classes (``src/graph/topo.h``): PIX through one PCIe switch, PXB through several, NODE
within one NUMA node through the CPU, SYS across NUMA nodes. Here each GPU is paired with the NICs
under its nearest shared bridge (PIX when that bridge is its parent, PXB higher up), else those on its
NUMA node (NODE), else all (SYS). On ND A100 v4 two GPUs and two NICs share a switch, so each GPU gets
two PIX rows: affinity per switch, not one to one.

Entity declarations are refused before the XML parser sees the document (a topology never needs one).
Pure: bytes in, a ``Batch`` with ``fabric_gpu_nic`` rows out; the caller may name the host.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.errors import ParseError
from ingest.format import FormatSpec, Sniff, SniffView

MAX_INPUT_BYTES = 4 * 2**20
MAX_DEPTH = 32
_BUS = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_GTS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")


def _kind(cls: str | None) -> str | None:
    c = (cls or "").lower()
    if c.startswith(("0x0302", "0x0300")):
        return "gpu"
    if c.startswith(("0x0207", "0x0200")):
        return "nic"
    if c.startswith("0x0604"):
        return "bridge"
    return None


def parse(data: bytes, *, host: str | None = None, source: str = "nccl_topo") -> F.Batch:
    """One ``fabric_gpu_nic`` row per GPU and each of its nearest NICs."""
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError("data must be bytes")
    if len(data) > MAX_INPUT_BYTES:
        raise ParseError(f"input of {len(data)} bytes exceeds {MAX_INPUT_BYTES}", source=source)
    if b"<!ENTITY" in data or b"<!DOCTYPE" in data:
        raise ParseError("a DOCTYPE or entity declaration is refused in an NCCL topology", source=source, field="xml")
    try:
        root = ET.fromstring(bytes(data))
    except ET.ParseError as exc:
        line = exc.position[0] if getattr(exc, "position", None) else None
        raise ParseError(f"not well-formed XML: {exc}", source=source, line=line) from None
    if root.tag != "system":
        raise ParseError(f"root element must be <system>, not <{root.tag[:40]}>", source=source, field="system")
    gpus: list[tuple[str, tuple[str, ...], int | None, dict[str, str]]] = []
    nics: list[tuple[str, tuple[str, ...], int | None]] = []

    def walk(el: ET.Element, chain: tuple[str, ...], numa: int | None, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ParseError(f"PCI tree deeper than {MAX_DEPTH}", source=source, field="pci")
        for child in el:
            if child.tag == "cpu":
                nid = child.get("numaid", "")
                if not nid.isdigit():
                    raise ParseError(f"cpu numaid {nid[:20]!r} is not a number", source=source, field="numaid")
                walk(child, (), int(nid), depth + 1)
            elif child.tag == "pci":
                bus = child.get("busid", "")
                if not _BUS.match(bus):
                    raise ParseError(f"PCI busid {bus[:40]!r} is not dddd:bb:dd.f", source=source, field="busid")
                bus = bus.lower()
                kind = _kind(child.get("class"))
                if kind == "gpu":
                    gpus.append((bus, chain, numa, dict(child.attrib)))
                elif kind == "nic":
                    nics.append((bus, chain, numa))
                walk(child, chain + (bus,) if kind == "bridge" else chain, numa, depth + 1)
            else:
                walk(child, chain, numa, depth + 1)

    walk(root, (), None, 0)
    if not gpus:
        raise ParseError("no GPU (PCI class 0x0302/0x0300) in the topology", source=source)
    rows = []
    for bus, chain, numa, attrib in gpus:
        best: list[tuple[str, str, str | None]] = []
        for depth in range(len(chain), 0, -1):  # nearest shared bridge first
            under = [n for n, nchain, nnuma in nics if nnuma == numa and nchain[:depth] == chain[:depth]]
            if under:
                best = [(n, "PIX" if depth == len(chain) else "PXB", chain[depth - 1]) for n in under]
                break
        if not best:
            same = [n for n, _, nnuma in nics if nnuma == numa]
            best = [(n, "NODE", None) for n in same] or [(n, "SYS", None) for n, _, _ in nics]
        gts = _GTS.match(attrib.get("link_speed", ""))
        width = attrib.get("link_width", "")
        for nic, path, switch in best:
            rows.append({"host": host or "", "gpu_bus_id": bus, "nic_bus_id": nic, "path": path, "pcie_switch": switch, "numa_node": numa,
                         "link_gts": float(gts.group(1)) if gts else None, "link_width": int(width) if width.isdigit() else None,
                         "source": source})
    if not rows:
        return F.Batch(source=source, meta={"gpus": len(gpus), "nics": 0})
    df = pl.DataFrame(rows, schema_overrides={c.name: c.dtype for c in F.FABRIC_GPU_NIC.columns}, infer_schema_length=None)
    return F.Batch(source=source, fabric_gpu_nic=F.conform(F.FABRIC_GPU_NIC, df), meta={"gpus": len(gpus), "nics": len(nics)})


def _looks_like(view: SniffView) -> bool:
    head = view.stripped[:4096]
    return head.startswith("<system") and "<pci " in head and "busid=" in head


FORMATS = (
    FormatSpec("nccl_topo", "NCCL topology XML (NCCL_TOPO_FILE): GPU to NIC pairing by PCIe switch",
               lambda d, s, o: parse(d, source=s), sniff=Sniff(22, _looks_like)),
)
