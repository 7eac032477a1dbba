"""NCCL debug-log parser: the real NCCL 2.12.7 mpirun log, COLL/WARN lines in NCCL's own format
(enqueue.cc, debug.cc), and hostile input."""

from __future__ import annotations

import datetime as dt
from datetime import datetime, timedelta, timezone

import pytest

from fleetscope.core.errors import ParseError
from fleetscope.core.frames import COLLECTIVE, HEALTH_EVENT
from ingest import nccl_log

T4 = "nccl-debug-info+all_reduce_perf_2xT4_EFA_nccl-2.12.7_mpirun.log"
P0 = "[1,0]<stdout>:test-nccl-efa-worker-0:21:21 [0] NCCL INFO "
P1 = "[1,1]<stdout>:test-nccl-efa-worker-1:21:21 [0] NCCL INFO "


def _coll(prefix: str, opcount: str, comm: str, count: int = 1024, dtype: int = 7, op: str = "AllReduce") -> str:
    # the INFO(NCCL_COLL, ...) format string of NCCL's enqueue.cc
    return (f"{prefix}{op}: opCount {opcount} sendbuff 0x7fdd7e000000 recvbuff 0x7fdd7c000000 count {count} "
            f"datatype {dtype} op 0 root 0 comm {comm} [nranks=2] stream 0x5581a7a0a1f0")


def _with_colls(raw: bytes, *lines: str) -> bytes:
    # after both Init COMPLETE lines, before Destroy
    head, sep, tail = raw.partition(b"[1,0]<stdout>:#\n[1,0]<stdout>:#      ")
    return head + "\n".join(lines).encode() + b"\n" + sep + tail


def test_real_log_communicators_and_topology(telemetry):
    path = telemetry / T4
    b = nccl_log.parse(path.read_bytes(), source=str(path))
    assert b.meta["nccl_version"] == "2.12.7+cuda11.4"
    comms = {c["rank"]: c for c in b.meta["communicators"]}
    assert set(comms) == {0, 1}
    assert (comms[0]["host"], comms[0]["comm"], comms[0]["bus_id"], comms[0]["cuda_dev"]) == (
        "test-nccl-efa-worker-0", "0x7fde98000f60", "35000", 0)
    assert (comms[1]["host"], comms[1]["comm"], comms[1]["bus_id"]) == ("test-nccl-efa-worker-1", "0x7f9c0c000f60", "f5000")
    assert all(c["nranks"] == 2 and c["pid"] == 21 and c["destroyed"] for c in comms.values())
    assert not any(c["comm_id_is_global"] for c in comms.values())  # 2.12 prints no commId
    assert [(r["rank"], r["host"], r["bus_id"]) for r in b.meta["job_ranks"]] == [
        (0, "test-nccl-efa-worker-0", "35000"), (1, "test-nccl-efa-worker-1", "f5000")]
    topo = {t["rank"]: t for t in b.meta["topology"]}
    assert topo[0]["rings"] == {0: [0, 1], 1: [0, 1]}
    assert topo[0]["trees"] == {0: {"rank": 0, "up": -1, "down": [1]}, 1: {"rank": 0, "up": 1, "down": []}}
    assert topo[1]["trees"][0] == {"rank": 1, "up": 0, "down": []}
    assert topo[0]["transports"] == ["NET"] and len(topo[0]["connections"]) == 4
    send = [c for c in topo[0]["connections"] if c["direction"] == "send" and c["channel"] == 1][0]
    assert (send["from_rank"], send["from_bus"], send["to_rank"], send["to_bus"], send["transport"]) == (
        0, "35000", 1, "f5000", "NET/AWS Libfabric/0")
    assert b.collective.height == 0 and b.health_event.height == 0
    assert b.meta["skipped_lines"] >= 40  # the nccl-tests table and ssh warnings are not NCCL lines


def test_coll_lines_become_collective_rows(telemetry):
    raw = _with_colls(
        (telemetry / T4).read_bytes(),
        _coll(P0, "0", "0x7fde98000f60"),
        _coll(P1, "0", "0x7f9c0c000f60"),
        _coll(P0, "a", "0x7fde98000f60", count=262144, dtype=9, op="ReduceScatter"),
        _coll(P0, "a", "0x7fde98000f60", count=262144, dtype=9, op="ReduceScatter"),  # re-sent line
        _coll(P0, "b", "0xdeadbeef"),  # communicator whose init is not in the log
    )
    b = nccl_log.parse(raw, source="t4.log", job_id="job-7")
    df = b.collective
    assert df.schema == COLLECTIVE.schema and df.height == 3
    assert b.meta["duplicates_dropped"] == 1 and b.meta["collectives_unknown_comm"] == 1
    r0 = df.filter((df["rank"] == 0) & (df["seq"] == 0)).row(0, named=True)
    assert (r0["op"], r0["bytes"], r0["dtype"], r0["nranks"], r0["host"], r0["job_id"]) == (
        "AllReduce", 4096, "float32", 2, "test-nccl-efa-worker-0", "job-7")
    rs = df.filter(df["seq"] == 10).row(0, named=True)  # opCount is printed in hex
    assert (rs["op"], rs["bytes"], rs["dtype"]) == ("ReduceScatter", 524288, "bfloat16")
    assert df.filter(df["rank"] == 1)["comm_id"][0] == "test-nccl-efa-worker-1:21:0x7f9c0c000f60"


NEW_LOG = """\
2024-05-01T10:00:00.120Z [2024-05-01 10:00:00.118] node-a:4242:4250 [3] NCCL INFO comm 0x55d5c5a0 rank 3 nranks 16 cudaDev 3 nvmlDev 3 busId 3b000 commId 0x8d0b4ef7d0a4ecbe - Init COMPLETE
[2024-05-01 10:00:01.500] node-a:4242:4242 [3] NCCL INFO AllGather: opCount 1f sendbuff 0x7f00 recvbuff 0x7f10 count 8192 datatype 6 op 0 root 0 comm 0x55d5c5a0 [nranks=16] stream 0x9
[2024-05-01 10:00:02] node-a:4242:4260 [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<46563> with status=12 opcode=0 len=0 vendor err 129 (Recv)
[2024-05-01 10:00:02] node-a:4242:4260 [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<46563> with status=12 opcode=0 len=0 vendor err 129 (Recv)
[2024-05-01 10:00:02] node-a:4242:4260 [3] proxy.cc:1456 NCCL WARN [Service thread] Error encountered progressing operation=Connect, res=3, closing connection
node-a:4242:4261 [3] enqueue.cc:88 NCCL WARN Cuda failure 'an illegal memory access was encountered'
training step 10 loss 2.3
"""


def test_newer_nccl_log_with_commid_timestamps_and_warnings():
    b = nccl_log.parse(NEW_LOG.encode(), source="new.log")
    (c,) = b.meta["communicators"]
    assert (c["comm_id"], c["comm_id_is_global"], c["nvml_dev"], c["rank"], c["nranks"]) == (
        "0x8d0b4ef7d0a4ecbe", True, 3, 3, 16)
    row = b.collective.row(0, named=True)
    assert (row["seq"], row["bytes"], row["dtype"], row["comm_id"]) == (31, 16384, "float16", "0x8d0b4ef7d0a4ecbe")
    assert row["start"] == datetime(2024, 5, 1, 10, 0, 1, 500000, tzinfo=timezone.utc)
    he = b.health_event
    assert he.schema == HEALTH_EVENT.schema
    assert he.height == 2  # the re-sent IB warning is one row; the untimed one has no row
    assert set(he["kind"]) == {"nccl_warn"} and set(he["host"]) == {"node-a"} and set(he["gpu_uuid"]) == {""}
    assert he["code"].n_unique() == 2  # same second, different warnings: distinct keys
    assert any("status=12" in m for m in he["message"]) and "nccl transport/net_ib.cc:1295" in set(he["source"])
    assert b.meta["warnings_without_ts"] == 1 and len(b.meta["warnings"]) == 4
    assert b.meta["skipped_lines"] == 1
    fallback = datetime(2024, 5, 1, 11, tzinfo=timezone.utc)
    assert nccl_log.parse(NEW_LOG.encode(), source="new.log", default_ts=fallback).health_event.height == 3


def test_local_timestamps_follow_tz_argument():
    line = "[2024-05-01 12:00:02] node-a:1:2 [0] enqueue.cc:88 NCCL WARN boom\n"
    b = nccl_log.parse(line.encode(), source="x", tz=timezone(timedelta(hours=2)))
    assert b.health_event["ts"][0] == datetime(2024, 5, 1, 10, 0, 2, tzinfo=timezone.utc)


INIT = "node-a:1:2 [0] NCCL INFO comm 0xabc rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"


@pytest.mark.parametrize(
    "data, line, field",
    [
        (b"", None, None),
        (b"\n\n   \n", None, None),
        (b"\x00\x01\x02\x03", 1, None),
        (INIT.encode() + b"\xc3\x28 bad utf8\n", 2, None),
        (INIT.encode() + b"node-a:1:2 [0] NCCL INFO " + b"x" * 70000 + b"\n", 2, None),
        (b"just an application log\nno nccl here\n", None, None),
        ((INIT + _coll("node-a:1:2 [0] NCCL INFO ", "1", "0xabc").replace("count 1024", "count -5")).encode(), 2,
         "opCount"),
        ((INIT + _coll("node-a:1:2 [0] NCCL INFO ", "1", "0xabc")[:-40]).encode(), 2, "opCount"),  # truncated
        ((INIT + _coll("node-a:1:2 [0] NCCL INFO ", "1" * 17, "0xabc")).encode(), 2, "opCount"),
        ((INIT + _coll("node-a:1:2 [0] NCCL INFO ", "ffffffffffffffff", "0xabc")).encode(), 2, "opCount"),
        ((INIT + _coll("node-a:1:2 [0] NCCL INFO ", "1", "0xabc", count=10**19, dtype=8)).encode(), 2, "count"),
        ((INIT + _coll("node-a:1:2 [0] NCCL INFO ", "1", "0xabc").replace("nranks=2", "nranks=3")).encode(), 2,
         "nranks"),
        (b"node-a:1:2 [0] NCCL INFO comm 0xabc rank 5 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n", 1, "rank"),
        (b"[2024-13-45 99:00:00] node-a:1:2 [0] x.cc:1 NCCL WARN y\n", 1, "timestamp"),
    ],
)
def test_bad_input(data, line, field):
    with pytest.raises(ParseError) as e:
        nccl_log.parse(data, source="bad.log")
    assert e.value.source == "bad.log" and e.value.line == line
    if field:
        assert e.value.field == field


WATCHDOG_LOG = (
    "2026-12-01T10:00:00Z node7:1234:1234 [3] NCCL INFO comm 0x55 rank 3 nranks 8 cudaDev 3 busId 1a000 commId 0xabc - Init COMPLETE\n"
    "2026-12-01T10:10:00.123Z [rank3]:[E1201 10:10:00.123456789 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600046 milliseconds "
    "before timing out.\n"
    "[rank5]:[E1201 10:10:01 ProcessGroupNCCL.cpp:616] [Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
    "OpType=BROADCAST, Timeout(ms)=1800000) ran for 1800002 milliseconds before timing out.\n"
).encode()


def test_pytorch_watchdog_timeouts_are_health_events_with_the_stuck_collective():
    b = nccl_log.parse(WATCHDOG_LOG, source="train.log", job_id="train-9")
    (e,) = b.health_event.to_dicts()  # rank 5's line has no time of its own and none was given
    assert (e["kind"], e["code"], e["host"], e["value"]) == ("nccl_watchdog_timeout", 3, "node7", 600.046)
    assert e["message"] == "job train-9: rank 3 ALLREDUCE SeqNum=1234 ran 600.046 s, past its timeout of 600 s"
    assert e["ts"] == dt.datetime(2026, 12, 1, 10, 10, 0, 123000, tzinfo=dt.UTC)
    assert b.meta["watchdog_timeouts"] == 2 and b.meta["watchdog_without_ts"] == 1
    # with the caller's time, the second one counts too, as its own row (a different rank)
    both = nccl_log.parse(WATCHDOG_LOG, source="train.log", default_ts=dt.datetime(2026, 12, 1, 10, 11, tzinfo=dt.UTC)).health_event
    assert sorted(both["code"].to_list()) == [3, 5] and both.filter(both["code"] == 5)["value"][0] == 1800.002


def test_a_watchdog_line_cut_or_forged_is_not_a_timeout():
    cut = WATCHDOG_LOG.split(b" ran for ")[0] + b"\n"
    with pytest.raises(ParseError):  # no NCCL line and no complete watchdog line: not an NCCL log at all
        nccl_log.parse(cut.split(b"\n", 1)[1], source="cut.log")
    b = nccl_log.parse(cut, source="cut.log", job_id="j")
    assert b.health_event.height == 0 and b.meta["watchdog_timeouts"] == 0
    huge = b"[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(" + b"A" * 60_000 + b") ran for 5 milliseconds before timing out\n"
    assert nccl_log.parse(WATCHDOG_LOG + huge, source="h.log", job_id="j").meta["watchdog_timeouts"] == 2  # past 2,000 characters: ignored
