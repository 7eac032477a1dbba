"""Stranded capacity on the real 981-node, 8-GPU fleet (slurmrestd v0.0.41 nodes, read by ingest.slurmrestd)
with a hand-built queue, against the free GPUs counted straight from the JSON; and on hand-built frames for
the multi-node and spreading rules."""

import datetime as dt
import json
import re

import polars as pl
import pytest

from analyzers import stranded as S
from fleetscope.core import scheduler_frames as SCH
from ingest import slurmrestd

FLEET = "scheduler/slurmrestd_v0.0.41_24.05.6_nodes_981x8gpu-fleet.json"
NOW = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)


def pending(*jobs):
    return SCH.frame(SCH.SCHED_JOB, [{"cluster": "", "job_id": str(i), "state": "PENDING", "partition": p, "gpus": g, "cpus": c, "node_count": n}
                                     for i, (p, g, c, n) in enumerate(jobs)])


def by_hand(realdata):
    """Per node of the JSON: free GPUs (gres gpu:N less tres_used gres/gpu), free CPUs, schedulable or not."""
    out = {}
    for n in json.loads((realdata / FLEET).read_bytes())["nodes"]:
        total = int(m.group(1)) if (m := re.match(r"gpu:(\d+)", n.get("gres") or "")) else 0
        used = int(m.group(1)) if (m := re.search(r"gres/gpu=(\d+)", n.get("tres_used") or "")) else 0
        ok = not {"DRAIN", "DOWN"} & set(n["state"])
        out[n["name"]] = (total - used, n["cpus"] - n["alloc_cpus"], ok, n["partitions"])
    return out


@pytest.fixture()
def fleet(realdata):
    return slurmrestd.parse((realdata / FLEET).read_bytes(), source="nodes").sched_node


def test_real_fleet_eight_gpu_queue(fleet, realdata):
    hand = by_hand(realdata)
    # a full-node job waits in main: only whole free nodes with CPUs to spare serve it
    per_node, summary = S.stranded(fleet, pending(("main", 8, 16, 1)))
    want = {h: f for h, (f, c, ok, parts) in hand.items() if ok and "main" in parts and 0 < f and not (f >= 8 and c >= 16)}
    assert sum(want.values()) == 49 and len(want) == 8  # 31 on five MIXED nodes, 18 on three whose CPUs are all taken
    s = summary.row(0, named=True)
    assert (s["partition"], s["pending_jobs"], s["stranded_gpus"], s["stranded_nodes"]) == ("main", 1, 49, 8)
    assert s["free_gpus"] == sum(f for f, c, ok, parts in hand.values() if ok and "main" in parts and f > 0)
    assert dict(per_node.filter(~pl.col("usable")).select("host", "free_gpus").iter_rows()) == want
    assert "fs-mbz-gpu-625" not in per_node["host"].to_list()  # DOWN+DRAIN: unavailable, not stranded
    # a four-GPU job in lowprio uses the part-free nodes with CPUs left; the three CPU-full ones stay stranded
    _, summary = S.stranded(fleet, pending(("lowprio", 4, 8, None)))
    assert summary.select("partition", "stranded_gpus", "stranded_nodes").rows() == [("lowprio", 18, 3)]
    # nothing pending: free GPUs are idle, not stranded
    assert S.stranded(fleet, pending())[1].height == 0


def test_findings_with_cost(fleet):
    per_node, summary = S.stranded(fleet, pending(("main", 8, 16, 1), ("main,lowprio", 16, 32, None)))
    assert summary.select("partition", "pending_jobs", "min_gpus_per_node", "stranded_gpus").rows() == [("lowprio", 1, 8, 49), ("main", 2, 8, 49)]
    prices = {h: (2.5, "EUR") for h in per_node["host"].to_list()}
    f = S.stranded_findings(per_node, summary, since=NOW - dt.timedelta(minutes=3), now=NOW, prices=prices)
    r = f.filter(pl.col("subject") == "partition:main").row(0, named=True)
    ev = json.loads(r["evidence"])
    assert (r["kind"], r["score"], ev["cost_per_hour"], ev["currency"]) == ("stranded_capacity", 49.0, 49 * 2.5, "EUR")
    assert r["window_start"] == NOW - dt.timedelta(minutes=3) and "122.50 EUR/h" in r["summary"]


def test_multi_node_and_spread_by_hand():
    nodes = SCH.frame(SCH.SCHED_NODE, [
        {"cluster": "c", "host": h, "state": st, "gpus_total": 8, "gpus_alloc": a, "cpus_total": 64, "cpus_alloc": 0, "partitions": "p"}
        for h, st, a in (("a", "IDLE", 0), ("b", "MIXED", 2), ("c", "MIXED", 4), ("d", "MIXED", 7), ("e", "IDLE+DRAIN", 0), ("f", "MIXED", None))])
    running = pl.DataFrame({"cluster": ["c"], "job_id": ["9"], "host": ["f"], "gpus": [5]})
    # 2 nodes × 6 GPUs: only b (6 free) and a (8) fit: placeable, so c (4), d (1) and f (8 - 5 held = 3) are stranded
    per_node, summary = S.stranded(nodes, SCH.frame(SCH.SCHED_JOB, [{"cluster": "c", "job_id": "1", "state": "PENDING", "partition": "p",
                                                                      "gpus": 12, "node_count": 2}]), running)
    assert dict(per_node.select("host", "usable").iter_rows()) == {"a": True, "b": True, "c": False, "d": False, "f": False}
    assert summary.row(0, named=True)["stranded_gpus"] == 4 + 1 + 3
    # 3 nodes × 6 GPUs: only two nodes fit, so the job is placeable nowhere and every free GPU is stranded
    _, summary = S.stranded(nodes, SCH.frame(SCH.SCHED_JOB, [{"cluster": "c", "job_id": "1", "state": "PENDING", "partition": "p",
                                                               "gpus": 18, "node_count": 3}]), running)
    assert summary.row(0, named=True)["stranded_gpus"] == 8 + 6 + 4 + 1 + 3
    # --gpus=12 with no node count is spread over two 8-GPU nodes (6 each): the same answer as the first
    _, summary = S.stranded(nodes, SCH.frame(SCH.SCHED_JOB, [{"cluster": "c", "job_id": "1", "state": "PENDING", "partition": "p", "gpus": 12}]), running)
    assert summary.row(0, named=True)["stranded_gpus"] == 8
