"""Compliance export bundles an auditor can verify offline.

A bundle is a zip holding::

    manifest.json          format, creation time, signer's key fingerprint, SHA-256 and size of every file
    manifest.sig           Ed25519 signature over the exact bytes of manifest.json (base64, one line)
    report/report.json     the audit report (governance.reports), in all three forms
    report/report.html
    report/report.pdf
    evidence/<frame>.csv   each evidence frame (lineage edges, fairness tables, energy and compute,
    evidence/<frame>.json  declarations and incidents, rule results) as CSV and as JSON records
    auditlog/checkpoint.json    the audit log's signed checkpoint (governance.auditlog) of the
                                export's own log entry, whose hash the manifest's meta records
    auditlog/export_entry.json  that entry

The signature covers the manifest and the manifest covers every file, so one signature check plus one
hash per file proves the whole bundle (the scheme of signed checksum files, e.g. ``SHA256SUMS.sig``).
``verify`` names every file altered, added or removed, and refuses bundles built to attack the verifier
(paths escaping the extraction folder, zip bombs, duplicate names, a missing manifest) before reading them.

Ed25519 (RFC 8032) through ``cryptography``; keys as PEM (PKCS#8 private, SubjectPublicKeyInfo public).
Pure: ``now`` is passed in; nothing is written to disk.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import stat
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import polars as pl
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fleetscope.core.errors import FleetscopeError
from governance.aiact.model import canonical_json, iso, utc

BUNDLE_FORMAT = "fleetscope-aiact-bundle/1"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
AUDITLOG_CHECKPOINT = "auditlog/checkpoint.json"
AUDITLOG_ENTRY = "auditlog/export_entry.json"
_SAFE_FRAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class BundleError(FleetscopeError, ValueError):
    """A bundle that cannot be built (bad frame name, clashing paths) or a verification that failed when
    ``VerifyResult.raise_for_status`` is called."""


@dataclass(frozen=True)
class BundleLimits:
    """What a verifier accepts before reading anything. Reports and evidence of one audit are megabytes; a
    bundle near these limits is an attack or a mistake."""

    max_entries: int = 10_000
    max_entry_bytes: int = 512 * 2**20
    max_total_bytes: int = 2 * 2**30
    max_ratio: float = 200.0  # uncompressed / compressed, for entries over ``ratio_floor_bytes``
    ratio_floor_bytes: int = 2**20
    max_manifest_bytes: int = 16 * 2**20


DEFAULT_LIMITS = BundleLimits()


# --- keys ---------------------------------------------------------------------------------------------


def generate_keypair(password: bytes | None = None) -> tuple[bytes, bytes]:
    """A new Ed25519 key pair as (private PEM, public PEM); the private key encrypted with ``password`` if given."""
    key = Ed25519PrivateKey.generate()
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
    return priv, public_pem(key.public_key())


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_private_key(pem: bytes, password: bytes | None = None) -> Ed25519PrivateKey:
    """Raises ``ValueError`` for a key that is not Ed25519 (an RSA key would sign something else entirely)."""
    key = serialization.load_pem_private_key(pem, password=password)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"expected an Ed25519 private key, got {type(key).__name__}")
    return key


def load_public_key(pem: bytes) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(pem)
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"expected an Ed25519 public key, got {type(key).__name__}")
    return key


def key_fingerprint(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """SHA-256 of the raw 32-byte public key, hex: what the manifest records and an auditor compares."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return hashlib.sha256(pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).hexdigest()


# --- building -----------------------------------------------------------------------------------------


def evidence_files(frames: Mapping[str, pl.DataFrame]) -> dict[str, bytes]:
    """``evidence/<name>.csv`` and ``evidence/<name>.json`` (records) for each frame. Names must be plain
    identifiers: they become paths."""
    out: dict[str, bytes] = {}
    for name, df in sorted(frames.items()):
        if not _SAFE_FRAME.match(name):
            raise BundleError(f"evidence name {name!r} is not a plain identifier (a-z, 0-9, _)")
        out[f"evidence/{name}.csv"] = df.write_csv().encode()
        out[f"evidence/{name}.json"] = (json.dumps(df.to_dicts(), default=_jsonable, ensure_ascii=False, indent=1) + "\n").encode()
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, datetime):
        return iso(v)
    return str(v)


def _zip_time(now: datetime) -> tuple[int, int, int, int, int, int]:
    t = utc(now)
    # Zip stores local-less DOS times from 1980; the manifest holds the exact instant.
    return (max(t.year, 1980), t.month, t.day, t.hour, t.minute, t.second - t.second % 2)


def build_bundle(report_files: Mapping[str, bytes], evidence: Mapping[str, pl.DataFrame], private_key: Ed25519PrivateKey, *,
                 now: datetime, meta: Mapping[str, Any] | None = None, extra_files: Mapping[str, bytes] | None = None) -> bytes:
    """The signed zip. ``report_files``: ``governance.reports.render_all(report)`` (stored under
    ``report/``); ``evidence``: frames by name; ``meta``: what the manifest should say of the audit (scope,
    rule set, audit id). The same inputs and ``now`` give the same bytes."""
    files: dict[str, bytes] = {}
    for name, data in report_files.items():
        files[f"report/{name}"] = data
    files.update(evidence_files(evidence))
    for name, data in (extra_files or {}).items():
        if name in files or name in (MANIFEST, SIGNATURE):
            raise BundleError(f"extra file {name!r} clashes with a bundle file")
        problem = unsafe_name(name)
        if problem:
            raise BundleError(f"extra file {name!r}: {problem}")
        files[name] = data
    manifest = {
        "format": BUNDLE_FORMAT,
        "created_at": iso(now),
        "key_fingerprint": key_fingerprint(private_key),
        "meta": dict(meta or {}),
        "files": {p: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for p, d in sorted(files.items())},
    }
    manifest_bytes = (canonical_json(manifest) + "\n").encode()
    sig = base64.b64encode(private_key.sign(manifest_bytes)) + b"\n"
    buf = io.BytesIO()
    stamp = _zip_time(now)
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in [(MANIFEST, manifest_bytes), (SIGNATURE, sig), *sorted(files.items())]:
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            z.writestr(info, data)
    return buf.getvalue()


# --- verifying ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyResult:
    """``ok`` only when the signature verifies with the given key and every file matches the manifest.
    ``refused``: the bundle was rejected before its files were compared (hostile or malformed); ``errors``
    says why, in sentences a person can act on."""

    ok: bool
    signature_valid: bool
    altered: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    refused: bool = False
    key_fingerprint: str | None = None
    manifest: Mapping[str, Any] | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "signature_valid": self.signature_valid, "altered": list(self.altered), "added": list(self.added),
                "removed": list(self.removed), "errors": list(self.errors), "refused": self.refused, "key_fingerprint": self.key_fingerprint,
                "meta": dict(self.manifest.get("meta", {})) if self.manifest else None}

    def summary(self) -> str:
        if self.ok:
            return f"bundle verified: {len(self.manifest['files']) if self.manifest else 0} files, signed by key {self.key_fingerprint}"
        parts = list(self.errors)
        for label, names in (("altered", self.altered), ("added", self.added), ("removed", self.removed)):
            if names:
                parts.append(f"{label}: {', '.join(names)}")
        return ("bundle refused: " if self.refused else "bundle does not verify: ") + "; ".join(parts)

    def raise_for_status(self) -> None:
        if not self.ok:
            raise BundleError(self.summary())


def unsafe_name(name: str) -> str | None:
    """Why ``name`` could write outside an extraction folder or collide there (zip slip), else None."""
    if not name or "\x00" in name:
        return "empty name or NUL byte"
    if "\\" in name:
        return "backslash in path (a separator on Windows)"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "empty, '.' or '..' path component"
    if any(ord(c) < 32 for c in name):
        return "control character in path"
    return None


def _refuse(msg: str) -> VerifyResult:
    return VerifyResult(False, False, errors=(msg,), refused=True)


def _read_entry(z: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    """Read at most ``limit`` bytes: the header's size may lie, so the stream itself is bounded."""
    out = bytearray()
    with z.open(info) as f:
        while True:
            chunk = f.read(min(2**20, limit + 1 - len(out)))
            if not chunk:
                break
            out += chunk
            if len(out) > limit:
                raise BundleError(f"{info.filename}: expands past {limit} bytes")
    return bytes(out)


def verify(bundle: bytes, public_key: Ed25519PublicKey, *, limits: BundleLimits = DEFAULT_LIMITS) -> VerifyResult:
    """Check a bundle offline against the signer's public key; never raises for what the bundle holds.

    Refused outright (``refused=True``): not a zip; more than ``max_entries`` entries; an entry whose path
    is absolute, has ``..``, backslashes or control characters (zip slip); a symlink or directory entry;
    duplicate names (also differing only in case, which collide on case-insensitive file systems); an
    entry or total over the size limits or compressed more than ``max_ratio`` to one (zip bomb); no
    manifest or signature; a manifest that is not a valid bundle manifest. Otherwise the signature is
    checked and each file compared: ``altered`` (hash or size differs, or its data is corrupt), ``added``
    (not in the manifest), ``removed`` (in the manifest, not in the zip).
    """
    try:
        z = zipfile.ZipFile(io.BytesIO(bundle))
        infos = z.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as exc:
        return _refuse(f"not a readable zip archive ({exc})")
    if len(infos) > limits.max_entries:
        return _refuse(f"{len(infos)} entries; at most {limits.max_entries} accepted")
    seen: dict[str, str] = {}
    total = 0
    for info in infos:
        name = info.filename
        problem = unsafe_name(name)
        if problem:
            return _refuse(f"entry {name!r} refused: {problem}")
        mode = info.external_attr >> 16
        # Writers that set no file type leave 0 in the type bits; only an explicit non-file type is refused.
        if info.is_dir() or stat.S_IFMT(mode) not in (0, stat.S_IFREG):
            return _refuse(f"entry {name!r} refused: not a regular file (directory, symlink or device)")
        folded = name.casefold()
        if folded in seen:
            return _refuse(f"duplicate entry {name!r}" + ("" if seen[folded] == name else f" (same as {seen[folded]!r} ignoring case)"))
        seen[folded] = name
        if info.file_size > limits.max_entry_bytes:
            return _refuse(f"entry {name!r} declares {info.file_size} bytes; at most {limits.max_entry_bytes} accepted")
        total += info.file_size
        if total > limits.max_total_bytes:
            return _refuse(f"entries declare more than {limits.max_total_bytes} bytes in total")
        if info.file_size > limits.ratio_floor_bytes and info.file_size > limits.max_ratio * max(info.compress_size, 1):
            return _refuse(f"entry {name!r} is compressed {info.file_size / max(info.compress_size, 1):.0f} to 1 (zip bomb?)")
    names = {i.filename: i for i in infos}
    if MANIFEST not in names:
        return _refuse(f"no {MANIFEST}: this is not a Fleetscope export bundle, or its manifest was removed")
    if SIGNATURE not in names:
        return _refuse(f"no {SIGNATURE}: the bundle is unsigned")
    try:
        manifest_bytes = _read_entry(z, names[MANIFEST], limits.max_manifest_bytes)
        sig_text = _read_entry(z, names[SIGNATURE], 1024)
    except (BundleError, zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:
        return _refuse(f"manifest or signature unreadable: {exc}")
    try:
        manifest = json.loads(manifest_bytes)
        _check_manifest(manifest)
    except (ValueError, TypeError, KeyError) as exc:
        return _refuse(f"{MANIFEST} is not a valid bundle manifest: {exc}")
    errors: list[str] = []
    fp = key_fingerprint(public_key)
    sig_ok = False
    try:
        public_key.verify(base64.b64decode(sig_text.strip(), validate=True), manifest_bytes)
        sig_ok = True
    except (InvalidSignature, ValueError):
        claimed = manifest.get("key_fingerprint")
        who = f" (the manifest names key {claimed}; the key given is {fp})" if claimed != fp else ""
        errors.append(f"the signature over {MANIFEST} does not verify with the given key{who}: the manifest was changed or signed by another key")
    listed: Mapping[str, Mapping[str, Any]] = manifest["files"]
    altered, added = [], []
    for name, info in sorted(names.items()):
        if name in (MANIFEST, SIGNATURE):
            continue
        if name not in listed:
            added.append(name)
            continue
        want = listed[name]
        if info.file_size != want["size"]:
            altered.append(name)
            continue
        try:
            data = _read_entry(z, info, min(limits.max_entry_bytes, int(want["size"])))
        except (BundleError, zipfile.BadZipFile, zlib.error, OSError, EOFError):
            altered.append(name)  # corrupt data (CRC or deflate error) is an alteration of that file
            continue
        if hashlib.sha256(data).hexdigest() != want["sha256"]:
            altered.append(name)
    removed = sorted(set(listed) - set(names))
    ok = sig_ok and not altered and not added and not removed
    return VerifyResult(ok, sig_ok, tuple(altered), tuple(added), tuple(removed), tuple(errors), False, fp if sig_ok else manifest.get("key_fingerprint"), manifest)


def _check_manifest(m: Any) -> None:
    if not isinstance(m, dict):
        raise ValueError("not a JSON object")
    if m.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"format {m.get('format')!r}, expected {BUNDLE_FORMAT!r}")
    files = m.get("files")
    if not isinstance(files, dict):
        raise ValueError("'files' is not an object")
    for name, e in files.items():
        problem = unsafe_name(name)
        if problem:
            raise ValueError(f"lists {name!r}: {problem}")
        if name in (MANIFEST, SIGNATURE):
            raise ValueError(f"lists {name!r}, which cannot cover itself")
        if not (isinstance(e, dict) and isinstance(e.get("sha256"), str) and _HEX64.match(e["sha256"])
                and isinstance(e.get("size"), int) and e["size"] >= 0):
            raise ValueError(f"entry for {name!r} needs a hex sha256 and a non-negative integer size")
