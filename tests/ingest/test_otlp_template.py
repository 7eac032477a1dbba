"""OTLP whole-request templates (ingest.otlp_template) and the OTLP rows the door writes (otlp.tuples):
a body read from a template gives, bit for bit, the walk the general path gives; a body it cannot vouch
for goes the general way; and the rows are what the frame path stores."""

from __future__ import annotations

import datetime as dt
import math
import random
from pathlib import Path

import polars as pl
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from polars.testing import assert_frame_equal

from fleetscope.core import frames as F
from fleetscope.core.errors import ParseError
from fleetscope.core.spec import conform
from fleetscope.store import Rows
from ingest import dcgm, otlp, otlp_template
from ingest.otlp_export import gpu_observations
from tests.ingest.test_otlp_wire import FRAMES, add_metric, dcgm_labels, kv, scrape

TS = 1_772_366_400_000_000_000
REALDATA = Path("/work/shared/realdata")
EXAMPLE = REALDATA / "telemetry/otlp-json_ExportMetricsServiceRequest_example_opentelemetry-proto.json"
PROM_8X = REALDATA / "telemetry/dcgm-exporter_metrics_8xH100_k8s-pod-labels_sampled_nvidia-aicr.prom"


@pytest.fixture(autouse=True)
def fresh_templates():
    otlp_template.clear()
    yield
    otlp_template.clear()


def general(body: bytes):
    """The general path's walk (no template), or its ParseError."""
    try:
        return otlp._parse_protobuf(body, "t")
    except ParseError as exc:
        return exc


def read(body: bytes):
    try:
        return otlp.read(body, encoding="protobuf", source="t")
    except ParseError as exc:
        return exc


def assert_same_outcome(body: bytes) -> object:
    want, got = general(body), read(body)
    if isinstance(want, ParseError):
        assert isinstance(got, ParseError) and str(got) == str(want)
        return got
    assert not isinstance(got, ParseError), got
    assert otlp_template.same_walk(got, want)
    a, b = got.batch("t"), want.batch("t")
    assert a.meta == b.meta
    for name in FRAMES:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert_frame_equal(x, y, check_exact=True)
    return got


def restamp(req: ExportMetricsServiceRequest, ts_ns: int, value=lambda v, k: v * 1.5 + k) -> bytes:
    """The same request with every point's time set to ``ts_ns`` and its value changed (same kind)."""
    req = ExportMetricsServiceRequest.FromString(req.SerializeToString())
    k = 0
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind not in ("gauge", "sum"):
                    continue
                for p in getattr(m, kind).data_points:
                    p.time_unix_nano = ts_ns
                    k += 1
                    if p.WhichOneof("value") == "as_int":
                        p.as_int = int(value(p.as_int, k)) % 1000
                    elif p.WhichOneof("value") == "as_double":
                        p.as_double = value(p.as_double, k)
    return req.SerializeToString()


def hits() -> int:
    return otlp_template._stats["hits"]


def agent_request(host: str = "node-a", ts: dt.datetime = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)) -> ExportMetricsServiceRequest:
    """What `fleetscope agent` sends for the real 8 x H100 exporter scrape (pods included): the
    OpenTelemetry SDK's own encoding."""
    from fleetscope.agent.otlp import OtlpEncoder

    batch = dcgm.parse(PROM_8X.read_bytes(), source="real", ts=ts)
    enc = OtlpEncoder(host=host)
    try:
        enc.add(gpu_observations(batch))
        body = enc.encode(ts)
    finally:
        enc.close()
    assert body
    return ExportMetricsServiceRequest.FromString(body)


def real_requests() -> list[tuple[str, ExportMetricsServiceRequest]]:
    if not EXAMPLE.is_file() or not PROM_8X.is_file():
        pytest.skip("shared real data not found")
    example = ExportMetricsServiceRequest()
    json_format.Parse(EXAMPLE.read_text(), example, ignore_unknown_fields=True)
    return [("agent-sdk", agent_request()), ("spec-example", example), ("collector-scrape", scrape(gpus=8, fields=tuple(
        ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS", "app.requests"])))]


def test_real_bodies_read_from_a_template_as_the_general_path_reads_them():
    for name, req in real_requests():
        otlp_template.clear()
        first = req.SerializeToString()
        assert_same_outcome(first)  # learns
        templated = otlp_template._stats["learned"]
        for r in range(1, 4):
            body = restamp(req, TS + r * 10**10)
            before = hits()
            assert_same_outcome(body)
            if name != "spec-example":
                assert templated == 1 and hits() == before + 1, name  # the repeat came from the template
            else:  # it carries a histogram and a summary (rejected): never templated
                assert templated == 0 and hits() == 0


def test_agent_body_values_land_where_the_general_path_puts_them():
    """Independent of the walk: the agent's real power and temperature readings come back in their columns."""
    req = agent_request()
    read(req.SerializeToString())
    body = restamp(req, TS + 10**10, value=lambda v, k: float(k))
    walk = read(body)
    assert hits() == 1
    batch = walk.batch("t")
    assert batch.gpu_sample.height == 8 and batch.gpu.height == 8
    want = {}
    k = 0
    for m in ExportMetricsServiceRequest.FromString(body).resource_metrics[0].scope_metrics[0].metrics:
        for p in getattr(m, m.WhichOneof("data")).data_points:
            k += 1
            attrs = {a.key: a.value.string_value for a in p.attributes}
            if m.name == "hw.power":
                want[attrs["hw.id"]] = float(k)
    got = dict(zip(batch.gpu_sample["gpu_uuid"].to_list(), batch.gpu_sample["power_w"].to_list()))
    assert got == want and len(want) == 8
    assert (batch.gpu_sample["ts"].dt.epoch("us") == (TS + 10**10) // 1000).all()


def base_request(gpus: int = 8) -> ExportMetricsServiceRequest:
    req = scrape(gpus=gpus, fields=("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED", "hw.power", "app.x"),
                 start_ns=TS - 5)
    sm = req.resource_metrics[0].scope_metrics[0]
    add_metric(sm, "DCGM_FI_DEV_SM_CLOCK", [(TS, 1410, dcgm_labels(i)) for i in range(gpus)])  # as_int
    for p in sm.metrics[3].gauge.data_points:
        p.attributes.append(kv("hw.type", "gpu"))
    return req


def test_mutated_bodies_fall_back_and_agree():
    """Changes a template cannot stand for: a value of the other kind, a new series, metrics reordered,
    a longer label, a truncated body: each read as the general path reads it."""
    req = base_request()
    read(req.SerializeToString())
    assert otlp_template._stats["learned"] == 1
    variants = []
    r = ExportMetricsServiceRequest(); r.CopyFrom(req)
    r.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_int = 55  # double -> int, same width
    variants.append(r.SerializeToString())
    r = ExportMetricsServiceRequest(); r.CopyFrom(req)
    add_metric(r.resource_metrics[0].scope_metrics[0], "app.y", [(TS, 1.0, [kv("k", "v")])])  # a new series
    variants.append(r.SerializeToString())
    r = ExportMetricsServiceRequest(); r.CopyFrom(req)
    ms = r.resource_metrics[0].scope_metrics[0].metrics
    order = list(ms)
    reordered = [order[1], order[0], *order[2:]]
    del ms[:]
    ms.extend(reordered)
    variants.append(r.SerializeToString())
    r = ExportMetricsServiceRequest(); r.CopyFrom(req)
    r.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[2].attributes[0].value.string_value = "12"  # one byte longer
    variants.append(r.SerializeToString())
    body = req.SerializeToString()
    variants += [body[:-1], body[: len(body) // 2], body + b"\x00", body[:-9] + b"\xff" * 9]
    for v in variants:
        assert_same_outcome(v)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e300])
def test_values_the_template_cannot_vouch_for_are_rejected_as_before(value):
    """A non-finite value, or one past an integer column's range (FB used, MiB -> bytes), in a body
    that otherwise matches a template: the general path reads it and counts the rejection."""
    req = base_request()
    read(req.SerializeToString())
    r = ExportMetricsServiceRequest(); r.CopyFrom(req)
    r.resource_metrics[0].scope_metrics[0].metrics[2].gauge.data_points[3].as_double = value  # DCGM_FI_DEV_FB_USED
    walk = assert_same_outcome(r.SerializeToString())
    assert sum(walk.rejected.values()) == 1


def test_zero_time_goes_the_general_way():
    req = base_request()
    read(req.SerializeToString())
    body = bytearray(req.SerializeToString())
    shape = otlp_template._SHAPES[len(body)][0]
    for at in shape.time_idx[5].tolist():
        body[at] = 0  # the sixth point's time, zeroed: a fixed64 field still, present
    walk = assert_same_outcome(bytes(body))
    assert sum(walk.rejected.values()) == 1


def test_hostile_byte_flips_of_a_templated_body():
    """Random flips, deletions and insertions of a body a template was made of: the same outcome (walk or
    refusal) as the general path, slots included."""
    rng = random.Random(20261205)
    req = base_request(gpus=6)
    base = req.SerializeToString()
    read(base)
    shape = otlp_template._SHAPES[len(base)][0]
    slots = shape.time_idx.ravel().tolist() + shape.value_idx.ravel().tolist()
    refused = 0
    for i in range(300):
        body = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            op = rng.random()
            at = rng.choice(slots) if i % 2 else rng.randrange(len(body))
            if op < 0.7:
                body[at] = rng.randrange(256)
            elif op < 0.85:
                del body[at:at + rng.randint(1, 4)]
            else:
                body[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        refused += isinstance(assert_same_outcome(bytes(body)), ParseError)
    assert refused > 20 and hits() > 20  # both refusals and template reads were exercised


def test_same_length_other_host_gets_its_own_template():
    """Two nodes whose bodies have one length and one shape: each reads as its own, never as the other."""
    a = scrape(gpus=8, resource={"service.name": "dcgm-exporter"})
    b = scrape(gpus=8, resource={"service.name": "dcgm-exporter"})
    for p in b.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points:
        p.attributes[1].value.string_value = p.attributes[1].value.string_value.replace("GPU-0", "GPU-9")  # same length
    body_a, body_b = a.SerializeToString(), b.SerializeToString()
    assert len(body_a) == len(body_b) and body_a != body_b
    read(body_a)
    walk = assert_same_outcome(body_b)
    assert any(g["gpu_uuid"].startswith("GPU-9") for g in walk.gpus)
    assert_same_outcome(restamp(b, TS + 10**10))
    assert otlp_template._stats["learned"] == 2 and len(otlp_template._SHAPES[len(body_a)]) == 1


def _conformed_rows(spec: F.FrameSpec, df: pl.DataFrame) -> list[tuple]:
    df = conform(spec, df)
    return sorted(df.with_columns([pl.col(c).dt.epoch("us") for c in df.columns if df.schema[c] == F.UTC_US]).rows(), key=repr)


@pytest.mark.parametrize("faults", [False, True], ids=["plain", "faults"])
def test_rows_are_what_the_frame_path_stores(faults):
    """``otlp.tuples`` of a group of requests against the conformed frames of ``gather``'s Batch; with fault
    readings, their health events too (an XID, ECC counts on every third GPU, a half count rounded as the frame
    path rounds it)."""
    fields = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "app.x")
    if faults:
        fields += ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL")

    def value(i: int, f: int, h: int) -> float:
        if f == 4:
            return 79.0 if (i, h) == (3, 1) else 0.0
        if f == 5:
            return [0.0, 2.5, 7.0][i % 3] if h != 2 else 0.0
        return float((i * 7 + f * 13 + h) % 97) + 0.5

    reqs = [scrape(gpus=8, ts=TS + 10**10, fields=fields, value=lambda i, f, h=h: value(i, f, h)) for h in range(3)]
    for h, r in enumerate(reqs):  # distinct GPUs per request, one with pods
        for m in r.resource_metrics[0].scope_metrics[0].metrics:
            for p in m.gauge.data_points:
                for a in p.attributes:
                    if a.key in ("UUID", "Hostname"):
                        a.value.string_value += f"-{h}"
                if h == 1:
                    p.attributes.extend([kv("pod", "trainer-0"), kv("namespace", "ml")])
    walks = [otlp.read(r.SerializeToString(), encoding="protobuf") for r in reqs]
    rows = otlp.tuples(walks)
    batch = otlp.gather(walks)
    assert rows is not None and set(rows) == {"gpu_sample", "gpu", "gpu_workload", "metric_sample"} | ({"health_event"} if faults else set())
    assert (batch.health_event is not None and batch.health_event.height == 1 + 5 * 2) == faults
    if faults:
        assert sorted({r[-2] for r in rows["health_event"][1]}) == ["DCGM_FI_DEV_ECC_SBE_AGG_TOTAL=2", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL=7", "XID 79"]
    for name, (cols, r) in rows.items():
        spec = F.FRAMES[name]
        got = Rows(cols, r).frame(spec)
        want = getattr(batch, name)
        assert _conformed_rows(spec, got) == _conformed_rows(spec, want), name
    # FB used is an integer column: 0.5 MiB steps scale to whole bytes; rounding is the frame path's
    assert rows["gpu_sample"][1][0][rows["gpu_sample"][0].index("fb_used_bytes")] % 1 == 0
    n_rows = {name: len(r) for name, (_, r) in rows.items() if name != "health_event"}
    assert n_rows == {"gpu_sample": 24, "gpu": 24, "gpu_workload": 8, "metric_sample": 24}
    assert [otlp.counts(w)[1] for w in walks] == [48 if faults else 32] * 3


@pytest.mark.parametrize("change", ["gpu-twice", "nul"])
def test_rows_decline_what_needs_the_frame_path(change):
    fields = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_POWER_USAGE")
    value = lambda i, f: 0.0 if f == 1 else 1.0  # noqa: E731
    a = scrape(gpus=4, fields=fields, value=value)
    if change == "nul":
        a.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].attributes[5].value.string_value = "no\x00de"
    walks = [otlp.read(a.SerializeToString(), encoding="protobuf")]
    if change == "gpu-twice":
        walks.append(otlp.read(restamp(a, TS + 1), encoding="protobuf"))
    assert otlp.tuples(walks) is None


def test_same_length_other_structure_gets_its_own_shape():
    """A body as long as a known one whose fields sit elsewhere (one label a byte shorter, another a byte
    longer): the known shape's slots are not taken for it."""
    a = scrape(gpus=8)
    b = ExportMetricsServiceRequest(); b.CopyFrom(a)
    p = b.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0]
    p.attributes[0].value.string_value += "0"  # gpu: "0" -> "00"
    p.attributes[3].value.string_value = p.attributes[3].value.string_value[:-1]  # device: "nvidia0" -> "nvidia"
    body_a, body_b = a.SerializeToString(), b.SerializeToString()
    assert len(body_a) == len(body_b)
    read(body_a)
    assert_same_outcome(body_b)
    assert len(otlp_template._SHAPES[len(body_a)]) == 2
    assert_same_outcome(restamp(b, TS + 10**10))
    assert_same_outcome(restamp(a, TS + 10**10))
    assert hits() == 2


def test_learning_backs_off_for_bodies_that_never_come_again(monkeypatch):
    """Past half the cache with few hits, one miss in 16 learns; a fleet whose nodes come again keeps learning."""
    monkeypatch.setattr(otlp_template, "_MAX_TEMPLATES", 16)
    for h in range(40):  # every body new (another GPU set each time), none read again
        read(scrape(gpus=2, value=lambda i, f, h=h: float(h), resource={"service.name": f"x{h:03d}"}).SerializeToString())
    learned = otlp_template._stats["learned"]
    assert 8 <= learned < 12  # 8 freely, then about one in 16 of the 32 misses after
    otlp_template.clear()
    fleet = [scrape(gpus=2, resource={"service.name": f"n{h:03d}"}) for h in range(12)]
    for r in range(3):
        for req in fleet:
            read(restamp(req, TS + r * 10**10))
    # 8 learned in the first round (half the cache), the other 4 once the first 8 came back
    assert otlp_template._stats["learned"] == 12 and hits() == 8 + 12


def test_shapes_are_forgotten_past_their_memory_budget(monkeypatch):
    """Bodies of ever new lengths each leave a shape; past the budget all are forgotten, and reading goes on."""
    monkeypatch.setattr(otlp_template, "_MAX_SHAPE_BYTES", 20_000)
    for g in range(1, 12):
        read(scrape(gpus=g).SerializeToString())
        assert sum(x.nbytes for v in otlp_template._SHAPES.values() for x in v) <= 20_000 + 25_000  # the budget and one more
    assert len(otlp_template._SHAPES) < 11
    assert_same_outcome(restamp(scrape(gpus=11), TS + 10**10))


def test_a_new_node_of_a_known_shape_is_read_once(monkeypatch):
    """Another node's first body, of a shape one node's gave: read from the first node's template renamed (the
    first few of a shape also read the general way, to check it), and the walk the general path gives, bit for
    bit; a value the template cannot vouch for still goes the general way and is counted as before."""
    a = scrape(gpus=8, resource={"service.name": "dcgm-exporter"})
    read(a.SerializeToString())
    reads = []
    parse = otlp._parse_protobuf
    monkeypatch.setattr(otlp, "_parse_protobuf", lambda body, source: reads.append(len(body)) or parse(body, source))
    for n in range(3):
        b = ExportMetricsServiceRequest(); b.CopyFrom(a)
        for m in b.resource_metrics[0].scope_metrics[0].metrics:
            for p in m.gauge.data_points:
                p.attributes[1].value.string_value = p.attributes[1].value.string_value.replace("GPU-0", f"GPU-{n + 1}")
                p.as_double = p.as_double * 3 + n
        body = b.SerializeToString()
        before = len(reads)
        walk = read(body)
        assert len(reads) == before + (n < otlp_template._RENAME_CHECKS)
        assert any(g["gpu_uuid"].startswith(f"GPU-{n + 1}") for g in walk.gpus)
        assert otlp_template.same_walk(walk, general(body))
        assert otlp_template.same_walk(read(restamp(b, TS + 10**10)), general(restamp(b, TS + 10**10)))
    assert otlp_template._stats["learned"] == 4 and len(otlp_template._SHAPES[len(body)]) == 1
    b.resource_metrics[0].scope_metrics[0].metrics[2].gauge.data_points[3].as_double = math.nan
    body = b.SerializeToString()
    otlp_template.clear()
    read(a.SerializeToString())
    walk = read(body)
    assert sum(walk.rejected.values()) == 1 and otlp_template.same_walk(walk, general(body))
    assert otlp_template._stats["learned"] == 1


def node_body(node: int, ts: int = TS, pod: str | None = None, gpus: int = 8) -> bytes:
    """What another node of one fleet sends: the same shape, its own GPU UUIDs, host name and (optionally) pods."""
    req = scrape(gpus=gpus, ts=ts, resource={"service.name": "dcgm-exporter", "host.name": f"host-{node:04d}"},
                 value=lambda i, f: float((i * 7 + f * 13 + node) % 97))
    for m in req.resource_metrics[0].scope_metrics[0].metrics:
        for i, p in enumerate(m.gauge.data_points):
            for a in p.attributes:
                if a.key == "UUID":
                    a.value.string_value = f"GPU-{node:04d}{i:04x}-69c4-b61d-e0bc-{node:012x}"
                elif a.key == "Hostname":
                    a.value.string_value = f"node-{node:03d}"[-8:]
            if pod is not None:
                p.attributes.append(kv("pod", f"{pod}-{node:04d}"))
                p.attributes.append(kv("namespace", "training"))
    return req.SerializeToString()


def test_other_nodes_first_bodies_are_read_renamed_as_the_general_path_reads_them():
    """A fleet's first round: each node's first body comes from the first node's template with its names
    (UUIDs, host names, pods) replaced, and equals the general path's walk, frames included."""
    for pod in (None, "trainer"):
        otlp_template.clear()
        bodies = [node_body(n, pod=pod) for n in range(12)]
        assert len({len(b) for b in bodies}) == 1
        read(bodies[0])
        for n, body in enumerate(bodies[1:], 1):
            walk = assert_same_outcome(body)
            assert walk.gpus[0]["gpu_uuid"].startswith(f"GPU-{n:04d}") and walk.gpus[0]["host"] == f"node-{n:03d}"[-8:]
            if pod:
                assert {w["pod"] for w in walk.workloads} == {f"trainer-{n:04d}"}
        assert otlp_template._stats["renamed"] == 11 and otlp_template._stats["learned"] == 12
        hits_before = hits()
        for n in range(12):  # and their next bodies hit their own templates
            assert_same_outcome(node_body(n, ts=TS + 10**10, pod=pod))
        assert hits() == hits_before + 12


def _mutate(body: bytes, old: str, new: str, count: int = -1) -> bytes:
    assert len(old) == len(new) and old.encode() in body
    return body.replace(old.encode(), new.encode(), count)


def test_renamed_reads_refuse_what_is_more_than_a_new_name():
    """Hostile or unusual second bodies of a known shape: names merged, a name split, a name taking
    another's, a value of an attribute that is not a name, a quote or a NUL or bytes that are not UTF-8
    in a name, an exporter's pod mark: none is read renamed, and each reads as the general path reads it."""
    a = node_body(1, pod="trainer-pod")
    read(a)
    uuid0 = f"GPU-0001{0:04x}-69c4-b61d-e0bc-{1:012x}"
    uuid1 = f"GPU-0001{1:04x}-69c4-b61d-e0bc-{1:012x}"
    other = node_body(2, pod="trainer-pod")
    variants = [
        _mutate(a, uuid0, uuid1),  # two GPUs become one: duplicate points
        _mutate(a, uuid0, uuid0[:-1] + "x", 1),  # one GPU's name becomes two
        _mutate(a, "training", "trainin\\"),  # a backslash
        _mutate(a, "training", 'traini"g'),
        _mutate(a, "training", "traini\x00g"),  # a NUL
        _mutate(a, "trainer-pod-0001", "dcgm-exporter-01"),  # a pod named as the exporter's own
        _mutate(a, "dcgm-exporter", "dcgm-exportes"),  # service.name: not a name the walk treats as opaque
        _mutate(a, '"0"', '"9"') if b'"0"' in a else a,
    ]
    bad = bytearray(other)
    at = other.index(b"host-0002")
    bad[at:at + 2] = b"\xff\xfe"
    variants.append(bytes(bad))  # not UTF-8: upb refuses the body
    for v in variants:
        before = otlp_template._stats["renamed"]
        assert_same_outcome(v)
        assert otlp_template._stats["renamed"] == before, variants.index(v)
    assert_same_outcome(other)
    assert otlp_template._stats["renamed"] == 1


def test_a_renamed_read_that_disagrees_with_the_general_path_turns_renaming_off(monkeypatch):
    """The first renamed reads of a shape are checked; where one differs from the general path (here a
    renaming made wrong on purpose) the general path's walk is returned and renaming stops for that shape."""
    read(node_body(1))
    rename = otlp_template._rename

    def wrong(tpl, names):
        out = rename(tpl, names)
        out.gpus = [{**g, "host": "elsewhere"} for g in out.gpus]
        return out

    monkeypatch.setattr(otlp_template, "_rename", wrong)
    body = node_body(2)
    walk = assert_same_outcome(body)
    assert walk.gpus[0]["host"] == "node-002"
    shape = otlp_template._SHAPES[len(body)][0]
    assert shape.ref.off and otlp_template._stats["renamed"] == 0
    assert_same_outcome(node_body(3))
    assert otlp_template._stats["renamed"] == 0


def test_a_name_inside_a_series_key_is_not_renamed():
    """A plain series carries the host in its key: a node differing in its host name is read the general
    way (the key is composed, not copied from one attribute), and equals it."""
    a = scrape(gpus=8, fields=("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "app.x"), resource={"service.name": "dcgm-exporter"})
    body = a.SerializeToString()
    read(body)
    walk = assert_same_outcome(_mutate(body, "node-000", "node-777"))
    assert any("node-777" in key for _, key in walk.series_rows) and otlp_template._stats["renamed"] == 0
    walk = assert_same_outcome(_mutate(body, "GPU-00000003", "GPU-00000777"))  # the series' labels hold the UUIDs too
    assert any("GPU-00000777" in key for _, key in walk.series_rows) and otlp_template._stats["renamed"] == 0


def test_lookup_renamed_spends_no_general_read(monkeypatch):
    """The API's event loop asks ``lookup_renamed``: a new node's body is read renamed only once its shape's
    renaming has passed its checks, and never with a general read."""
    read(node_body(0))
    assert otlp_template.lookup_renamed(node_body(1)) is None  # not yet checked: the worker thread's way
    for n in range(1, 1 + otlp_template._RENAME_CHECKS):
        assert_same_outcome(node_body(n))
    monkeypatch.setattr(otlp, "_parse_protobuf", lambda body, source: pytest.fail("a general read"))
    body = node_body(40)
    walk = otlp_template.lookup_renamed(body)
    assert walk is not None and walk.gpus[0]["host"] == "node-040"
    # the node's next scrape (new times, the same values' slots) is a template hit: the renamed read kept its
    # template under the key ``lookup`` looks it up by
    hits, renamed = otlp_template._stats["hits"], otlp_template._stats["renamed"]
    later = otlp_template.lookup(node_body(40, ts=TS + 10**10))
    assert later is not None and otlp_template._stats["hits"] == hits + 1 and otlp_template._stats["renamed"] == renamed
    monkeypatch.undo()
    assert otlp_template.same_walk(walk, general(body))
    assert otlp_template.same_walk(later, general(node_body(40, ts=TS + 10**10)))
    assert otlp_template.lookup_renamed(_mutate(node_body(41), "dcgm-exporter", "dcgm-exportes")) is None


def test_hostile_names_in_a_new_node_of_a_known_shape():
    """A new node's body of a known shape with its names attacked: random bytes put into the attribute values
    (quotes, NULs, bytes that are not UTF-8, the exporter's mark), one value copied over another (two GPUs made
    one, a GPU given a host's name). Whatever is read renamed equals what the general path reads; the rest is
    read the general way, with its answer or refusal."""
    rng = random.Random(20261206)
    read(node_body(1, pod="trainer-pod"))
    base = node_body(2, pod="trainer-pod")
    shape = otlp_template._SHAPES[len(base)][0]
    ref = shape.ref
    spans = [(int(a), int(b)) for a, b in zip(ref.starts, ref.ends)]
    alphabet = b'"\\\x00\xff\xfe{}=,- azAZ09.:/dcgm-exporter'
    renamed_before = otlp_template._stats["renamed"]
    for i in range(300):
        body = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            a, b = rng.choice(spans)
            if i % 3 == 0:
                c, d = rng.choice([s for s in spans if s[1] - s[0] == b - a] or [(a, b)])
                body[a:b] = base[c:d]  # another attribute's value in its place
            else:
                at = rng.randrange(a, b)
                body[at] = rng.choice(alphabet)
        assert_same_outcome(bytes(body))
    assert otlp_template._stats["renamed"] > renamed_before  # some were renamings, read without the general path



def test_a_name_given_as_a_number_turns_renaming_off():
    """A UUID attribute holding an int (the walk reads it as text): renaming another GPU's UUID to that text would
    merge two GPUs the template keeps apart, so a shape with such a name is never renamed."""
    def body(node: int) -> bytes:
        req = ExportMetricsServiceRequest.FromString(node_body(node))
        for m in req.resource_metrics[0].scope_metrics[0].metrics:
            for a in m.gauge.data_points[1].attributes:
                if a.key == "UUID":
                    a.value.int_value = 900_000_000_000 + node
        return req.SerializeToString()

    read(body(1))
    shape = otlp_template._SHAPES[len(body(1))][0]
    assert shape.ref is not None and shape.ref.off
    walk = assert_same_outcome(body(2))  # another node: read the general way, never renamed
    assert len(walk.gpus) == 8 and walk.gpus[1]["gpu_uuid"] == "900000000002" and otlp_template._stats["renamed"] == 0


def test_reads_racing_the_template_lock_agree_with_the_general_path(monkeypatch):
    """The API's event loop asks ``lookup_renamed`` (no lock for a template hit, the lock only tried) while
    worker threads read, learn and evict under it. With thread switches forced often and a cache small enough to
    be emptied again and again, every walk any of them gets is the general path's, and nothing raises."""
    import sys
    import threading

    monkeypatch.setattr(otlp_template, "_MAX_TEMPLATES", 24)  # evicted many times over 96 nodes' bodies
    evictions = []
    real_evict = otlp_template._evict
    monkeypatch.setattr(otlp_template, "_evict", lambda: (evictions.append(1), real_evict())[1])
    bodies = [node_body(n, ts=TS + r * 10**10) for r in range(3) for n in range(32)]
    want = [general(b) for b in bodies]
    read(bodies[0])
    for n in range(1, 1 + otlp_template._RENAME_CHECKS):  # renaming checked, so the event loop's way reads renamed
        read(bodies[n])
    wrong: list[str] = []
    counts = {"loop": 0, "worker": 0}

    def worker(offset: int) -> None:
        try:
            for i in range(offset, len(bodies), 3):
                got = read(bodies[i])
                counts["worker"] += 1
                if isinstance(got, ParseError) or not otlp_template.same_walk(got, want[i]):
                    wrong.append(f"worker, body {i}: {got!r}"[:200])
        except Exception as exc:  # noqa: BLE001 - reported below
            wrong.append(f"worker raised {exc!r}")

    done = threading.Event()

    def loop() -> None:
        try:
            last = False
            while not last:
                last = done.is_set()  # and one whole pass once the workers are done: templates are left then
                for i, body in enumerate(bodies):
                    got = otlp_template.lookup_renamed(body)
                    if got is not None:
                        counts["loop"] += 1
                        if not otlp_template.same_walk(got, want[i]):
                            wrong.append(f"lookup_renamed, body {i}")
        except Exception as exc:  # noqa: BLE001 - reported below
            wrong.append(f"lookup_renamed raised {exc!r}")

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        looping = threading.Thread(target=loop)
        for t in [*workers, looping]:
            t.start()
        for t in workers:
            t.join(timeout=120)
        done.set()
        looping.join(timeout=120)
    finally:
        sys.setswitchinterval(before)
    assert not wrong, wrong[:5]
    assert counts["worker"] == len(bodies) and counts["loop"] > 0, counts
    assert otlp_template._stats["renamed"] > 0 and evictions, (otlp_template._stats, len(evictions))
