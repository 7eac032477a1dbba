"""ingest.dcgm_lines: the small-body reader gives the columnar parser's Batch, or declines.

Every body here is read both ways: where the line reader accepts one, each frame and each count must
equal ingest.dcgm.parse's; where it declines, the columnar parser is the one that answers (and raises
its ParseError with the line)."""

from __future__ import annotations

import importlib.util
import os
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from fleetscope.core.errors import ParseError
from fleetscope.core import frames as F
from fleetscope.core.frames import Batch
from ingest import dcgm, dcgm_labels, dcgm_lines

REPO = Path(__file__).resolve().parents[2]
TELEMETRY = REPO.parent / "shared" / "realdata" / "telemetry"
TS = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
_spec = importlib.util.spec_from_file_location("_bench_dcgm", REPO / "benchmarks" / "ingest_dcgm.py")
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)


@pytest.fixture(autouse=True, params=["compiled", "python"])
def loop(request, monkeypatch):
    """Every test here runs on the compiled per-push loop (``ingest._lines``) and on the Python one it
    stands for where no compiler built it."""
    if request.param == "compiled":
        if dcgm_lines._c is None:
            _compiled_missing()
    else:
        monkeypatch.setattr(dcgm_lines, "_cut", dcgm_lines._cut_py)
        monkeypatch.setattr(dcgm_lines, "_numbers", dcgm_lines._numbers_py)
        monkeypatch.setattr(dcgm_lines, "_scale_ints", dcgm_lines._scale_ints_py)
    return request.param


def _compiled_missing() -> None:
    msg = "ingest._lines was not built (no C compiler at install)"
    if os.environ.get("FLEETSCOPE_REQUIRE_COMPILED") == "1":
        pytest.fail(msg + " and FLEETSCOPE_REQUIRE_COMPILED=1")
    pytest.skip(msg)


def _us(ts: datetime) -> int:
    return dcgm._to_us(ts)


def _frames_equal(a: Batch, b: Batch) -> None:
    for name in ("gpu", "gpu_sample", "gpu_workload", "health_event", "metric_sample"):
        x, y = getattr(a, name), getattr(b, name)
        if (x is None or x.height == 0) and (y is None or y.height == 0):
            continue
        assert x is not None and y is not None, name
        # As the store gets them: conformed, one row per natural key.
        x, y = F.conform(F.FRAMES[name], x), F.conform(F.FRAMES[name], y)
        assert_frame_equal(x.sort(x.columns), y.sort(y.columns), check_column_order=True), name


def _same_as_columnar(body: bytes, ts: datetime = TS) -> bool:
    """True when the line reader took the body (and matched); False when it declined."""
    lines = dcgm_lines.read(body)
    if lines is None:
        return False
    full = dcgm.parse(body, source="s", ts=ts)
    _frames_equal(full, dcgm_lines.assemble([(lines, _us(ts))], source="s"))
    # "lexer" and "lines" say which way the body was read, not what it held.
    meta = {k: v for k, v in full.meta.items() if k not in ("lexer", "lines")}
    assert meta == {k: v for k, v in lines.meta.items() if k != "lexer"}
    assert lines.values() == full.values()
    return True


@pytest.mark.parametrize("name", [
    "dcgm-exporter_metrics_8xH100_k8s-pod-labels_sampled_nvidia-aicr.prom",
    "dcgm-exporter_metrics_1xL4_default-counters_full_cncf-kops.prom",
    "dcgm-exporter_metrics_L40S_helm-default_full_cncf-upcloud.prom",
])
def test_real_bodies_read_alike(name):
    path = TELEMETRY / name
    if not path.exists():
        pytest.skip(f"{path} absent (shared/realdata)")
    assert _same_as_columnar(path.read_bytes())


def test_agent_bodies_with_pods_faults_and_xids():
    for h in range(12):
        body = _bench.synth_scrape(8, first_gpu=8 * h, seed=h, busy_fraction=0.5, xids={8 * h + 3: 79})
        assert _same_as_columnar(body)


def test_blanks_nonfinite_duplicates_unmapped_and_skipped_alike():
    u = 'gpu="0",UUID="GPU-a",Hostname="n1",modelName="H100",pci_bus_id="00000000:53:00.0",DCGM_FI_DRIVER_VERSION="580"'
    body = (
        "# HELP DCGM_FI_DEV_GPU_TEMP t\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        f"DCGM_FI_DEV_GPU_TEMP{{{u}}} 41\n"
        f"DCGM_FI_DEV_GPU_TEMP{{{u}}} 99\n"  # a duplicate: the first stays
        f"DCGM_FI_DEV_POWER_USAGE{{{u}}} 140737488355328\n"  # FP64 blank
        f"DCGM_FI_DEV_SM_CLOCK{{{u}}} 2147483632\n"  # INT32 blank
        f"DCGM_FI_DEV_MEM_CLOCK{{{u}}} NaN\n"
        f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{u}}} 123456789\n"
        f"DCGM_FI_DEV_FB_USED{{{u}}} 1.5e3\n"
        f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{u}}} 17\n"  # no gpu_sample column: metric_sample
        f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{u}}} 18\n"
        f'DCGM_FI_DEV_XID_ERRORS{{{u}}} 79\n'
        'go_goroutines{instance="x"} 12\n'
        f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{u}}} 2\n"
    ).encode()
    assert _same_as_columnar(body)
    lines = dcgm_lines.read(body)
    batch = dcgm_lines.assemble([(lines, _us(TS))])
    row = batch.gpu_sample.row(0, named=True)
    assert row["temp_c"] == 41 and row["power_w"] is None and row["sm_clock_mhz"] is None
    assert row["energy_j"] == pytest.approx(123456.789) and row["fb_used_bytes"] == 1500 * 2**20
    assert lines.meta["duplicates_dropped"] == 2 and lines.meta["dcgm_blank_dropped"] == 2 and lines.meta["non_finite_dropped"] == 1
    assert lines.meta["skipped_names"] == {"go_goroutines": 1}
    assert sorted(batch.health_event["kind"].to_list()) == ["ecc", "xid"]


def test_mig_and_extra_labels_alike():
    base = 'gpu="0",UUID="GPU-m",Hostname="n1",modelName="A100",GPU_I_PROFILE="1g.10gb",GPU_I_ID="{i}"'
    body = "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{{base.format(i=i)}}} {i * 10}\nDCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{base.format(i=i)},link="{i}"}} 5\n'
        for i in range(3)
    ).encode()
    # A metric_sample line with an extra label has a second block for the same GPU: declined, and the
    # columnar parser reads it.
    assert dcgm_lines.read(body) is None
    plain = b"".join(line + b"\n" for line in body.split(b"\n") if b"GPU_UTIL" in line)
    assert _same_as_columnar(plain)
    b = dcgm_lines.assemble([(dcgm_lines.read(plain), _us(TS))])
    assert sorted(b.gpu_sample["gpu_uuid"].to_list()) == ["GPU-m/mig0", "GPU-m/mig1", "GPU-m/mig2"]


@pytest.mark.parametrize("body", [
    b'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-a"} 41 1700000000000\n',  # its own timestamp
    b'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-a"} 41',  # no final newline: a cut body
    b'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-a"}\t41\n',
    b'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-a",x="a\\"b"} 41\n',  # an escape
    b'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-a",x="}"} 41\n',  # a brace in a value
    b'DCGM_FI_DEV_GPU_TEMP 41\n',  # no labels
    b'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 41\n',  # no UUID
    b'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-a"} 0x29\n',
    b'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-a",UUID="GPU-b"} 41\n',
    b'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-a\x00"} 41\n',
    b'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-\xff"} 41\n',  # not UTF-8
    b'9DCGM{UUID="GPU-a"} 41\n',
    b'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-a",gpu="x"} 41\n',
])
def test_unusual_bodies_are_declined(body):
    assert dcgm_lines.read(body) is None


def test_oversized_body_is_left_to_the_columnar_parser():
    body = _bench.synth_scrape(8 * 40, seed=3)
    assert len(body) > dcgm_lines.MAX_BYTES
    assert dcgm_lines.read(body) is None


def test_mutated_bodies_read_alike_or_are_declined():
    """Random cuts, swaps and byte flips of an agent body: never a different answer than the columnar parser's."""
    rng = random.Random(7)
    base = _bench.synth_scrape(8, seed=11, busy_fraction=0.5).split(b"\n")
    accepted = declined = 0
    for _ in range(150):
        lines = list(base)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(lines))
            op = rng.randrange(5)
            if op == 0:
                del lines[i]
            elif op == 1:
                lines.insert(i, lines[rng.randrange(len(lines))])
            elif op == 2 and lines[i]:
                j = rng.randrange(len(lines[i]))
                lines[i] = lines[i][:j] + bytes([rng.choice(b' {}"=,\\#9aZ.\n')]) + lines[i][j + 1:]
            elif op == 3:
                lines[i] = lines[i].replace(b" ", b"  ", 1)
            else:
                rng.shuffle(lines)
        body = b"\n".join(lines)
        try:
            ok = _same_as_columnar(body)
        except ParseError:
            # The columnar parser refuses it; the line reader must have declined it, never read it.
            assert dcgm_lines.read(body) is None
            ok = False
        accepted += ok
        declined += not ok
    assert accepted > 20 and declined > 20


def test_many_bodies_assemble_as_their_merged_parses():
    bodies = [_bench.synth_scrape(8, first_gpu=8 * h, seed=h, busy_fraction=0.3) for h in range(6)]
    bodies.append(bodies[0])  # the same node again, a scrape later: its own rows
    times = [TS + timedelta(seconds=k) for k in range(len(bodies))]
    merged = Batch(source="s")
    for body, ts in zip(bodies, times):
        merged = merged.merge(dcgm.parse(body, source="s", ts=ts))
    group = dcgm_lines.assemble([(dcgm_lines.read(b), _us(t)) for b, t in zip(bodies, times)], source="s")
    _frames_equal(merged, group)
    assert group.gpu_sample.height == 8 * 7
    again = dcgm_lines.read(bodies[0]).keys[0]
    assert group.gpu_sample.filter(pl.col("gpu_uuid") == again)["ts"].to_list() == [times[0], times[-1]]


def test_a_node_seen_before_is_filled_from_its_template_and_reads_alike():
    dcgm_lines.forget()
    first = _bench.synth_scrape(8, first_gpu=800, seed=5, busy_fraction=0.5)
    assert _same_as_columnar(first)
    assert len(dcgm_lines._TEMPLATES) == 1
    # The same node a scrape later: same lines, new values (another seed keeps the labels of GPU 800+).
    later = _bench.synth_scrape(8, first_gpu=800, seed=5, busy_fraction=0.5).replace(b"} 3", b"} 4")
    assert later != first
    template = next(iter(dcgm_lines._TEMPLATES.values()))
    parts = dcgm_lines._VALUE_CUT.split(later)
    assert template.fill(parts[1::2]) is not None  # the template path is the one taken
    assert _same_as_columnar(later)
    # Values the template does not vouch for go line by line, and still read alike (or are refused alike).
    for odd in (b"NaN", b"2147483647", b"1e999", b"-1e999", b"1_0", b".", b"0x1", b""):
        start = later.index(b"} ") + 2
        body = later[:start] + odd + later[later.index(b"\n", start):]
        assert template.fill(dcgm_lines._VALUE_CUT.split(body)[1::2]) is None, odd
        try:
            _same_as_columnar(body)
        except ParseError:
            assert dcgm_lines.read(body) is None


def _line_read(body: bytes):  # type: ignore[no-untyped-def]
    return dcgm_lines._read_lines(body, [], [])


def _same_lines(a, b) -> None:  # type: ignore[no-untyped-def]
    assert (a.keys, a.labels, a.extra, a.metrics, a.meta, a.fields, a.values()) == (
        b.keys, b.labels, b.extra, b.metrics, b.meta, b.fields, b.values())


def test_a_new_node_takes_its_template_from_another_nodes(monkeypatch):
    """Nodes of one fleet print one skeleton (the text around the values, label blocks aside): a node met for
    the first time is not read line by line when another's template fits it, and reads alike."""
    dcgm_lines.forget()
    calls = []
    read_lines = dcgm_lines._read_lines
    monkeypatch.setattr(dcgm_lines, "_read_lines", lambda *a: calls.append(1) or read_lines(*a))
    for h in range(12):
        body = _bench.synth_scrape(8, first_gpu=8 * h, seed=h, busy_fraction=0.5, xids={8 * h + 2: 79} if h % 3 else None)
        body += f'node_boot_time_seconds{{instance="n{h}"}} 1.7e9\n'.encode()  # a skipped series, its block unread
        assert _same_as_columnar(body)
        monkeypatch.setattr(dcgm_lines, "_read_lines", read_lines)
        _same_lines(dcgm_lines.read(body), _line_read(body))
        monkeypatch.setattr(dcgm_lines, "_read_lines", lambda *a: calls.append(1) or read_lines(*a))
    assert len(calls) == 1 and len(dcgm_lines._SKELETONS) == 1 and len(dcgm_lines._TEMPLATES) == 12


def test_a_new_node_is_compared_piece_by_piece_and_its_blocks_read_by_shape(monkeypatch):
    """A new node's body is checked against its skeleton's first body piece by piece, and its label blocks are read
    by that body's label shapes: no skeleton digest, no label-by-label read, and still the line reader's answer."""
    dcgm_lines.forget()
    # the skeleton's nodes met so far: their label shapes (a GPU with a pod's labels and one without) are learned
    for h in range(4):
        assert dcgm_lines.read(_bench.synth_scrape(8, first_gpu=8 * h, seed=h, busy_fraction=0.5)) is not None
    digested, labelled = [], []
    skeleton, block = dcgm_lines._skeleton, dcgm_labels._block
    monkeypatch.setattr(dcgm_lines, "_skeleton", lambda *a: digested.append(1) or skeleton(*a))
    monkeypatch.setattr(dcgm_labels, "_block", lambda *a: labelled.append(1) or block(*a))
    bodies = [_bench.synth_scrape(8, first_gpu=8 * h, seed=h, busy_fraction=0.5) for h in range(4, 12)]
    got = [dcgm_lines.read(body) for body in bodies]
    assert digested == [] and labelled == []
    monkeypatch.undo()
    for body, lines in zip(bodies, got):
        _same_lines(lines, _line_read(body))
        assert _same_as_columnar(body)


def test_a_skeleton_the_piece_index_lost_is_indexed_again_by_its_next_new_node(monkeypatch):
    """``_KIN`` is emptied when full while the skeletons stay: the next new node of a skeleton is found by its
    digest and indexes it again, so the node after it is compared piece by piece."""
    dcgm_lines.forget()
    assert dcgm_lines.read(_bench.synth_scrape(8, first_gpu=0, seed=0)) is not None
    dcgm_lines._KIN.clear()
    second = _bench.synth_scrape(8, first_gpu=8, seed=1)
    assert dcgm_lines.read(second) is not None and len(dcgm_lines._KIN) == 1
    digested = []
    skeleton = dcgm_lines._skeleton
    monkeypatch.setattr(dcgm_lines, "_skeleton", lambda *a: digested.append(1) or skeleton(*a))
    third = _bench.synth_scrape(8, first_gpu=16, seed=2)
    got = dcgm_lines.read(third)
    assert digested == []
    monkeypatch.undo()
    _same_lines(got, _line_read(third))
    _same_lines(dcgm_lines.read(second), _line_read(second))


def _gpu_blocks(body: bytes) -> list[bytes]:
    """The label blocks of a synthetic body's GPUs, in order."""
    first_family = body.split(b"# HELP ")[1]
    return [line[line.index(b"{") + 1:line.rindex(b"}")] for line in first_family.split(b"\n")[2:] if line]


@pytest.mark.parametrize("change", ["a sample given another gpu's block", "two lines of a family swapped", "labels in another order",
                                    "one more label", "a value with a backslash"])
def test_a_new_node_unlike_its_skeleton_in_one_place_reads_as_line_by_line(change):
    """Bodies that share the known skeleton's count of pieces, first piece and tail but differ from it in one
    place: each is read as the line reader reads it (or declined alike), whichever path finds it."""
    dcgm_lines.forget()
    assert dcgm_lines.read(_bench.synth_scrape(8, first_gpu=0, seed=0)) is not None
    other = _bench.synth_scrape(8, first_gpu=8, seed=1)
    blocks = _gpu_blocks(other)
    at = other.index(b"DCGM_FI_DEV_GPU_UTIL{")
    family_end = other.index(b"# HELP", at)
    family = other[at:family_end]
    if change == "a sample given another gpu's block":
        body = other[:at] + family.replace(blocks[3], blocks[4], 1) + other[family_end:]
    elif change == "two lines of a family swapped":
        rows = family.split(b"\n")
        rows[1], rows[2] = rows[2], rows[1]
        body = other[:at] + b"\n".join(rows) + other[family_end:]
    elif change == "labels in another order":
        first, _, rest = blocks[2].partition(b",")
        body = other.replace(blocks[2], rest + b"," + first)
    elif change == "one more label":
        body = other.replace(blocks[2], blocks[2] + b',rack="r7"')
    else:
        body = other.replace(blocks[2], blocks[2].replace(b'Hostname="', b'Hostname="a\\\\'))
    assert body != other and len(body.split(b"\n")) == len(other.split(b"\n"))
    got, want = dcgm_lines.read(body), _line_read(body)
    assert (got is None) == (want is None) == (change == "a value with a backslash")
    if got is not None:
        _same_lines(got, want)
        assert _same_as_columnar(body)


@pytest.mark.parametrize("change", ["one gpu twice", "an escape", "not utf-8", "skipped block not plain", "a brace"])
def test_a_node_whose_blocks_the_line_reader_declines_is_declined_alike(change):
    dcgm_lines.forget()
    first = _bench.synth_scrape(8, first_gpu=0, seed=0) + b'node_boot_time_seconds{instance="n0"} 1\n'
    assert dcgm_lines.read(first) is not None
    other = _bench.synth_scrape(8, first_gpu=8, seed=1) + b'node_boot_time_seconds{instance="n1"} 1\n'
    uuids = dcgm_lines.read(other).keys
    if change == "one gpu twice":
        body = other.replace(uuids[5].encode(), uuids[3].encode())
    elif change == "an escape":
        body = other.replace(b'Hostname="gpu-node-2"', b'Hostname="gpu-node\\\\2"', 1)
    elif change == "not utf-8":
        body = other.replace(b'Hostname="gpu-node-2"', b'Hostname="gpu-node-\xff"')
    elif change == "a brace":
        body = other.replace(b'Hostname="gpu-node-2"', b'Hostname="gpu-{node"')
    else:
        body = other.replace(b'instance="n1"', b'instance="n\\\\1"')
    assert body != other
    assert dcgm_lines.read(body) is None and _line_read(body) is None


def test_label_blocks_mutated_in_a_known_skeleton_read_as_line_by_line(monkeypatch):
    """Hostile label blocks in a body whose skeleton a template knows (a block changed everywhere it is
    printed, so the skeleton still matches): the answer is always the line reader's, declines included."""
    rng = random.Random(20261205)
    first = _bench.synth_scrape(8, first_gpu=0, seed=0, busy_fraction=0.5)
    calls = []
    read_lines = dcgm_lines._read_lines
    siblings = 0
    for i in range(200):
        dcgm_lines.forget()
        assert dcgm_lines.read(first) is not None
        other = _bench.synth_scrape(8, first_gpu=8 + 8 * (i % 5), seed=1 + i % 5, busy_fraction=0.5)
        blocks = sorted({line[line.index(b"{") + 1:line.rindex(b"}")] for line in other.split(b"\n") if line and line[0] != 35})
        body = other
        for _ in range(rng.randint(1, 3)):
            block = rng.choice(blocks)
            j = rng.randrange(len(block))
            new = block[:j] + bytes([rng.choice(b' {}"=,\\#9aZ.-_\xff\r\t\x00')]) + block[j + 1:]
            body = body.replace(block, new)
            blocks = [new if b == block else b for b in blocks]
        calls.clear()
        monkeypatch.setattr(dcgm_lines, "_read_lines", lambda *a: calls.append(1) or read_lines(*a))
        got = dcgm_lines.read(body)
        monkeypatch.setattr(dcgm_lines, "_read_lines", read_lines)
        siblings += not calls
        want = _line_read(body)
        assert (got is None) == (want is None), body
        if got is not None:
            _same_lines(got, want)
    assert siblings > 20  # the rest broke the skeleton or a block, and were read (or declined) line by line


# Found by a differential fuzz of this reader against the columnar parser: bodies the line reader or a template
# took that the columnar parser refuses, or counted otherwise.

_U = 'UUID="GPU-a",Hostname="node-1"'


def _refused_and_declined(body: bytes, match: str) -> None:
    with pytest.raises(ParseError, match=match):
        dcgm.parse(body, source="s", ts=TS)
    assert dcgm_lines.read(body) is None


def test_a_quote_moved_across_a_value_is_not_the_learned_body():
    """The template's digest holds where the body was cut at its values, not only the text between."""
    learned = (b'# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n'
               b'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-a",Hostname="node-1"} 41\nDCGM_FI_DEV_GPU_TEMP{UUID="GPU-b",Hostname="node-1"} 42\n')
    assert _same_as_columnar(learned)
    broken = learned.replace(b'Hostname="node-1"} 41\nDCGM', b'Hostname="node-1} 41\n"DCGM')
    assert len(broken) == len(learned)
    _refused_and_declined(broken, "unterminated value of label Hostname")


def test_skipped_series_are_held_to_the_formats_rules_too():
    """A series this reader skips (not DCGM's) still has a number for its value and labels within the limit."""
    dcgm_lines.forget()
    small = f"DCGM_FI_DEV_GPU_TEMP{{{_U}}} 41\n".encode()
    assert _same_as_columnar(small)  # learned: a later body of the same node meets its template
    _refused_and_declined(small + b'node_info{x="' + b"a" * 17000 + b'"} 1\n', "over the limit of 16384")
    for value in (b"abc", b"1e", b"", b"0x10", b"1_000"):
        _refused_and_declined(small + b'node_boot_time_seconds{instance="n1"} ' + value + b"\n", "is not a number|has no value")


def test_a_raw_line_feed_in_a_label_value_is_refused_both_ways():
    """The format writes a line feed in a label value escaped (``\\n``): a raw one is a broken line, whether the
    columnar parser reads the body by records or by lines, and a new node's body is not read from another's
    template with one."""
    for first_gpu in (0, 8):
        body = _bench.synth_scrape(8, first_gpu=first_gpu, seed=first_gpu)
        assert _same_as_columnar(body)  # node 0 learned: node 8's skeleton is known
    body = _bench.synth_scrape(8, first_gpu=16, seed=16)
    host = body.split(b'Hostname="', 1)[1].split(b'"', 1)[0]
    broken = body.replace(b'Hostname="' + host + b'"', b'Hostname="' + host[:3] + b"\n" + host[3:] + b'"')
    _refused_and_declined(broken, "Hostname")
    braced = broken.replace(b"# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).", b"# HELP DCGM_FI_DEV_SM_CLOCK SM clock {MHz}.")
    assert braced != broken
    _refused_and_declined(braced, "Hostname")


def test_a_blank_in_a_duplicated_series_is_counted_as_the_columnar_parser_counts_it():
    """A later copy of a series is dropped; a blank or an infinity there is counted as such, through a template too."""
    dcgm_lines.forget()
    learned = f"DCGM_FI_DEV_GPU_TEMP{{{_U}}} 41\nDCGM_FI_DEV_GPU_TEMP{{{_U}}} 43\n".encode()
    assert _same_as_columnar(learned)
    for value, counted in ((b"2147483647", "dcgm_blank_dropped"), (b"1e999", "non_finite_dropped")):
        body = learned.replace(b"} 43", b"} " + value)
        assert _same_as_columnar(body)
        lines = dcgm_lines.read(body)
        assert lines.meta[counted] == 1 and lines.meta["duplicates_dropped"] == 0


def test_a_blank_field_without_a_column_is_counted_once():
    """A blank or NaN in a DCGM field kept as a metric sample is one dropped value, whichever way the columnar
    parser reads the body."""
    for comment in (b"", b"# HELP x a {brace} reads the body line by line\n"):
        body = comment + (f"DCGM_FI_DEV_GPU_TEMP{{{_U}}} 41\nDCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{{{_U}}} 2147483647\n"
                          f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{_U}}} NaN\n").encode()
        meta = dcgm.parse(body, source="s", ts=TS).meta
        assert (meta["dcgm_blank_dropped"], meta["non_finite_dropped"]) == (1, 1)


def test_a_gpu_in_two_bodies_of_a_group_keeps_the_later_inventory_and_each_bodys_host():
    """Two pushes of one GPU in a group, the second from another host and driver, one carrying an XID: the
    inventory is the later body's (the store's upsert keeps the last) and each event names its own body's host."""
    first = 'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-a",gpu="0",Hostname="node-1",DCGM_FI_DRIVER_VERSION="570.1"} 41\n'
    first += 'DCGM_FI_DEV_XID_ERRORS{UUID="GPU-a",gpu="0",Hostname="node-1",DCGM_FI_DRIVER_VERSION="570.1"} 79\n'
    b1 = first.encode()
    b2 = b1.replace(b"570.1", b"580.2").replace(b"node-1", b"node-1b").replace(b"} 41", b"} 42")
    t2 = TS + timedelta(seconds=30)
    merged = dcgm.parse(b1, source="s", ts=TS).merge(dcgm.parse(b2, source="s", ts=t2))
    group = dcgm_lines.assemble([(dcgm_lines.read(b1), _us(TS)), (dcgm_lines.read(b2), _us(t2))], source="s")
    _frames_equal(merged, group)
    assert F.conform(F.GPU, group.gpu).select("host", "driver_version").rows() == [("node-1b", "580.2")]
    assert group.health_event.select("ts", "host").rows() == [(TS, "node-1"), (t2, "node-1b")]
    assert dcgm_lines.tuples([(dcgm_lines.read(b1), _us(TS)), (dcgm_lines.read(b2), _us(t2))])["gpu"][1] == [("GPU-a", "node-1b", 0, "580.2")]
