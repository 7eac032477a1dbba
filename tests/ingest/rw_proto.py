"""An encoder for Prometheus remote-write 1.0 bodies that shares nothing with ``ingest.remote_write``:
Google's protobuf runtime, over the spec's messages (prompb/types.proto, prompb/remote.proto) declared
here as a descriptor. Also the series of a Prometheus text body, read by prometheus_client's parser."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]

_F = descriptor_pb2.FieldDescriptorProto


def _classes():  # type: ignore[no-untyped-def]
    fdp = descriptor_pb2.FileDescriptorProto(name="fleetscope_tests/prompb.proto", package="prometheus", syntax="proto3")

    def msg(name: str, *fields: tuple[str, int, int, str | None, bool]) -> None:
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, type_name, repeated in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
            if type_name:
                f.type_name = type_name

    msg("Label", ("name", 1, _F.TYPE_STRING, None, False), ("value", 2, _F.TYPE_STRING, None, False))
    msg("Sample", ("value", 1, _F.TYPE_DOUBLE, None, False), ("timestamp", 2, _F.TYPE_INT64, None, False))
    msg("Exemplar", ("labels", 1, _F.TYPE_MESSAGE, ".prometheus.Label", True), ("value", 2, _F.TYPE_DOUBLE, None, False),
        ("timestamp", 3, _F.TYPE_INT64, None, False))
    msg("TimeSeries", ("labels", 1, _F.TYPE_MESSAGE, ".prometheus.Label", True), ("samples", 2, _F.TYPE_MESSAGE, ".prometheus.Sample", True),
        ("exemplars", 3, _F.TYPE_MESSAGE, ".prometheus.Exemplar", True))
    msg("MetricMetadata", ("type", 1, _F.TYPE_INT32, None, False), ("metric_family_name", 2, _F.TYPE_STRING, None, False),
        ("help", 4, _F.TYPE_STRING, None, False), ("unit", 5, _F.TYPE_STRING, None, False))
    msg("WriteRequest", ("timeseries", 1, _F.TYPE_MESSAGE, ".prometheus.TimeSeries", True),
        ("metadata", 3, _F.TYPE_MESSAGE, ".prometheus.MetricMetadata", True))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"prometheus.{n}")) for n in ("WriteRequest", "TimeSeries", "MetricMetadata")}


_MSG = _classes()
WriteRequest = _MSG["WriteRequest"]

Series = tuple[Mapping[str, str], Iterable[tuple[float, int]]]


def write_request(series: Iterable[Series], metadata: Iterable[tuple[str, str]] = ()) -> bytes:
    """A serialized WriteRequest; each series' labels (``__name__`` included) sorted by name, as the
    spec requires of senders."""
    req = WriteRequest()
    for labels, samples in series:
        ts = req.timeseries.add()
        for k in sorted(labels):
            ts.labels.add(name=k, value=labels[k])
        for value, t in samples:
            ts.samples.add(value=value, timestamp=t)
    for family, help_ in metadata:
        req.metadata.add(type=1, metric_family_name=family, help=help_)
    return req.SerializeToString()


def text_series(body: str, ts_ms: int, extra: Mapping[str, str] | None = None) -> list[Series]:
    """The series of a Prometheus text body, each with one sample at ``ts_ms``, as Prometheus would
    forward them after a scrape that added ``extra`` target labels (prometheus_client's line parser)."""
    # Line by line: the family reader would rename counters (``_total``), which Prometheus does not.
    from prometheus_client.parser import _parse_sample

    out: list[Series] = []
    for line in body.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        s = _parse_sample(line)
        labels = {k: v for k, v in s.labels.items() if v != ""}  # Prometheus drops empty labels
        out.append(({"__name__": s.name, **labels, **(extra or {})}, [(s.value, ts_ms)]))
    return out
