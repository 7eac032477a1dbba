"""Files, paths and parser edge cases: what Fleetscope creates is private to its account, paths built from
input stay in their folder, `fleetscope ingest DIR` reads no links or FIFOs by default, nvidia-smi XML
entities are refused in every encoding, and a body cut mid-line stores nothing."""

from __future__ import annotations

import datetime as dt
import gzip
import importlib.util
import json
import os
import random
import stat
import subprocess
from pathlib import Path

import defusedxml
import httpx
import pytest

from fleetscope import safefiles
from fleetscope.services import auth
from fleetscope.store import db
from fleetscope.door import ingestion
from fleetscope.door import streaming
from fleetscope.core.errors import ParseError
from fleetscope.door.ingestion import Options
from fleetscope.store import Store
from ingest import dcgm, nvidia_smi
from tests.conftest import make_settings
from tests import clirun

REPO = Path(__file__).resolve().parents[2]
TS = dt.datetime(2026, 3, 10, 12, tzinfo=dt.UTC)
SCRAPE_A = "telemetry/dcgm-exporter_metrics_8xH100_k8s-pod-labels_sampled_nvidia-aicr.prom"
SCRAPE_B = "telemetry/dcgm-exporter_metrics_L40S_helm-default_full_cncf-upcloud.prom"
SCRAPE_C = "telemetry/dcgm-exporter_metrics_1xL4_default-counters_full_cncf-kops.prom"


@pytest.fixture
def open_umask():
    """The most permissive umask, so a mode left to it would show as group/world bits."""
    old = os.umask(0)
    yield
    os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


# --- modes --------------------------------------------------------------------------------------


def test_everything_a_demo_like_run_creates_is_private(tmp_path, open_umask, realdata):
    """Store, ingest, Celery's embedded broker, alerting key, fairness upload kept, audit report, signed
    export, agent spool, demo log: every file 0600 and every directory 0700, with umask 000."""
    from fleetscope.services import audit as au
    from fleetscope.services import governance as gs
    from fleetscope import worker
    from fleetscope.agent.backlog import Backlog, Reading
    from fleetscope.services.alerting import config as alert_config
    from governance.registry import ModelEntry

    top = tmp_path / "state"
    data = top / "data"  # neither exists yet: both are created
    url = f"sqlite:///{data / 'fleetscope.store.db'}"
    settings = make_settings(data, url, broker_url=f"sqla+sqlite:///{data / 'broker.db'}",
                             result_backend=f"db+sqlite:///{data / 'results.db'}", signing_key="")
    engine = db.make_engine(url)
    db.upgrade(url)
    store = Store(engine)
    out = ingestion.ingest_bytes(store, (realdata / SCRAPE_A).read_bytes(), source="node-a", opts=Options(ts=TS))
    assert out.result.written["gpu_sample"] == 8
    worker.make_celery(settings)
    alert_config.secret_keys(settings, alert_config.load(settings))
    gs.put_model(store, ModelEntry("org/ranker", "1", "rank applicants"), actor="test")
    rows = "y_true,y_pred,g\n" + "".join(f"{i % 2},{(i // 2) % 2},{'ab'[i % 3 == 0]}\n" for i in range(60))
    fair = gs.evaluate_fairness(store, "org/ranker", rows.encode(), sensitive=["g"], min_group_size=5,
                                keep_upload_dir=data / "fairness-uploads", actor="test")
    assert fair["upload_kept_at"].startswith(str(data / "fairness-uploads" / "org" / "ranker@1-"))
    audit = au.run_audit(store, settings)
    export = au.make_export(store, settings, audit_id=audit["audit_id"])
    backlog = Backlog(2**20, 10, spool=data / "agent-spool")
    backlog.add(Reading(ts=TS, path="/api/v1/ingest/dcgm", body=b"x 1\n", content_type="text/plain", kind=""))
    with safefiles.open_private_append(data / "logs" / "api.log") as log:
        log.write(b"started\n")

    # While the engine holds its connections: SQLite removes the -wal file when the last one closes.
    made = {p.relative_to(top).as_posix(): _mode(p) for p in top.rglob("*")}
    engine.dispose()
    expected = {"data", "data/fleetscope.store.db", "data/fleetscope.store.db-wal", "data/fleetscope.store.db-writelock", "data/broker.db",
                "data/results.db", "data/secret.key", "data/signing_key.pem", "data/signing_key.pub.pem", "data/reports",
                f"data/reports/{audit['audit_id']}/report.json", "data/exports", str(Path(export["path"]).relative_to(top)),
                "data/fairness-uploads/org", "data/agent-spool/000000000001.reading", "data/logs/api.log"}
    assert expected <= set(made), sorted(expected - set(made))
    loose = {name: oct(mode) for name, mode in made.items()
             if mode != (safefiles.DIR_MODE if (top / name).is_dir() else safefiles.FILE_MODE)}
    assert loose == {}
    assert _mode(top) == safefiles.DIR_MODE  # the parent the data dir needed was created private too


def test_write_private_resets_a_wider_mode_and_never_writes_through_a_link(tmp_path, open_umask):
    target = tmp_path / "report.json"
    target.write_bytes(b"old")
    os.chmod(target, 0o666)
    safefiles.write_private(target, b"new")
    assert (target.read_bytes(), _mode(target)) == (b"new", 0o600)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(OSError):
        safefiles.write_private(tmp_path / "link", b"overwritten")
    assert victim.read_bytes() == b"keep"
    with pytest.raises(FileExistsError):
        safefiles.write_private(target, b"again", exclusive=True)
    assert target.read_bytes() == b"new"


# --- path containment -----------------------------------------------------------------------------


@pytest.mark.parametrize(("part", "says"), [
    ("../x", "a '..' component"),
    ("/abs", "is an absolute path"),
    ("a/../../b", "a '..' component"),
    ("a/./b", "a '.' component"),
    ("a\x00b", "contains a NUL byte"),
    ("", "an empty name"),
    ("a//b", "an empty name"),
    ("n" * 256, "longer than 255 bytes"),
    ("/".join(["n" * 200] * 25), "longer than 4096 bytes"),
    ("out/secret", "leads outside"),  # through a link planted inside the base
], ids=["dotdot", "absolute", "dotdot-inside", "dot", "nul", "empty", "empty-inside", "long-name", "long-path", "symlink-out"])
def test_contained_refuses_every_way_out_and_names_it(tmp_path, part, says):
    base = tmp_path / "uploads"
    base.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (base / "out").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(safefiles.UnsafePathError) as e:
        safefiles.contained(base, part, what="model name")
    assert says in str(e.value) and str(e.value).startswith("model name")


def test_contained_allows_plain_names_and_links_that_stay_inside(tmp_path):
    base = tmp_path / "uploads"
    (base / "real").mkdir(parents=True)
    (base / "alias").symlink_to(base / "real")
    assert safefiles.contained(base, "org/model@1-x.csv") == base.resolve() / "org" / "model@1-x.csv"
    assert safefiles.contained(base, "alias/f", "g") == base.resolve() / "alias" / "f" / "g"
    assert safefiles.contained(base, "..x@1.csv").name == "..x@1.csv"  # dots inside a name are no '..'


def test_a_kept_upload_whose_model_name_leads_out_is_refused_and_nothing_is_written(store, tmp_path):
    from fleetscope.services import governance as gs
    from governance.fairness import FairnessInputError
    from governance.registry import ModelEntry

    gs.put_model(store, ModelEntry("../../escaped", "1"), actor="test")
    rows = "y_true,y_pred,g\n" + "".join(f"{i % 2},{i % 2},a\n" for i in range(40))
    keep = tmp_path / "data" / "fairness-uploads"
    with pytest.raises(FairnessInputError) as e:
        gs.evaluate_fairness(store, "../../escaped", rows.encode(), sensitive=["g"], min_group_size=5, keep_upload_dir=keep, actor="test")
    assert "keep_upload: kept upload (model name@version) '../../escaped@1-" in str(e.value) and "'..'" in str(e.value)
    assert store.read("fairness_evaluation").height == 0
    assert not list(tmp_path.rglob("*escaped*"))


# --- ingest DIR: links and FIFOs ------------------------------------------------------------------


def run_cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    return clirun.cli(*args, env=env)


def _uuids(scrape: bytes) -> set[str]:
    return set(dcgm.parse(scrape, ts=TS).gpu["gpu_uuid"].to_list())


@pytest.fixture
def tree(tmp_path, realdata):
    """inputs/ with one real scrape, a link to a file outside, a link to a directory outside, a FIFO
    and a broken link; the files outside hold scrapes of other GPUs, so reading them would show."""
    inputs = tmp_path / "inputs"
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    inputs.mkdir()
    (inputs / "a.prom").write_bytes((realdata / SCRAPE_A).read_bytes())
    (outside / "b.prom").write_bytes((realdata / SCRAPE_B).read_bytes())
    (outside / "dir" / "c.prom").write_bytes((realdata / SCRAPE_C).read_bytes())
    (inputs / "b-link.prom").symlink_to(outside / "b.prom")
    (inputs / "dir-link").symlink_to(outside / "dir")
    (inputs / "loop").symlink_to(inputs)
    (inputs / "gone").symlink_to(tmp_path / "nothing-here")
    os.mkfifo(inputs / "pipe")  # nothing ever writes: opening it for reading would wait for ever
    return tmp_path


def test_ingest_dir_skips_links_and_fifos_with_a_note_each(tree, realdata):
    proc = run_cli(tree / "data", "ingest", "--json", str(tree / "inputs"))
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    skipped = {Path(x["source"]).name: x["skipped"] for x in lines if "skipped" in x and "source" in x}
    assert set(skipped) == {"b-link.prom", "dir-link", "loop", "gone", "pipe"}
    assert all("symbolic link, not followed (--follow-symlinks" in skipped[n] for n in ("b-link.prom", "dir-link", "loop", "gone"))
    assert skipped["pipe"] == "a FIFO (named pipe), not a regular file"
    assert lines[-1]["summary"] == {"files": 1, "rejected": 0, "skipped": 5, "written": lines[-2]["written"]}
    stored = set(Store.open(f"sqlite:///{tree / 'data' / 'fleetscope.store.db'}").read("gpu")["gpu_uuid"].to_list())
    assert stored == _uuids((realdata / SCRAPE_A).read_bytes())


def test_follow_symlinks_reads_what_links_point_to_but_never_a_fifo(tree, realdata):
    proc = run_cli(tree / "data", "ingest", "--json", "--follow-symlinks", str(tree / "inputs"))
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    skipped = {Path(x["source"]).name: x["skipped"] for x in lines if "skipped" in x and "source" in x}
    assert skipped == {"gone": "a broken symbolic link", "loop": "a directory already read (a loop, or a second link to it)",
                       "pipe": "a FIFO (named pipe), not a regular file"}
    stored = set(Store.open(f"sqlite:///{tree / 'data' / 'fleetscope.store.db'}").read("gpu")["gpu_uuid"].to_list())
    assert stored == set().union(*(_uuids((realdata / s).read_bytes()) for s in (SCRAPE_A, SCRAPE_B, SCRAPE_C)))


def test_a_named_link_fifo_or_device_is_rejected_by_the_reader(tree):
    proc = run_cli(tree / "data", "ingest", "--json", str(tree / "inputs" / "b-link.prom"), str(tree / "inputs" / "pipe"), "/dev/zero")
    assert proc.returncode == 1
    errors = {Path(x["source"]).name: x["error"] for x in map(json.loads, proc.stdout.splitlines()) if "error" in x}
    assert "a symbolic link, not followed (--follow-symlinks reads what it points to)" in errors["b-link.prom"]
    assert "a FIFO (named pipe), not a regular file; not read" in errors["pipe"]
    assert "a character device, not a regular file; not read" in errors["zero"]


def test_streaming_opens_no_link_even_if_one_replaces_the_listed_file(store, tree):
    with pytest.raises(safefiles.NotRegularFileError, match="a symbolic link, not followed"):
        streaming.ingest_file(store, tree / "inputs" / "b-link.prom", opts=Options(ts=TS))
    assert store.read("gpu").height == 0
    out = streaming.ingest_file(store, tree / "inputs" / "b-link.prom", opts=Options(ts=TS), follow_symlinks=True)
    assert out.source == str(tree / "inputs" / "b-link.prom") and out.result.written["gpu_sample"] > 0


# --- XML entities in every encoding ----------------------------------------------------------------

_XML = ('<?xml version="1.0"{decl}?>\n<!DOCTYPE nvidia_smi_log [<!ENTITY x "INJECTED">]>\n'
        '<nvidia_smi_log><timestamp>Tue Mar 10 12:00:00 2026</timestamp>'
        '<gpu id="00000000:07:00.0"><uuid>GPU-1</uuid><product_name>&x;</product_name></gpu></nvidia_smi_log>\n')
_ENCODINGS = [
    ("utf-8", ""), ("utf-16", ""), ("utf-16-le", ""), ("utf-16-be", ""),  # "utf-16" writes a BOM, -le/-be none
    ("utf-16-le", ' encoding="UTF-16"'), ("utf-16", ' encoding="UTF-16"'), ("utf-32", ""), ("utf-32-le", ""),
    ("utf-32-be", ""), ("utf-32-le", ' encoding="UTF-32"'), ("iso-8859-1", ' encoding="ISO-8859-1"'),
    ("cp1252", ' encoding="windows-1252"'),
]


@pytest.mark.parametrize(("codec", "decl"), _ENCODINGS, ids=[f"{c}{'-declared' if d else ''}" for c, d in _ENCODINGS])
def test_xml_entities_are_refused_in_every_encoding(codec, decl):
    body = _XML.format(decl=decl).encode(codec)
    with pytest.raises(ParseError) as e:
        nvidia_smi.parse_xml(body, source="smi.xml")
    assert e.value.field == "xml"
    if codec.startswith("utf-32"):
        assert "not well-formed" in e.value.message  # expat reads no UTF-32: refused before any entity
    else:
        assert e.value.message == ("XML DOCTYPE nvidia_smi_log has an internal subset, where entities are declared; "
                                   "refused (entity expansion)") and e.value.line == 2
    # The same document without its entity reads in that encoding: the refusal is the entity's.
    if not codec.startswith("utf-32"):
        plain = _XML.format(decl=decl).replace(' [<!ENTITY x "INJECTED">]', "").replace("&x;", "NVIDIA H100")
        assert nvidia_smi.parse_xml(plain.encode(codec), source="smi.xml").gpu["model_name"].to_list() == ["NVIDIA H100"]


def test_xml_internal_subset_and_external_entities_are_refused():
    attlist = b'<?xml version="1.0"?><!DOCTYPE nvidia_smi_log [<!ATTLIST gpu id CDATA "x">]><nvidia_smi_log/>'
    with pytest.raises(ParseError, match="DOCTYPE nvidia_smi_log has an internal subset"):
        nvidia_smi.parse_xml(attlist.decode().encode("utf-16"), source="smi.xml")
    # Behind the DOCTYPE check, defusedxml's handlers refuse what a parser reaching them would meet.
    parser = nvidia_smi._Parser()
    parser.parser.StartDoctypeDeclHandler = None
    external = '<?xml version="1.0"?><!DOCTYPE n [<!ENTITY e SYSTEM "file:///etc/passwd">]><n>&e;</n>'
    with pytest.raises(defusedxml.EntitiesForbidden):
        parser.feed(external.encode("utf-16-be"))
    # An external DTD, as nvidia-smi names one, is allowed and never fetched.
    named = b'<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log SYSTEM "/etc/shadow">\n' + _XML.format(decl="").split("\n", 2)[2].encode()
    assert nvidia_smi.parse_xml(named.replace(b"&x;", b"A100"), source="smi.xml").gpu["model_name"].to_list() == ["A100"]


def test_a_utf16_entity_sent_to_the_api_is_refused_and_nothing_is_stored(api):
    h = {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "t", ["ingest"])}
    r = httpx.post(api.url + "/api/v1/ingest/nvidia_smi_xml", content=_XML.format(decl="").encode("utf-16"), headers=h)
    assert r.status_code == 400 and "internal subset, where entities are declared" in r.json()["detail"]
    assert api.app.state.store.read("gpu").height == 0


# --- a body cut mid-line --------------------------------------------------------------------------


def _bench():
    spec = importlib.util.spec_from_file_location("_bench_dcgm", REPO / "benchmarks" / "ingest_dcgm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("gpus", [8, 96], ids=["small-body-door", "large-body-parsed-in-route"])
def test_a_cut_scrape_posted_to_the_api_is_refused_naming_its_line_and_nothing_is_stored(api, gpus):
    body = _bench().synth_scrape(gpus, seed=4)
    assert (len(body) <= 512 * 1024) == (gpus == 8)  # each way the route takes a dcgm body
    last = body.rstrip(b"\n").rsplit(b"} ", 1)[1]
    cut = body[: len(body) - 1 - len(last) + max(1, len(last) // 2)]  # inside the last value
    h = {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "t", ["ingest"])}
    r = httpx.post(api.url + "/api/v1/ingest/dcgm", content=cut, headers=h, params={"source": "node-a"}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["line"] == body.count(b"\n") and r.json()["field"] == "line"
    assert "without a line feed" in r.json()["detail"]
    assert api.app.state.store.counts().get("gpu_sample", 0) == 0
    whole = httpx.post(api.url + "/api/v1/ingest/dcgm", content=body, headers=h, params={"source": "node-a"}, timeout=60)
    assert whole.status_code == 200 and whole.json()["written"]["gpu_sample"] == gpus


def test_a_cut_scrape_file_streamed_in_pieces_stores_nothing(store, realdata, tmp_path):
    body = b"".join((realdata / s).read_bytes() for s in (SCRAPE_A, SCRAPE_B, SCRAPE_C))
    path = tmp_path / "scrapes.prom"
    path.write_bytes(body[:-3])  # the last value loses its final digits and its line feed
    with pytest.raises(ParseError) as e:
        streaming.ingest_file(store, path, opts=Options(ts=TS), chunk_bytes=2000)
    assert (e.value.source, e.value.line) == (str(path), body.count(b"\n"))
    assert store.counts().get("gpu_sample", 0) == 0
    # gzip: the end is known only once inflated, so the last piece's parse names the line.
    gz = tmp_path / "scrapes.prom.gz"
    gz.write_bytes(gzip.compress(body[:-3]))
    out = streaming.ingest_file(store, gz, opts=Options(ts=TS), chunk_bytes=2000)
    last_line = body.count(b"\n")
    assert out.error and f"line {last_line}" in out.error and "without a line feed" in out.error


def test_stream_pieces_neither_lose_nor_repeat_a_line(tmp_path):
    rng = random.Random(5)
    for trial in range(40):
        lines = [b"x" * rng.randint(0, 90) + b"\n" for _ in range(rng.randint(1, 300))]
        data = b"".join(lines) + (b"tail-without-newline" if trial % 2 else b"")
        path = tmp_path / f"f{trial}"
        path.write_bytes(data)
        reader = streaming._Reader(path)
        try:
            pieces = list(streaming._pieces(reader, dcgm.cut_family, rng.choice([1, 7, 64, 500, 4096])))
        finally:
            reader.close()
        assert b"".join(pieces) == data
        assert all(p.endswith(b"\n") for p in pieces[:-1])


def test_prometheus_textfile_cut_mid_line_is_refused(realdata):
    prom = (realdata / "telemetry/nccl-inspector_prometheus-textfile-examples_v5.1_from-README.prom").read_bytes()
    with pytest.raises(ParseError) as e:
        ingestion.parse(prom[:-4], source="inspector.prom", fmt="nccl_inspector_prom", opts=Options(ts=TS))
    assert e.value.line == prom.count(b"\n") and "without a line feed" in e.value.message


@pytest.mark.parametrize("name", ["nccl_inspector", "job_events"])
def test_json_lines_with_a_truncated_last_record_are_refused_with_its_line(store, realdata, name):
    if name == "job_events":
        body = b"".join(b'{"job_id": "j%d", "ts": "2026-03-01T12:00:00Z", "kind": "started"}\n' % i for i in range(5))
    else:
        body = (realdata / "telemetry/nccl-inspector_output-examples_v4.0_from-README.jsonl").read_bytes()
    n = body.count(b"\n")
    with pytest.raises(ParseError) as e:
        ingestion.ingest_bytes(store, body[:-15], source="f.jsonl", fmt=name, opts=Options(job_id="j1", ts=TS))
    assert e.value.line == n and e.value.message.startswith("truncated JSON line: the last line ends without a line feed")
    assert sum(store.counts().values()) == 0
    # A last record that is whole but lacks only its line feed cannot be a cut value: it is read.
    whole = ingestion.ingest_bytes(store, body.rstrip(b"\n"), source="f.jsonl", fmt=name, opts=Options(job_id="j1", ts=TS))
    assert sum(whole.result.written.values()) > 0
