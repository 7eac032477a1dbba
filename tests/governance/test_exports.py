"""Signed export bundles: verified offline; altered, added and removed files named; hostile zips refused."""

from __future__ import annotations

import io
import stat
import warnings
import zipfile

import polars as pl
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives import serialization

from governance import exports as X
from tests.governance.aiact_fixtures import NOW

REPORT = {"report.json": b'{"title": "t"}\n', "report.html": b"<html><body><table><tr><td>art5</td></tr></table></body></html>",
          "report.pdf": b"%PDF-1.7\n" + b"x" * 200 + b"\n%%EOF\n"}


@pytest.fixture(scope="module")
def keys():
    priv_pem, pub_pem = X.generate_keypair()
    return X.load_private_key(priv_pem), X.load_public_key(pub_pem)


@pytest.fixture(scope="module")
def bundle(keys) -> bytes:
    ev = {
        "lineage_io": pl.DataFrame({"run_id": ["r1", "r1"], "direction": ["input", "output"], "dataset_name": ["raw", "clean"]}),
        "aiact_rule_result": pl.DataFrame({"rule_id": ["art5", "art9"], "status": ["pass", "fail"], "as_of": [NOW, NOW]}),
    }
    return X.build_bundle(REPORT, ev, keys[0], now=NOW, meta={"audit_id": "a1", "scope": "registry"})


def rezip(data: bytes, *, change: dict[str, bytes | None] | None = None, add: dict[str, bytes] | None = None) -> bytes:
    """A copy of the bundle with entries replaced (None removes them) or added; CRCs are recomputed, as
    someone editing a file inside the zip would leave them."""
    change = change or {}
    src = zipfile.ZipFile(io.BytesIO(data))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            if info.filename in change:
                if change[info.filename] is not None:
                    z.writestr(info, change[info.filename])
            else:
                z.writestr(info, src.read(info))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # duplicate names are the point of some tests
            for name, d in (add or {}).items():
                z.writestr(name, d)
    return buf.getvalue()


def test_round_trip_and_reproducible(bundle, keys) -> None:
    r = X.verify(bundle, keys[1])
    assert r.ok and r.signature_valid and not r.errors, r.summary()
    assert r.key_fingerprint == X.key_fingerprint(keys[1]) == r.manifest["key_fingerprint"]
    names = set(zipfile.ZipFile(io.BytesIO(bundle)).namelist())
    assert {"manifest.json", "manifest.sig", "report/report.pdf", "evidence/lineage_io.csv", "evidence/aiact_rule_result.json"} <= names
    assert set(r.manifest["files"]) == names - {"manifest.json", "manifest.sig"}
    again = X.build_bundle(REPORT, {"lineage_io": pl.DataFrame({"run_id": ["r1", "r1"], "direction": ["input", "output"], "dataset_name": ["raw", "clean"]}),
                                    "aiact_rule_result": pl.DataFrame({"rule_id": ["art5", "art9"], "status": ["pass", "fail"], "as_of": [NOW, NOW]})},
                           keys[0], now=NOW, meta={"audit_id": "a1", "scope": "registry"})
    assert again == bundle
    csv = zipfile.ZipFile(io.BytesIO(bundle)).read("evidence/aiact_rule_result.csv").decode()
    assert csv.splitlines()[0] == "rule_id,status,as_of" and "art9,fail" in csv


def test_one_byte_altered_names_that_file(bundle, keys) -> None:
    html = bytearray(REPORT["report.html"])
    html[30] ^= 0x01
    r = X.verify(rezip(bundle, change={"report/report.html": bytes(html)}), keys[1])
    assert not r.ok and r.signature_valid
    assert r.altered == ("report/report.html",) and not r.added and not r.removed
    assert "report/report.html" in r.summary()
    with pytest.raises(X.BundleError, match="report/report.html"):
        r.raise_for_status()


def test_raw_byte_flip_in_the_zip_names_that_file(bundle, keys) -> None:
    z = zipfile.ZipFile(io.BytesIO(bundle))
    info = z.getinfo("evidence/lineage_io.csv")
    raw = bytearray(bundle)
    name_len = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28], "little")
    extra_len = int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    raw[start + info.compress_size // 2] ^= 0x10
    r = X.verify(bytes(raw), keys[1])
    assert not r.ok and r.altered == ("evidence/lineage_io.csv",), r.summary()


def test_added_and_removed_files_are_named(bundle, keys) -> None:
    r = X.verify(rezip(bundle, add={"evidence/extra.csv": b"a,b\n"}), keys[1])
    assert not r.ok and r.added == ("evidence/extra.csv",) and not r.altered
    r = X.verify(rezip(bundle, change={"report/report.pdf": None}), keys[1])
    assert not r.ok and r.removed == ("report/report.pdf",) and not r.added


def test_edited_manifest_or_wrong_key_fails_the_signature(bundle, keys) -> None:
    z = zipfile.ZipFile(io.BytesIO(bundle))
    m = z.read("manifest.json").replace(b'"audit_id":"a1"', b'"audit_id":"a2"')
    r = X.verify(rezip(bundle, change={"manifest.json": m}), keys[1])
    assert not r.ok and not r.signature_valid and "does not verify" in r.errors[0]
    other = X.load_public_key(X.generate_keypair()[1])
    r = X.verify(bundle, other)
    assert not r.ok and not r.signature_valid and "another key" in r.errors[0] and X.key_fingerprint(other) in r.errors[0]


def _zip(entries: list[tuple[str | zipfile.ZipInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in entries:
                z.writestr(name, data)
    return buf.getvalue()


def _symlink() -> zipfile.ZipInfo:
    info = zipfile.ZipInfo("report/link")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


@pytest.mark.parametrize("entries,message", [
    ([("../../etc/cron.d/x", b"pwn")], "'..'"),
    ([("/etc/passwd", b"pwn")], "absolute path"),
    ([("C:/Windows/x", b"pwn")], "absolute path"),
    ([("report\\..\\..\\x", b"pwn")], "backslash"),
    ([(_symlink(), b"/etc/passwd")], "not a regular file"),
    ([("manifest.json", b"{}"), ("manifest.json", b"{}")], "duplicate entry"),
    ([("report/A.txt", b"1"), ("report/a.txt", b"2")], "ignoring case"),
    ([("report/report.json", b"{}")], "no manifest.json"),
    ([("manifest.json", b"{}")], "no manifest.sig"),
    ([("manifest.json", b"[1]"), ("manifest.sig", b"AAAA")], "not a valid bundle manifest"),
    ([("manifest.json", b'{"format": "fleetscope-aiact-bundle/1", "files": {"../x": {"sha256": "' + b"0" * 64 + b'", "size": 1}}}'),
      ("manifest.sig", b"AAAA")], "not a valid bundle manifest"),
])
def test_hostile_bundles_are_refused(keys, entries, message) -> None:
    r = X.verify(_zip(entries), keys[1])
    assert r.refused and not r.ok and message in r.errors[0], r.errors


def test_zip_bomb_and_sizes_refused(bundle, keys) -> None:
    bomb = _zip([("manifest.json", b"{}"), ("manifest.sig", b""), ("evidence/zeros.csv", b"\0" * (4 * 2**20))])
    r = X.verify(bomb, keys[1])
    assert r.refused and "zip bomb" in r.errors[0]
    r = X.verify(bundle, keys[1], limits=X.BundleLimits(max_entry_bytes=100))
    assert r.refused and "declares" in r.errors[0]
    r = X.verify(bundle, keys[1], limits=X.BundleLimits(max_entries=3))
    assert r.refused and "entries" in r.errors[0]
    assert X.verify(b"not a zip at all", keys[1]).refused


def test_key_helpers() -> None:
    priv_pem, pub_pem = X.generate_keypair(password=b"s3cret")
    assert b"ENCRYPTED PRIVATE KEY" in priv_pem
    priv = X.load_private_key(priv_pem, b"s3cret")
    assert X.key_fingerprint(priv) == X.key_fingerprint(X.load_public_key(pub_pem))
    assert X.public_pem(priv.public_key()) == pub_pem
    rsa_pem = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(ValueError, match="Ed25519"):
        X.load_private_key(rsa_pem)


def test_bad_evidence_names_refused_when_building(keys) -> None:
    with pytest.raises(X.BundleError, match="plain identifier"):
        X.build_bundle(REPORT, {"../x": pl.DataFrame({"a": [1]})}, keys[0], now=NOW)
    with pytest.raises(X.BundleError, match="clashes"):
        X.build_bundle(REPORT, {}, keys[0], now=NOW, extra_files={"report/report.pdf": b""})


def test_bundle_of_a_real_audit(keys) -> None:
    from governance import reports as R
    from governance.aiact import evaluate
    from governance.aiact.frames import audit_frames, declaration_frame
    from tests.governance.aiact_fixtures import high_risk

    if R.pdf_engine() is None:
        pytest.skip("WeasyPrint is not importable here: pip install weasyprint; apt-get install -y libpango-1.0-0 libpangoft2-1.0-0")
    ev = high_risk()
    audit = evaluate(ev, NOW)
    rep = R.build_report([audit], now=NOW, scope="model:cv-screener:1")
    frames = {**audit_frames([audit], "a1", scope=rep["scope"]), "aiact_declaration": declaration_frame(ev.declarations)}
    data = X.build_bundle(R.render_all(rep), frames, keys[0], now=NOW, meta={"audit_id": "a1", "scope": rep["scope"]})
    r = X.verify(data, keys[1])
    assert r.ok, r.summary()
    assert "report/report.pdf" in r.manifest["files"] and "evidence/aiact_declaration.csv" in r.manifest["files"]
