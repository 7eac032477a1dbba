"""Someone with write access to the database (not to the data directory's key and checkpoint files)
tampers with the audit log: every attack is found, naming the first bad entry by seq and why. Real
databases (SQLite and PostgreSQL), the service's own append path, the API and the CLI as a user runs them."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import os
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from fleetscope.services import audit as au
from fleetscope.services import auth
from fleetscope.store import Store
from governance import auditlog as A
from governance import exports
from governance.aiact.frames import AUDIT_LOG
from tests.conftest import make_settings
from tests.fleetscope.test_governance_api import build_pipeline, gov
from tests import clirun

N = 6


@pytest.fixture
def logged(store: Store, db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Six entries appended through the service, with their key and checkpoints in ``tmp_path``."""
    settings = make_settings(tmp_path, db_url)
    au.bind(store, settings)
    for i in range(N):
        au.log(store, actor=f"user{i}", action="declaration", subject=f"model:m:{i}", payload={"n": i, "text": "ünïcode"})
    return store, settings


def rows(store: Store) -> list[A.AuditEntry]:
    return A.entries_from_frame(store.read("audit_log"))


def put_rows(store: Store, entries: list[A.AuditEntry]) -> None:
    """Overwrite stored rows by seq, as an attacker with SQL access would."""
    with store.engine.begin() as conn:
        for e in entries:
            conn.exec_driver_sql(f"DELETE FROM audit_log WHERE seq = {int(e.seq)}")
    store.write_frames([(AUDIT_LOG, A.entries_frame(entries))], source="attacker")


def rechain_from(store: Store, seq: int, key: bytes | None) -> None:
    """Change entry ``seq``'s actor and recompute every hash from there with ``key`` (None: plain SHA-256)."""
    es = rows(store)
    out = es[:seq]
    for e in es[seq:]:
        e = dataclasses.replace(e, actor="mallory" if e.seq == seq else e.actor, prev_hash=out[-1].hash if out else A.GENESIS)
        out.append(dataclasses.replace(e, hash=A.entry_hash(e.seq, e.ts, e.actor, e.action, e.subject, e.payload, e.prev_hash, key=key)))
    put_rows(store, out[seq:])


def sql(statement: str) -> Callable[[Store, Path], None]:
    def run(store: Store, _: Path) -> None:
        with store.engine.begin() as conn:
            conn.exec_driver_sql(statement)
    return run


def swap(a: int, b: int) -> Callable[[Store, Path], None]:
    def run(store: Store, _: Path) -> None:
        es = {e.seq: e for e in rows(store)}
        put_rows(store, [dataclasses.replace(es[b], seq=a), dataclasses.replace(es[a], seq=b)])
    return run


def drop_last_checkpoint_line(_: Store, data_dir: Path) -> None:
    path = data_dir / "audit_checkpoints.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))


ATTACKS = {
    "delete a middle row": (sql("DELETE FROM audit_log WHERE seq = 2"), 2, "missing (the log goes from seq 1 to seq 3): rows were deleted"),
    "edit a payload": (sql("UPDATE audit_log SET payload = '{\"n\":99}' WHERE seq = 3"), 3, "does not match its HMAC-SHA-256"),
    "re-chain with plain SHA-256": (lambda s, _: rechain_from(s, 2, None), 2, "does not match its HMAC-SHA-256"),
    "re-chain with a wrong key": (lambda s, _: rechain_from(s, 2, os.urandom(32)), 2, "does not match its HMAC-SHA-256"),
    "truncate the newest rows": (sql("DELETE FROM audit_log WHERE seq >= 4"), 4, "the newest rows were deleted"),
    "reorder two rows": (swap(2, 3), 2, "prev_hash is not the hash of seq 1"),
    "delete the checkpoint file's last line": (drop_last_checkpoint_line, N - 1, "newer than the newest signed checkpoint"),
}


def test_an_untouched_log_verifies(logged) -> None:
    store, settings = logged
    out = au.verify_log(store)
    assert out["ok"] is True and out["first_break"] is None
    assert (out["entries"], out["head_seq"], out["keyed_from"], out["checkpoints"]) == (N, N - 1, 0, N)
    assert out["head"] == rows(store)[-1].hash == out["latest_checkpoint"]["head"]


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_each_attack_is_found_at_its_first_bad_entry(logged, attack: str) -> None:
    store, settings = logged
    tamper, seq, why = ATTACKS[attack]
    tamper(store, settings.data_dir)
    out = au.verify_log(store)
    assert out["ok"] is False
    assert out["first_break"]["seq"] == seq, out["first_break"]
    assert why in out["first_break"]["why"] and out["first_break"]["why"].startswith(f"seq {seq}")


def test_key_and_checkpoints_live_outside_the_database_with_mode_0600(logged) -> None:
    store, settings = logged
    key_file, cp_file = settings.data_dir / "audit.key", settings.data_dir / "audit_checkpoints.jsonl"
    for path in (key_file, cp_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    key_hex = key_file.read_text().strip()
    assert len(bytes.fromhex(key_hex)) == A.KEY_BYTES
    assert key_hex not in store.read("audit_log").write_csv()
    lines = cp_file.read_text().splitlines()
    assert [json.loads(x)["seq"] for x in lines] == list(range(N))
    public = exports.load_private_key((settings.data_dir / "signing_key.pem").read_bytes()).public_key()
    assert all(A.parse_checkpoint(x).signature_valid(public) for x in lines)


def test_a_replaced_key_file_is_named(logged) -> None:
    store, settings = logged
    key_file = settings.data_dir / "audit.key"
    key_file.write_text(os.urandom(32).hex() + "\n")
    out = au.verify_log(store)
    assert out["ok"] is False and out["first_break"]["line"] == 1 and "made with audit key" in out["first_break"]["why"]
    key_file.unlink()
    out = au.verify_log(store)
    assert out["ok"] is False and out["first_break"]["seq"] == 0 and "no audit key" in out["first_break"]["why"]
    assert not key_file.exists()  # verifying never creates a key


def test_a_key_file_others_can_read_is_refused(logged) -> None:
    store, settings = logged
    (settings.data_dir / "audit.key").chmod(0o644)
    with pytest.raises(au.AuditError, match="chmod 600"):
        au.log(store, actor="a", action="declaration", subject="s", payload={})
    assert len(rows(store)) == N


def test_a_log_written_before_keying_is_keyed_from_a_recorded_entry(store: Store, db_url: str, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, db_url)
    au.bind(store, settings)
    old: list[A.AuditEntry] = []
    for i in range(3):  # rows as the unkeyed chain wrote them
        seq, prev = len(old), old[-1].hash if old else A.GENESIS
        e = A.AuditEntry(seq, dt.datetime(2026, 1, 1, 0, 0, i, tzinfo=dt.UTC), "bob", "declaration", "model:m:1", "{}", prev, "")
        old.append(dataclasses.replace(e, hash=A.entry_hash(e.seq, e.ts, e.actor, e.action, e.subject, e.payload, e.prev_hash, key=None)))
    store.write_frames([(AUDIT_LOG, A.entries_frame(old))], source="legacy")
    out = au.verify_log(store)
    assert out["ok"] is False and "never anchored" in out["first_break"]["why"]
    au.log(store, actor="carol", action="declaration", subject="model:m:2", payload={})
    stored = rows(store)
    assert [(e.seq, e.action, e.actor) for e in stored[3:]] == [(3, A.KEYED_ACTION, "carol"), (4, "declaration", "carol")]
    assert json.loads(stored[3].payload) == {"unkeyed_entries": 3, "unkeyed_head": old[-1].hash}
    out = au.verify_log(store)
    assert out["ok"] is True and out["keyed_from"] == 3
    assert au.anchor(store, actor="ops")["anchored"] is False  # already anchored
    sql("UPDATE audit_log SET actor = 'mallory' WHERE seq = 1")(store, tmp_path)
    out = au.verify_log(store)
    assert out["first_break"]["seq"] == 1 and "SHA-256" in out["first_break"]["why"]


def test_the_cli_names_the_first_bad_entry(tmp_path: Path) -> None:
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    run = lambda *a: clirun.cli(*a, env=env)  # noqa: E731
    for v in ("1", "2", "3"):
        assert run("governance", "registry", "model", "scorer", v, "--purpose", "credit scoring").returncode == 0
    ok = run("verify", "--auditlog")
    assert ok.returncode == 0 and "audit log intact: 3 entries" in ok.stdout and "3 signed checkpoints" in ok.stdout
    store = Store.open(f"sqlite:///{tmp_path / 'fleetscope.store.db'}")
    import getpass

    assert [e.actor for e in rows(store)] == [getpass.getuser()] * 3
    sql("UPDATE audit_log SET subject = 'model:other:1' WHERE seq = 1")(store, tmp_path)
    store.engine.dispose()
    bad = run("verify", "--auditlog")
    assert bad.returncode == 8 and bad.stdout.startswith("audit log BROKEN at seq 1: seq 1: the content does not match its HMAC"), bad.stdout
    as_json = json.loads(run("verify", "--auditlog", "--json").stdout)
    assert as_json["ok"] is False and as_json["first_break"]["seq"] == 1 and as_json["entries"] == 3


def test_the_bundle_records_the_head_after_its_own_export_entry(api) -> None:
    h = gov(api)
    build_pipeline(api, h)
    assert httpx.post(api.url + "/api/v1/audits", headers=h, timeout=120).status_code == 201
    ex = httpx.post(api.url + "/api/v1/exports", headers=h, timeout=120)
    assert ex.status_code == 201, ex.text
    bundle = zipfile.ZipFile(io.BytesIO(httpx.get(api.url + f"/api/v1/exports/{ex.json()['export_id']}", headers=h).content))
    manifest = json.loads(bundle.read(exports.MANIFEST))
    last = rows(api.app.state.store)[-1]
    assert (last.action, last.actor, last.subject) == ("export", "gov", f"audit:{manifest['meta']['audit_id']}")
    assert manifest["meta"]["auditlog_head"] == last.hash and manifest["meta"]["auditlog_seq"] == last.seq
    cp = A.parse_checkpoint(bundle.read(exports.AUDITLOG_CHECKPOINT).decode().strip())
    public = exports.load_public_key(httpx.get(api.url + "/api/v1/signing-key", headers=h).content)
    assert (cp.seq, cp.head) == (last.seq, last.hash) and cp.signature_valid(public)
    assert json.loads(bundle.read(exports.AUDITLOG_ENTRY))["hash"] == last.hash
    assert json.loads(last.payload)["reports"]["report.json"] == manifest["files"]["report/report.json"]["sha256"]
    v = httpx.get(api.url + "/api/v1/auditlog/verify", headers=h).json()
    assert v["ok"] is True and v["head"] == last.hash


def test_governance_and_alerting_changes_are_logged_with_the_token_name(api) -> None:
    engine = api.app.state.store.engine
    admin = {"Authorization": "Bearer " + auth.create_token(engine, "ops-alice", ["admin"])}
    h = gov(api)
    assert httpx.put(api.url + "/api/v1/datasets", json={"namespace": "lake", "name": "raw"}, headers=h).status_code == 200
    assert httpx.put(api.url + "/api/v1/models/ranker/1", json={"intended_purpose": "ranking"}, headers=h).status_code == 200
    r = httpx.put(api.url + "/api/v1/alerts/receivers/pager", headers=admin,
                  json={"kind": "standard", "url": "http://93.184.215.14/hook/p4th?k=s3cret", "secrets": ["whsec_" + "A" * 32]})
    assert r.status_code == 200, r.text
    assert httpx.put(api.url + "/api/v1/alerts/rules/SlowJob", headers=admin, json={"findings": {"kind": "straggler"}}).status_code == 200
    r = httpx.post(api.url + "/api/v1/alerts/silences", headers=admin, json={
        "matchers": ['host="n1"'], "endsAt": "2099-01-01T00:00:00Z", "createdBy": "someone-else", "comment": "maintenance"})
    assert r.status_code == 201, r.text
    sid = r.json()["silenceID"]
    (sil,) = httpx.get(api.url + "/api/v1/alerts/silences", headers=admin).json()
    assert sil["createdBy"] == "ops-alice"  # the body's createdBy is ignored
    assert httpx.delete(api.url + f"/api/v1/alerts/silences/{sid}", headers=admin).status_code == 204
    assert httpx.delete(api.url + "/api/v1/alerts/receivers/pager", headers=admin).status_code == 204
    assert httpx.delete(api.url + "/api/v1/alerts/receivers/pager", headers=admin).status_code == 404  # logs nothing
    bad = httpx.post(api.url + "/api/v1/alerts/silences", headers=admin, json={"matchers": ['host=~".*"'], "endsAt": "2099-01-01T00:00:00Z"})
    assert bad.status_code == 422  # refused: nothing written, nothing logged
    log = rows(api.app.state.store)
    assert [(e.action, e.actor, e.subject) for e in log] == [
        ("registry_dataset", "gov", "dataset:lake:raw"),
        ("registry_model", "gov", "model:ranker:1"),
        ("alert_receiver_put", "ops-alice", "alert_receiver:pager"),
        ("alert_rule_put", "ops-alice", "alert_rule:SlowJob"),
        ("silence_create", "ops-alice", f"silence:{sid}"),
        ("silence_expire", "ops-alice", f"silence:{sid}"),
        ("alert_receiver_delete", "ops-alice", "alert_receiver:pager"),
    ]
    receiver = json.loads(log[2].payload)
    assert receiver == {"kind": "standard", "url_display": "http://93.184.215.14", "options": {}, "secrets_changed": True}
    assert "s3cret" not in log[2].payload and "p4th" not in log[2].payload and "whsec_" not in log[2].payload
    assert json.loads(log[4].payload)["created_by"] == "ops-alice"
    assert au.verify_log(api.app.state.store)["ok"] is True


def test_a_key_file_open_to_others_is_the_verdict_not_a_crash(logged) -> None:
    store, settings = logged
    (settings.data_dir / "audit.key").chmod(0o640)
    out = au.verify_log(store)
    assert out["ok"] is False and out["entries"] == N and "chmod 600" in out["first_break"]["why"]


def test_cli_silences_are_logged_as_the_os_user(tmp_path: Path) -> None:
    import getpass

    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    run = lambda *a: clirun.cli(*a, env=env)  # noqa: E731
    made = run("alerts", "silence", 'host="n1"', "--for", "1h", "--by", "oncall", "--comment", "GPU swap")
    assert made.returncode == 0, made.stderr
    sid = made.stdout.split()[1]
    assert run("alerts", "expire", sid).returncode == 0
    store = Store.open(f"sqlite:///{tmp_path / 'fleetscope.store.db'}")
    log = rows(store)
    store.engine.dispose()
    assert [(e.action, e.actor, e.subject) for e in log] == [("silence_create", getpass.getuser(), f"silence:{sid}"),
                                                            ("silence_expire", getpass.getuser(), f"silence:{sid}")]
    assert json.loads(log[0].payload)["created_by"] == "oncall"
    assert run("verify", "--auditlog").returncode == 0
