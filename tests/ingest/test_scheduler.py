"""Slurm and Kubernetes scheduler parsers on the real files in ../shared/realdata/scheduler (read in place).

Figures are recomputed here from the raw bytes with a few lines of Python, independently of the parsers,
and a few are pinned as literals checked by hand against SOURCES.md."""

from __future__ import annotations

import datetime as dt
import json

import polars as pl
import pytest

from fleetscope.core import slurm
from fleetscope.core.errors import ParseError
from ingest import kube_state, slurm_sacct, slurm_scontrol, slurm_squeue, slurmrestd

T0 = dt.datetime(2026, 11, 15, 12, tzinfo=dt.UTC)
SACCT = "scheduler/slurm_sacct-parsable-snowman-delim_habrok_gres-gpu.txt"


def _secs(text: str) -> int:
    days, _, hms = text.rpartition("-")
    parts = [int(float(p)) for p in hms.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


# --- the pure helpers -------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "hosts"), [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("ia[1-2]", ["ia1", "ia2"]),
    ("cn[1-3],gpu1", ["cn1", "cn2", "cn3", "gpu1"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("n[0111-0113]", ["n0111", "n0112", "n0113"]),
    ("None assigned", []), ("(null)", []), ("", []), ("a100gpu2", ["a100gpu2"]),
])
def test_hostlist(text, hosts):
    assert slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad", ["n[1-", "n]1[", "n[3-1]", "n[a-b]", "n[0-999999999]", "n[1-2]x[1-200000]", "bad host", "n[1-2]]"])
def test_hostlist_refuses_malformed_and_huge(bad):
    with pytest.raises(ValueError):
        slurm.expand_hostlist(bad)


def test_gres_tres_and_durations():
    assert slurm.gres_gpus("gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)") == (6, {"h100": 2, "h200": 4}, (0, 1, 2, 3, 4, 5))
    assert slurm.gres_gpus("gpu:(null):8(IDX:0-7)") == (8, {}, tuple(range(8)))
    assert slurm.gres_gpus("gpu:8(S:0-1)") == (8, {}, None)  # sockets, not device indices
    assert slurm.gres_gpus("gpu:1g.10gb:9(IDX:0-3,5-9)")[0] == 9
    assert slurm.tres_gpus(slurm.parse_tres("billing=8,cpu=8,gres/gpu:v100=1,gres/gpu=1,mem=10G,node=1")) == (1, {"v100": 1})
    assert slurm.tres_gpus(slurm.parse_tres("billing=24,cpu=8,mem=199G,node=1")) == (None, {})  # unknown, not zero
    assert slurm.tres_per_gpus("gres/gpu:h100:1,gres/gpu:h200:1") == (2, {"h100": 1, "h200": 1})
    assert slurm.tres_per_gpus("gres/gpu:12") == (12, {})
    assert slurm.parse_duration_s("2-21:09:16") == 248956
    assert slurm.parse_duration_s("23:08.358") == pytest.approx(1388.358)
    assert slurm.parse_duration_s("UNLIMITED") is None
    assert slurm.job_state("CANCELLED by 33128806") == ("CANCELLED", "33128806", ())
    assert slurm.job_state(["IDLE", "COMPLETING"])[2] == ("COMPLETING",)
    for bad in ("1-2", "xx:yy", "12"):
        with pytest.raises(ValueError):
            slurm.parse_duration_s(bad)
    with pytest.raises(ValueError):
        slurm.parse_tres("cpu")
    with pytest.raises(ValueError):
        slurm.gres_gpus("gpu:h100:2(IDX:5-1)")


# --- sacct -P text ----------------------------------------------------------------------------

def test_sacct_figures_match_the_raw_text(realdata):
    raw = (realdata / SACCT).read_text("utf-8")
    b = slurm_sacct.parse(raw.encode(), source="sacct")
    jobs = b.sched_job
    # Independently: job rows are the lines whose JobID has no '.'; GPUs the untyped gres/gpu in AllocTRES (field 23).
    rows = [ln.split("\u2603") for ln in raw.splitlines() if ln and "." not in ln.split("\u2603")[0]]
    assert jobs.height == len(rows) == 100
    want_states: dict[str, int] = {}
    for r in rows:
        s = r[8].split(" by ")[0]
        want_states[s] = want_states.get(s, 0) + 1
    assert dict(jobs["state"].value_counts().iter_rows()) == want_states
    assert want_states == {"COMPLETED": 66, "CANCELLED": 8, "FAILED": 8, "TIMEOUT": 7, "PENDING": 7, "RUNNING": 3, "NODE_FAIL": 1}
    gpu_h = 0.0
    n_gpu = 0
    for r in rows:
        tres = dict(p.split("=", 1) for p in r[22].split(",") if "=" in p)
        if "gres/gpu" in tres:
            n_gpu += 1
            gpu_h += int(tres["gres/gpu"]) * _secs(r[13]) / 3600
    got = jobs.filter(pl.col("gpus").is_not_null()).select((pl.col("gpus") * pl.col("elapsed_s")).sum() / 3600).item()
    assert n_gpu == 9 and got == pytest.approx(gpu_h) and round(got, 2) == 220.40
    j = {r["job_id"]: r for r in jobs.to_dicts()}
    assert j["8150389"]["gpus"] == 2 and j["8150389"]["elapsed_s"] == 248956 and j["8150389"]["cancelled_by"] == "33128806"
    assert j["8150389"]["gpus"] * j["8150389"]["elapsed_s"] / 3600 == pytest.approx(138.3089, abs=1e-4)
    w = j["7946767"]
    assert (w["start_at"] - w["submit_at"]).total_seconds() == 51018 and w["gpu_types"] == "v100:1"
    assert (j["7965768"]["start_at"] - j["7965768"]["submit_at"]).total_seconds() == 8132
    # The pitfall: an older GPU-partition job without gres/gpu in AllocTRES has no GPU count, not zero.
    assert j["4034541"]["gpus"] is None and j["4034541"]["partition"] == "gpumedium"
    pend = jobs.filter(pl.col("state") == "PENDING")
    assert pend["start_at"].null_count() == 7 and pend["nodes"].null_count() == 7
    # Nodes: each job row's NodeList expanded; a single-node job's GPUs are that node's.
    want_nodes = sum(len(slurm.expand_hostlist(r[4])) for r in rows)
    assert b.sched_job_node.height == want_nodes
    node = b.sched_job_node.filter((pl.col("job_id") == "7965768"))
    assert node.select("host", "gpus").rows() == [("v100gpu16", 1)]
    # Steps carry the GPU utilisation the cluster gathered.
    st = b.sched_step.filter((pl.col("job_id") == "7965768") & (pl.col("step") == "batch"))
    assert st["gpu_util_ratio"].item() == 0.9 and st["gpu_mem_bytes"].item() == 20500736 * 1024
    assert b.job.height == 100 and b.job.filter(pl.col("job_id") == "8150389")["owner"].item() is not None


def test_sacct_with_a_header_and_hostile_inputs():
    text = b"JobID|JobName|Account|User|State|Submit|Start|End|Elapsed|AllocTRES|NodeList|NNodes|ExitCode|\n" \
           b"42|train|ml|ana|PREEMPTED|2026-11-01T00:00:00|2026-11-01T00:10:00|2026-11-01T02:10:00|02:00:00|cpu=8,gres/gpu=16|gpu[01-02]|2|0:15|\n"
    b = slurm_sacct.parse(text, source="s")
    r = b.sched_job.to_dicts()[0]
    assert (r["account"], r["state"], r["gpus"], r["exit_code"], r["exit_signal"]) == ("ml", "PREEMPTED", 16, 0, 15)
    assert b.sched_job_node["host"].to_list() == ["gpu01", "gpu02"] and b.sched_job_node["gpus"].null_count() == 2
    cases = [
        (b"", "empty"),
        (b"just words\n", "delimiter"),
        (b"1|2|3|\n", "fields"),  # three fields, no header: no known layout
        (text[: len(text) - 40], "fields"),  # truncated last line
        (text.replace(b"gpu[01-02]", b"gpu[01-0"), "unclosed"),
        (text.replace(b"gpu[01-02]", b"g[0-99999999]"), "more than"),
        (text.replace(b"2026-11-01T00:10:00", b"yesterday"), "bad time"),
        (text.replace(b"02:00:00", b"forever"), "bad duration"),
        (text.replace(b"42|", b"'; DROP TABLE job;--|"), "not a Slurm job id"),
        (text + b"\x00\n", "NUL"),
        (b"\xff\xfe" * 10, "UTF-8"),
    ]
    for data, words in cases:
        with pytest.raises(ParseError, match=words):
            slurm_sacct.parse(data, source="s")
    with pytest.raises(ParseError, match="exceeds"):
        slurm_sacct.parse(b"x" * (slurm_sacct.MAX_INPUT_BYTES + 1), source="s")
    with pytest.raises(ParseError, match="longer than"):
        slurm_sacct.parse(text + b"1|" + b"x" * slurm_sacct.MAX_LINE_BYTES + b"\n", source="s")


def test_sstat_steps(realdata):
    raw = (realdata / "scheduler/slurm_sstat-parsable_habrok.txt").read_bytes()
    b = slurm_sacct.parse_sstat(raw, ts=T0, source="sstat")
    ids = {tuple(ln.split("|")[0].split(".")) for ln in raw.decode().splitlines() if ln}
    assert b.sched_step.height == len(ids)  # a step sampled twice is one row
    s = {(r["job_id"], r["step"]): r for r in b.sched_step.to_dicts()}
    assert s[("8298012", "batch")]["gpu_util_max_ratio"] == 0.87 and s[("8298012", "batch")]["gpu_util_ratio"] == 0.07
    assert s[("8298012", "batch")]["gpu_mem_bytes"] == 12900608 * 1024
    assert s[("8202099", "batch")]["gpu_util_max_ratio"] == 0.98 and s[("8202099", "batch")]["gpu_mem_bytes"] == 30778 * 2**20
    with pytest.raises(ParseError, match="timestamps"):
        slurm_sacct.parse_sstat(raw, ts=None, source="sstat")  # type: ignore[arg-type]


# --- squeue and scontrol text -----------------------------------------------------------------

def test_squeue_reasons_and_nodes(realdata):
    raw = (realdata / "scheduler/slurm_squeue-dependency-reason-cpus_habrok.txt").read_bytes()
    b = slurm_squeue.parse(raw, ts=T0)
    j = {r["job_id"]: r for r in b.sched_job.to_dicts()}
    assert len(j) == 10 and sum(1 for r in j.values() if r["state_reason"] == "Dependency") == 3
    assert sum(1 for r in j.values() if r["state_reason"] == "Priority") == 3
    assert j["8326038"]["state_reason"].startswith("Nodes required for job are DOWN, DRAINED")
    assert j["7219441"]["dependency"] == "afterany:7219440(unfulfilled)" and j["7219441"]["cpus"] == 384
    assert dict(b.sched_job_node.select("job_id", "host").iter_rows()) == {"8322514_33": "gelifes3", "8298012": "v100gpu21", "8202099": "a100gpu3"}
    for bad in (b"1|x\n", b"abc|(null);(Priority);1\n", b"1|(null);n[1-;1\n"):
        with pytest.raises(ParseError):
            slurm_squeue.parse(bad, ts=T0)


def test_scontrol_nodes_gpus(realdata):
    raw = (realdata / "scheduler/slurm_scontrol-show-nodes-cfgtres_habrok.txt").read_text()
    b = slurm_scontrol.parse(raw.encode(), ts=T0)
    want = 0
    for ln in raw.splitlines():
        tres = dict(p.split("=", 1) for p in ln.split("CfgTRES=", 1)[1].split(",") if "=" in p)
        want += int(tres.get("gres/gpu", 0))
    assert b.sched_node.height == 183 and want == 58 and b.sched_node["gpus_total"].sum() == 58
    assert b.meta["gpu_nodes"] == 40
    assert b.sched_node.filter(pl.col("host") == "a100gpu1").select("gpus_total", "gpu_types").row(0) == (4, "a100:4")
    full = b"NodeName=g1 State=IDLE+DRAIN CfgTRES=cpu=64,gres/gpu=8 AllocTRES= Reason=bad ECC = yes [root@2026-11-01T10:00:00]\n"
    r = slurm_scontrol.parse(full, ts=T0).sched_node.to_dicts()[0]
    assert (r["state"], r["reason"], r["reason_set_by"], r["gpus_total"]) == ("IDLE+DRAIN", "bad ECC = yes", "root", 8)
    with pytest.raises(ParseError):
        slurm_scontrol.parse(b"NodeName=; rm -rf / CfgTRES=x\n", ts=T0)


# --- slurmrestd JSON, every data_parser version -------------------------------------------------

def _load(realdata, name):
    raw = (realdata / "scheduler" / name).read_bytes()
    return json.loads(raw), slurmrestd.parse(raw, source=name, ts=T0)


def test_every_json_file_parses_with_its_version(realdata):
    for p in sorted((realdata / "scheduler").glob("*.json")):
        doc = json.loads(p.read_bytes())
        b = slurmrestd.parse(p.read_bytes(), source=p.name, ts=T0)
        assert b.meta["data_parser"] == p.name.split("_")[1], p.name
        for kind in ("jobs", "nodes", "partitions", "accounts"):
            if kind in doc:
                got = {"jobs": b.sched_job, "nodes": b.sched_node, "partitions": b.sched_partition, "accounts": b.sched_account}[kind]
                assert got.height == len(doc[kind]), p.name


def test_gpus_allocated_per_node(realdata):
    doc, b = _load(realdata, "slurmrestd_v0.0.40_23.11.1_nodes_talapas-gpu-mig.json")
    want = sum(int(slurm.parse_tres(n["tres_used"]).get("gres/gpu", 0)) for n in doc["nodes"])
    assert b.sched_node["gpus_alloc"].sum() == want == 16
    assert dict(b.sched_node.select("host", "gpus_alloc").iter_rows())["n0162"] == 9
    doc, b = _load(realdata, "slurmrestd_v0.0.41_24.05.6_nodes_981x8gpu-fleet.json")
    assert b.sched_node.height == 981 and b.sched_node["gpus_total"].sum() == 7784 and b.sched_node["gpus_alloc"].sum() == 2263
    drained = b.sched_node.filter(pl.col("reason").is_not_null()).sort("host")
    assert drained.select("host", "reason_set_by").rows() == [("fs-mbz-gpu-622", "root"), ("fs-mbz-gpu-625", "slurm"), ("fs-mbz-gpu-740", "root")]
    _, b = _load(realdata, "slurmrestd_v0.0.42_24.11_slurm-node-with-gpus-model-allocated.json")
    assert b.sched_node.select("host", "gpus_total", "gpus_alloc", "gpu_types").row(0) == ("ia1", 6, 6, "h100:2,h200:4")
    _, b = _load(realdata, "slurmrestd_v0.0.44_25.11_slurm-nodes.json")
    g = dict(b.sched_node.select("host", "gpus_total").iter_rows())
    assert (g["gpu1"], g["gpu3"]) == (4, 4)


def test_gpus_only_in_tres_per_and_gres_detail(realdata):
    _, b = _load(realdata, "slurmrestd_v0.0.40_23.11_slurm-job-gpus-multi-nodes.json")
    assert b.sched_job.select("job_id", "gpus", "gpu_source").row(0) == ("793", 12, "gres_detail")
    assert b.sched_job_node.sort("host").select("host", "gpus", "gpu_indices").rows() == [("ia1", 6, "0,1,2,3,4,5"), ("ia2", 6, "0,1,2,3,4,5")]
    _, b = _load(realdata, "slurmrestd_v0.0.42_24.11_slurm-job-gpus-running.json")
    assert b.sched_job.select("account", "gpus", "gpu_types").row(0) == ("biology", 6, "h100:2,h200:4")
    _, b = _load(realdata, "slurmrestd_v0.0.42_24.11_slurm-job-gpus-pending.json")
    assert b.sched_job.select("state", "state_reason", "gpus", "gpu_source").row(0) == ("PENDING", "BeginTime", 6, "tres_per_job")
    doc, b = _load(realdata, "slurmrestd_v0.0.42_24.11_slurm-jobs.json")
    j = {r["job_id"]: r for r in b.sched_job.to_dicts()}
    assert (j["6355"]["gpus"], j["6356"]["gpus"], j["6356"]["gpu_types"]) == (1, 2, "h100:1,h200:1")
    assert j["6365"]["node_count"] == 3
    states: dict[str, int] = {}
    for x in doc["jobs"]:
        states[x["job_state"][0]] = states.get(x["job_state"][0], 0) + 1
    assert dict(b.sched_job["state"].value_counts().iter_rows()) == states == {"RUNNING": 7, "COMPLETED": 3, "CANCELLED": 2, "PENDING": 2, "FAILED": 1, "TIMEOUT": 1}
    _, b = _load(realdata, "slurmrestd_v0.0.44_25.11_slurm-jobs.json")
    assert b.sched_job.filter(pl.col("job_id") == "5736")["gpus"].item() == 4


def test_queue_waits_and_reasons(realdata):
    doc, b = _load(realdata, "slurmrestd_v0.0.40_23.11.1_jobs_talapas.json")
    run = b.sched_job.filter(pl.col("state") == "RUNNING").row(0, named=True)
    raw = next(x for x in doc["jobs"] if x["job_state"] == ["RUNNING"])
    assert (run["start_at"] - run["submit_at"]).total_seconds() == raw["start_time"]["number"] - raw["submit_time"]["number"] == 6044
    assert b.sched_job.filter(pl.col("state") == "PENDING")["state_reason"].item() == "Resources"
    _, b = _load(realdata, "squeue-json_v0.0.37_21.08.5_rivos.json")
    j = {r["job_id"]: r for r in b.sched_job.to_dicts()}
    assert (j["26515966"]["start_at"] - j["26515966"]["submit_at"]).total_seconds() == 21 and j["26515966"]["end_at"] is None  # a projection
    assert j["58948420"]["state_reason"] == "Dependency"
    _, b = _load(realdata, "slurmrestd_v0.0.42_24.11_slurmdb-job-completed.json")
    r = b.sched_job.row(0, named=True)
    assert (r["account"], r["user"], (r["start_at"] - r["submit_at"]).total_seconds(), r["elapsed_s"]) == ("biology", "jbeck", 2, 61)
    _, b = _load(realdata, "slurmrestd_v0.0.42_24.11_slurmdb-job-timeout.json")
    assert b.sched_job.select("state", "elapsed_s", "time_limit_s").row(0) == ("TIMEOUT", 65, 60)
    # eligible after the snapshot (a --begin hold): dropped, not stored as a future fact
    _, b = _load(realdata, "slurmrestd_v0.0.40_23.11_slurm-jobs.json")
    p = {r["job_id"]: r for r in b.sched_job.filter(pl.col("state") == "PENDING").to_dicts()}
    assert p["789"]["state_reason"] == "BeginTime" and p["789"]["eligible_at"] is None
    assert p["787"]["eligible_at"] == p["787"]["submit_at"]
    _, b = _load(realdata, "slurmrestd_v0.0.41_24.05.6_slurmdb-accounts_981x8gpu-fleet.json")
    assert dict(b.sched_account.select("account", "organization").iter_rows())["hao"] == "ifm"
    _, b = _load(realdata, "slurmrestd_v0.0.40_23.11.1_partitions_talapas.json")
    assert dict(b.sched_partition.select("partition", "gpus_total").iter_rows()) == {"compute": 0, "gpu": 155, "memory": 0, "memorylong": 0, "preempt": 230}


def test_slurmrestd_hostile_inputs(realdata):
    good = (realdata / "scheduler/slurmrestd_v0.0.42_24.11_slurm-jobs.json").read_bytes()
    for data, words in [
        (b"", "not valid JSON"), (b"[1,2]", "JSON object"), (b'{"meta": {}}', "no jobs"),
        (good[: len(good) // 2], "not valid JSON"),
        (b'{"jobs": [1]}', "not an object"),
        (b'{"jobs": [{"job_state": "RUNNING"}]}', "no job_id"),
        (b'{"jobs": [{"job_id": 1, "job_state": "RUNNING", "nodes": "n[1-99999999]"}]}', "more than"),
        (b'{"jobs": [{"job_id": 1, "job_state": "COMPLETED", "submit_time": 1e300}]}', "jobs\\[0\\]"),
        (b'{"errors": [{"error": "auth"}]}', "errors"),
        (b"[" * 100000, "not valid JSON"),
    ]:
        with pytest.raises(ParseError, match=words):
            slurmrestd.parse(data, source="x")
    with pytest.raises(ParseError, match="exceeds"):
        slurmrestd.parse(b" " * (slurmrestd.MAX_INPUT_BYTES + 1), source="x")


# --- kube-state-metrics ---------------------------------------------------------------------------

KSM = b"""# HELP kube_pod_info Information about pod.
# TYPE kube_pod_info gauge
kube_pod_info{namespace="ml-research",pod="train-0",uid="u1",node="gpu-node-1",created_by_kind="Job",created_by_name="train"} 1
kube_pod_info{namespace="web",pod="api-1",uid="u2",node="cpu-node-1",created_by_kind="ReplicaSet",created_by_name="api-5d"} 1
kube_pod_owner{namespace="ml-research",pod="train-0",uid="u1",owner_kind="PyTorchJob",owner_name="llama",owner_is_controller="true"} 1
kube_pod_labels{namespace="ml-research",pod="train-0",uid="u1",label_team="nlp"} 1
kube_pod_container_resource_requests{namespace="ml-research",pod="train-0",uid="u1",container="trainer",node="gpu-node-1",resource="nvidia_com_gpu",unit="integer"} 4
kube_pod_container_resource_requests{namespace="ml-research",pod="train-0",uid="u1",container="side",node="gpu-node-1",resource="nvidia_com_gpu",unit="integer"} 1
kube_pod_container_resource_requests{namespace="ml-research",pod="train-0",uid="u1",container="trainer",node="gpu-node-1",resource="cpu",unit="core"} 8
kube_pod_status_phase{namespace="ml-research",pod="train-0",uid="u1",phase="Running"} 1
kube_pod_status_phase{namespace="ml-research",pod="train-0",uid="u1",phase="Pending"} 0
kube_pod_created{namespace="ml-research",pod="train-0",uid="u1"} 1.7630e+09
kube_pod_start_time{namespace="ml-research",pod="train-0",uid="u1"} 1.7630001e+09
kube_node_status_allocatable{node="gpu-node-1",resource="nvidia_com_gpu",unit="integer"} 8
"""


def test_kube_state_pods_and_gpu_requests():
    b = kube_state.parse(KSM, ts=T0)
    p = {r["job_id"]: r for r in b.sched_job.to_dicts()}
    t = p["ml-research/train-0"]
    assert (t["account"], t["gpus"], t["state"], t["controller"], json.loads(t["labels"])) == ("ml-research", 5, "RUNNING", "PyTorchJob/llama", {"team": "nlp"})
    assert (t["start_at"] - t["submit_at"]).total_seconds() == 100
    assert p["web/api-1"]["gpus"] is None
    assert b.sched_node.select("host", "gpus_total", "gpus_alloc").row(0) == ("gpu-node-1", 8, 5)
    for bad, words in [(b"kube_pod_info{pod=\"x\"} 1\n", "namespace"), (b"node_cpu 1\n", "not a kube-state-metrics"), (b'kube_pod_info{namespace="a" 1\n', "line 1")]:
        with pytest.raises(ParseError, match=words):
            kube_state.parse(bad, ts=T0)


# A PyTorchJob's two pods (owned by it, as the Kubeflow training operator makes them) and a JobSet's two pods
# (owned by its child Jobs, labelled with the JobSet's name), per kube-state-metrics' documented series.
KSM_CONTROLLERS = b"""kube_pod_owner{namespace="nlp",pod="bert-master-0",uid="a",owner_kind="PyTorchJob",owner_name="bert",owner_is_controller="true"} 1
kube_pod_owner{namespace="nlp",pod="bert-worker-0",uid="b",owner_kind="PyTorchJob",owner_name="bert",owner_is_controller="true"} 1
kube_pod_container_resource_requests{namespace="nlp",pod="bert-master-0",uid="a",container="pytorch",node="n1",resource="nvidia_com_gpu",unit="integer"} 8
kube_pod_container_resource_requests{namespace="nlp",pod="bert-worker-0",uid="b",container="pytorch",node="n2",resource="nvidia_com_gpu",unit="integer"} 8
kube_pod_status_phase{namespace="nlp",pod="bert-master-0",uid="a",phase="Succeeded"} 1
kube_pod_status_phase{namespace="nlp",pod="bert-worker-0",uid="b",phase="Succeeded"} 1
kube_pod_created{namespace="nlp",pod="bert-master-0",uid="a"} 1.763e+09
kube_pod_created{namespace="nlp",pod="bert-worker-0",uid="b"} 1.76300001e+09
kube_pod_start_time{namespace="nlp",pod="bert-master-0",uid="a"} 1.76300006e+09
kube_pod_start_time{namespace="nlp",pod="bert-worker-0",uid="b"} 1.76300003e+09
kube_pod_completion_time{namespace="nlp",pod="bert-master-0",uid="a"} 1.7630036e+09
kube_pod_completion_time{namespace="nlp",pod="bert-worker-0",uid="b"} 1.76300361e+09
kube_pod_owner{namespace="vision",pod="vit-slice-0-0",uid="c",owner_kind="Job",owner_name="vit-slice-0",owner_is_controller="true"} 1
kube_pod_owner{namespace="vision",pod="vit-slice-1-0",uid="d",owner_kind="Job",owner_name="vit-slice-1",owner_is_controller="true"} 1
kube_pod_labels{namespace="vision",pod="vit-slice-0-0",uid="c",label_jobset_sigs_k8s_io_jobset_name="vit"} 1
kube_pod_labels{namespace="vision",pod="vit-slice-1-0",uid="d",label_jobset_sigs_k8s_io_jobset_name="vit"} 1
kube_pod_container_resource_requests{namespace="vision",pod="vit-slice-0-0",uid="c",container="jax",node="n3",resource="nvidia_com_gpu",unit="integer"} 4
kube_pod_container_resource_requests{namespace="vision",pod="vit-slice-1-0",uid="d",container="jax",node="n4",resource="nvidia_com_gpu",unit="integer"} 4
kube_pod_status_phase{namespace="vision",pod="vit-slice-0-0",uid="c",phase="Running"} 1
kube_pod_status_phase{namespace="vision",pod="vit-slice-1-0",uid="d",phase="Failed"} 1
kube_pod_start_time{namespace="vision",pod="vit-slice-0-0",uid="c"} 1.7630001e+09
kube_pod_owner{namespace="web",pod="api-1",uid="e",owner_kind="ReplicaSet",owner_name="api-5d",owner_is_controller="true"} 1
"""


def test_kube_state_training_controllers_are_one_fleet_job_each():
    b = kube_state.parse(KSM_CONTROLLERS, ts=T0)
    jobs = {r["job_id"]: r for r in b.job.iter_rows(named=True)}
    assert set(jobs) == {"nlp/PyTorchJob/bert", "vision/JobSet/vit"}  # a ReplicaSet's pods are a service, not a job
    bert = jobs["nlp/PyTorchJob/bert"]
    at = lambda s: dt.datetime.fromtimestamp(s, dt.UTC)  # noqa: E731
    assert (bert["world_size"], bert["status"], bert["kind"], bert["owner"]) == (16, "completed", "training", "nlp")
    assert (bert["submitted_at"], bert["started_at"], bert["ended_at"]) == (at(1.763e9), at(1.76300003e9), at(1.76300361e9))
    vit = jobs["vision/JobSet/vit"]
    assert (vit["world_size"], vit["status"], vit["ended_at"]) == (8, "running", None)
    pods = b.sched_job.filter(pl.col("account") == "vision")
    assert set(pods["controller"]) == {"JobSet/vit"} and b.meta["controller_jobs"] == 2
