"""nvidia-smi topo -m: the matrix from a real nvidia-smi capture (driver 590, one H100), a hand-written
8-GPU / 4-NIC matrix in NVIDIA's documented layout, an older driver's NIC columns, and hostile input."""

from __future__ import annotations

import re

import pytest

from fleetscope.door import ingestion
from fleetscope.core.errors import ParseError
from ingest import nvidia_smi_topo as topo

CAPTURE = "telemetry/nvidia-smi_capture_linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def matrix(gpus: int = 8, nic_cells=None, legend: bool = True, header_ansi: bool = True) -> bytes:
    """An HGX H100-like host: NV18 between every GPU pair; NIC k shares a PCIe switch with GPUs 2k and 2k+1,
    the other NIC of its NUMA node (GPUs 0-3 on node 0) is NODE, the far ones SYS."""
    nics = 4
    cols = [f"GPU{i}" for i in range(gpus)] + [f"NIC{k}" for k in range(nics)] + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    head = "\t".join(cols)
    lines = ["\t" + (f"\x1b[4m{head}\x1b[0m" if header_ansi else head)]

    def gpu_nic(i: int, k: int) -> str:
        if nic_cells and (i, k) in nic_cells:
            return nic_cells[(i, k)]
        return "PIX" if i // 2 == k else ("NODE" if i // 4 == k // 2 else "SYS")

    for i in range(gpus):
        cells = [" X " if j == i else "NV18" for j in range(gpus)] + [gpu_nic(i, k) for k in range(nics)]
        numa = i // 4
        lines.append("\t".join([f"GPU{i}", *cells, "0-55,112-167" if numa == 0 else "56-111,168-223", str(numa), "", "N/A"]))
    for k in range(nics):
        cells = [gpu_nic(i, k) for i in range(gpus)] + [" X " if m == k else ("NODE" if k // 2 == m // 2 else "SYS") for m in range(nics)]
        lines.append("\t".join([f"NIC{k}", *cells]))
    text = "\n".join(lines) + "\n" + LEGEND
    if legend:
        text += "\nNIC Legend:\n\n" + "".join(f"  NIC{k}: mlx5_{k}\n" for k in range(nics))
    return text.encode()


def capture_block(realdata) -> bytes:
    text = (realdata / CAPTURE).read_text()
    block = text.split("# $ nvidia-smi topo -m\n", 1)[1].split("\n", 1)[1]  # after the rule line
    return block.split("\n####", 1)[0].encode()


def test_the_real_capture_matrix_one_gpu_no_nic(realdata):
    b = topo.parse(capture_block(realdata), source="cap")
    assert b.meta == {"gpus": 1, "nics": 0, "nvlinks": {}, "nic_names": {}}
    assert b.fabric_gpu_nic is None  # nothing to pair: the node has no NIC in its matrix


def test_each_gpu_pairs_with_the_nic_on_its_pcie_switch_and_nvlinks_are_counted():
    b = topo.parse(matrix(), host="dgx-01", source="topo.txt")
    df = b.fabric_gpu_nic.sort("gpu_bus_id")
    assert df.select("gpu_bus_id", "nic_bus_id", "path", "numa_node").rows() == [
        (f"GPU{i}", f"mlx5_{i // 2}", "PIX", i // 4) for i in range(8)]
    assert set(df["host"]) == {"dgx-01"} and set(df["source"]) == {"topo.txt"}
    assert len(b.meta["nvlinks"]) == 28 and set(b.meta["nvlinks"].values()) == {18} and b.meta["nvlinks"]["GPU0-GPU7"] == 18
    assert b.meta["nic_names"]["NIC3"] == "mlx5_3"


def test_nearest_path_by_the_legends_order_and_ties_give_several_rows():
    # GPU0: no PIX; PXB to NIC1 beats PHB to NIC0. GPU2: PHB to both NICs of its node: two rows.
    cells = {(0, 0): "PHB", (0, 1): "PXB", (2, 0): "PHB", (2, 1): "PHB", (3, 0): "SYS", (3, 1): "SYS", (3, 2): "SYS", (3, 3): "SYS"}
    df = topo.parse(matrix(nic_cells=cells)).fabric_gpu_nic
    got = {g: sorted(df.filter(df["gpu_bus_id"] == g).select("nic_bus_id", "path").rows()) for g in ("GPU0", "GPU2", "GPU3")}
    assert got["GPU0"] == [("mlx5_1", "PXB")]
    assert got["GPU2"] == [("mlx5_0", "PHB"), ("mlx5_1", "PHB")]
    assert got["GPU3"] == [(f"mlx5_{k}", "SYS") for k in range(4)]
    assert set(df["host"]) == {""}  # a machine type, unless the caller names the host


def test_an_older_driver_names_the_nics_in_the_header_without_a_legend():
    old = matrix(gpus=2, legend=False, header_ansi=False).decode()
    for k in range(4):
        old = old.replace(f"NIC{k}", f"mlx5_{k}")
    df = topo.parse(old.encode()).fabric_gpu_nic
    assert df.select("gpu_bus_id", "nic_bus_id").rows() == [("GPU0", "mlx5_0"), ("GPU1", "mlx5_0")]


def test_detected_by_content_and_ingested(store):
    assert ingestion.detect(matrix()) == ["nvidia_smi_topo"]
    ingestion.ingest_bytes(store, matrix(), source="topo.txt")
    rows = store.read("fabric_gpu_nic")
    assert rows.height == 8 and sorted(rows["nic_bus_id"].unique().to_list()) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]


def cut(data: bytes, marker: bytes) -> bytes:
    return data[:data.index(marker)]


GOOD = matrix()


@pytest.mark.parametrize(("data", "says"), [
    (b"x" * (topo.MAX_INPUT_BYTES + 1), "exceeds"),
    (GOOD.replace(b"NV18", b"NV\x0018", 1), "NUL"),
    (b"\xff\xfe" + GOOD, "not UTF-8"),
    (b"", "no topology matrix header"),
    (b"GPU0\tX\n", "no topology matrix header"),  # a row without its header
    (cut(GOOD, b"\nGPU3\t"), "no row for GPU3"),  # truncated after GPU2
    (cut(GOOD, b"\nGPU3\t") + b"\nGPU3\tNV18\tNV18", "2 of 12 cells (cut short?)"),  # cut mid-row
    (GOOD.replace(b"PIX", b"PCIE", 1), "not one of X"),
    (GOOD.replace(b"\nGPU5\t", b"\nGPU9\t", 1), "is not one of the matrix's devices"),
    (GOOD.replace(b"N/A\nGPU1", b"N/A\tsurplus\textra\nGPU1", 1), "more than its header"),
    (GOOD.replace(b"NIC3: mlx5_3", b"NIC2: mlx5_9"), "twice in the NIC legend"),
    (GOOD.replace(b"  NIC3: mlx5_3\n", b""), "missing from the NIC legend"),
    (GOOD.replace(b"GPU0\t X ", b"GPU0\tNV18", 1), "not X (self)"),
    (b"\t" + b"\t".join(b"GPU%d" % i for i in range(600)) + b"\n", "more than 512 devices"),
    (b"\tGPU0\tGPU0\nGPU0\t X \t X \n", "repeats"),
    (b"\tGPU0\t" + b"A" * 100 + b"\nGPU0\t X \tSYS\n", "not a device name"),
    (b"\tGPU0\tCPU Affinity\tNIC0\nGPU0\t X \t0\tSYS\n", "affinity columns before device columns"),
    (b"\tNIC0\tGPU0\n", "no topology matrix header"),
])
def test_hostile_and_truncated_input_is_refused_naming_what(data, says):
    with pytest.raises(ParseError, match=re.escape(says)) as e:
        topo.parse(data, source="bad.txt")
    assert e.value.source == "bad.txt"


def test_a_duplicated_row_is_refused_with_its_line():
    dup = GOOD.replace(b"\nGPU2\t", b"\nGPU1\t", 1)
    with pytest.raises(ParseError, match="appears twice") as e:
        topo.parse(dup)
    assert e.value.line == 4
    with pytest.raises(TypeError):
        topo.parse("text")  # type: ignore[arg-type]
