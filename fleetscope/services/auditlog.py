"""The hash-chained audit log every governance, rule, receiver and silence change is appended to, and the
Ed25519 key that signs its checkpoints and the export bundles. Pure chain logic: ``governance/auditlog``;
this module adds the key files, the checkpoint file and the database. Every domain that records who changed
what writes here, and this module depends on none of them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fcntl
import os
import secrets
import threading
import weakref
from pathlib import Path
from typing import Any

from fleetscope import safefiles
from fleetscope import settings as settings_mod
from fleetscope.core.errors import FleetscopeError
from fleetscope.settings import Settings
from fleetscope.store import Store
from governance import auditlog, exports
from governance.aiact import frames as AF


class AuditError(FleetscopeError):
    pass


# --- audit log -------------------------------------------------------------------------------------
#
# The chain is keyed with a secret in a file (FLEETSCOPE_AUDIT_KEY_FILE, else <data dir>/audit.key) and
# every append writes a checkpoint signed with the export signing key to an append-only file
# (FLEETSCOPE_AUDIT_CHECKPOINT_FILE, else <data dir>/audit_checkpoints.jsonl); governance/auditlog.py says
# why both are needed. Every writer of one database must use the same two files: each process binds its
# store to its settings (``bind``), and an unbound store uses the environment's settings.

_BOUND: weakref.WeakKeyDictionary[Any, Settings] = weakref.WeakKeyDictionary()
_APPEND_LOCK = threading.Lock()


def bind(store: Store, settings: Settings) -> None:
    """Make ``store``'s audit log use ``settings``' key and checkpoint file, wherever it is written from
    (bound by engine, so every ``Store`` over the same engine shares it)."""
    _BOUND[store.engine] = settings


def _settings_of(store: Store) -> Settings:
    """The bound settings; else the environment's, which describe the CLI's and the dashboard's store.
    A SQLite file the environment does not name (a store opened by hand) keeps its key and checkpoints
    in its own folder, as the embedded layout does, rather than in another database's data directory."""
    bound = _BOUND.get(store.engine)
    if bound is not None:
        return bound
    env = settings_mod.load()
    path = store.engine.url.database if store.dialect == "sqlite" else None
    if path and path != ":memory:" and env.database_url.startswith("sqlite") and "///" in env.database_url:
        mine, named = Path(path).resolve(), Path(env.database_url.split("///", 1)[1]).resolve()
        if mine != named:
            return dataclasses.replace(env, data_dir=mine.parent, audit_key_file="", audit_checkpoint_file="")
    return env


def audit_key_path(settings: Settings) -> Path:
    return Path(settings.audit_key_file).expanduser() if settings.audit_key_file else settings.data_dir / "audit.key"


def checkpoint_path(settings: Settings) -> Path:
    return Path(settings.audit_checkpoint_file).expanduser() if settings.audit_checkpoint_file else settings.data_dir / "audit_checkpoints.jsonl"


def audit_key(settings: Settings, *, create: bool) -> bytes | None:
    """The audit log's HMAC key: hex text in ``FLEETSCOPE_AUDIT_KEY_FILE`` or, embedded, in
    ``<data dir>/audit.key``, generated there (0600) on first use when ``create``. None when absent and
    not to be created. ``AuditError`` for a named file that is missing, readable by others, or not a key."""
    path = audit_key_path(settings)
    if not path.exists():
        if settings.audit_key_file:
            raise AuditError(f"FLEETSCOPE_AUDIT_KEY_FILE={path}: no such file (restore the key from backup; a new key cannot verify the old entries)")
        if not create:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # O_EXCL: two processes starting together must not each write a different key.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(auditlog.KEY_BYTES) + "\n")
    mode = path.stat().st_mode
    if mode & 0o077:
        raise AuditError(f"audit key file {path} can be read or written by others (mode {mode & 0o777:04o}): chmod 600 {path}")
    text = path.read_text(encoding="ascii", errors="replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise AuditError(f"audit key file {path}: expected hex text (e.g. from `openssl rand -hex 32`)") from None
    if len(key) < auditlog.KEY_BYTES:
        raise AuditError(f"audit key file {path}: {len(key)} bytes of key; at least {auditlog.KEY_BYTES} are needed")
    return key


class _Checkpoints:
    """The checkpoint file, opened for appending (0600) and locked (``flock``) for the caller's whole
    append: every process on this host that writes the log takes the same lock, so entries and their
    checkpoints go in the same order."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> _Checkpoints:
        _APPEND_LOCK.acquire()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            _APPEND_LOCK.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            os.close(self.fd)  # closing releases the flock
        finally:
            _APPEND_LOCK.release()

    def latest(self, log_id: str) -> auditlog.Checkpoint | None:
        """The newest checkpoint of log ``log_id`` (lines of other logs are skipped); the tail is read first."""
        size = os.fstat(self.fd).st_size
        for start in (max(0, size - 65536), 0):
            data = os.pread(self.fd, size - start, start)
            lines = data.split(b"\n")[1:] if start else data.split(b"\n")
            for raw in reversed(lines):
                if not raw.strip():
                    continue
                try:
                    cp = auditlog.parse_checkpoint(raw.decode("utf-8"))
                except (ValueError, UnicodeDecodeError):
                    continue  # verify names the bad line; an append needs only the newest good one
                if cp.log == log_id:
                    return cp
            if start == 0:
                break
        return None

    def write(self, cp: auditlog.Checkpoint) -> None:
        os.write(self.fd, (cp.line() + "\n").encode())
        os.fsync(self.fd)


def log(store: Store, *, actor: str, action: str, subject: str, payload: dict[str, Any], now: dt.datetime | None = None) -> auditlog.AuditEntry:
    """Append one keyed entry and its signed checkpoint (see the notes above ``bind``)."""
    return _log(store, actor=actor, action=action, subject=subject, payload=payload, now=now)[0]


def _log(store: Store, *, actor: str, action: str, subject: str, payload: dict[str, Any],
         now: dt.datetime | None = None) -> tuple[auditlog.AuditEntry, auditlog.Checkpoint]:
    settings = _settings_of(store)
    key, signer = _append_keys(settings)
    with _Checkpoints(checkpoint_path(settings)) as cps:
        log_id, keyed_from, _ = _keyed(store, cps, key, signer, actor, now)
        entry = _insert(store, key, actor=actor, action=action, subject=subject, payload=payload, now=now)
        cp = auditlog.checkpoint(entry, log=log_id or entry.hash, keyed_from=keyed_from, key=key, signing_key=signer, ts=dt.datetime.now(dt.UTC))
        cps.write(cp)
    return entry, cp


def _append_keys(settings: Settings) -> tuple[bytes, Any]:
    """The audit key (created on first use) and the checkpoint signing key."""
    key = audit_key(settings, create=True)
    if key is None:  # create=True makes one or raises
        raise AuditError(f"no audit key at {audit_key_path(settings)}")
    return key, signing_key(settings)


def _keyed(store: Store, cps: _Checkpoints, key: bytes, signer: Any, actor: str,
           now: dt.datetime | None) -> tuple[str | None, int, auditlog.AuditEntry | None]:
    """(log id, where keying began, the ``auditlog_keyed`` entry if this call wrote it). A log without a
    checkpoint of its own but with entries was written before keying: its keyed part starts here, with an
    entry that says so (logged as ``actor``, whose write started it), checkpointed like any other."""
    first, last = _edge_entries(store)
    log_id = first.hash if first is not None and first.seq == 0 else None
    latest = cps.latest(log_id) if log_id else None
    if latest is not None:
        return log_id, latest.keyed_from, None
    if last is None:
        return None, 0, None
    marker = _insert(store, key, actor=actor, action=auditlog.KEYED_ACTION, subject="auditlog",
                     payload={"unkeyed_entries": last.seq + 1, "unkeyed_head": last.hash}, now=now)
    log_id = log_id or marker.hash
    cps.write(auditlog.checkpoint(marker, log=log_id, keyed_from=marker.seq, key=key, signing_key=signer, ts=dt.datetime.now(dt.UTC)))
    return log_id, marker.seq, marker


def _insert(store: Store, key: bytes, *, actor: str, action: str, subject: str, payload: dict[str, Any],
            now: dt.datetime | None) -> auditlog.AuditEntry:
    """Append one entry. The checkpoint lock orders writers on this host; a writer elsewhere that took the
    same ``seq`` (natural key) first leaves this row unwritten, and this one retries on the new head."""
    for _ in range(20):
        last = _edge_entries(store)[1]
        entry = auditlog.append(last, key=key, ts=now or dt.datetime.now(dt.UTC), actor=actor, action=action, subject=subject, payload=payload)
        written = store.write_frames([(AF.AUDIT_LOG, auditlog.entries_frame([entry]))], source="auditlog").written
        if written.get("audit_log") == 1:
            return entry
    raise AuditError("could not append to the audit log: 20 concurrent writers in a row took its head")


def _edge_entries(store: Store) -> tuple[auditlog.AuditEntry | None, auditlog.AuditEntry | None]:
    """The log's lowest and highest entries (None, None when it is empty)."""
    rows = store.query("SELECT * FROM audit_log WHERE seq = (SELECT MIN(seq) FROM audit_log) OR seq = (SELECT MAX(seq) FROM audit_log)",
                       schema_=AF.AUDIT_LOG.schema)
    if rows.height == 0:
        return None, None
    found = auditlog.entries_from_frame(rows)
    return found[0], found[-1]


def anchor(store: Store, *, actor: str) -> dict[str, Any]:
    """Key and checkpoint a log written before keying now (the ``auditlog_keyed`` entry, logged as
    ``actor``) rather than at the next governance write; an empty or already anchored log is left as it is."""
    settings = _settings_of(store)
    key, signer = _append_keys(settings)
    with _Checkpoints(checkpoint_path(settings)) as cps:
        _, keyed_from, marker = _keyed(store, cps, key, signer, actor, None)
    if marker is None:
        return {"anchored": False, "keyed_from": keyed_from, "why": "the log is empty or already anchored by signed checkpoints"}
    return {"anchored": True, "keyed_from": keyed_from, "seq": marker.seq, "head": marker.hash}


def verify_log(store: Store) -> dict[str, Any]:
    """Check the log under the audit key and against the signed checkpoints (``auditlog.verify``): the
    first problem is named by seq and why. Reads only: no key or file is created."""
    settings = _settings_of(store)
    path = checkpoint_path(settings)
    lines: list[str] = []
    fd = None
    try:
        if path.exists():
            # Shared lock: an append in progress finishes (entry and checkpoint) before the log is read.
            fd = os.open(path, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_SH)
        entries = auditlog.entries_from_frame(store.read("audit_log"))
        if fd is not None:
            lines = _read_lines(fd)
    finally:
        if fd is not None:
            os.close(fd)
    try:
        key = audit_key(settings, create=False)
    except AuditError as exc:  # a key file that is named but gone, open to others, or not a key: the answer, not a crash
        return {"ok": False, "entries": len(entries), "head": entries[-1].hash if entries else auditlog.GENESIS,
                "head_seq": entries[-1].seq if entries else None, "keyed_from": None, "checkpoints": 0, "latest_checkpoint": None,
                "first_break": auditlog.Break(None, str(exc)).to_dict()}
    verdict = auditlog.verify(entries, key=key, checkpoint_lines=lines, public_key=_signing_public_key(settings))
    latest = verdict.latest
    return {"ok": verdict.ok, "entries": verdict.entries, "head": verdict.head, "head_seq": verdict.head_seq, "keyed_from": verdict.keyed_from,
            "checkpoints": verdict.checkpoints,
            "latest_checkpoint": None if latest is None else {"seq": latest.seq, "head": latest.head, "ts": auditlog.ts_text(latest.ts)},
            "first_break": None if verdict.problem is None else verdict.problem.to_dict()}


def _read_lines(fd: int) -> list[str]:
    data = b""
    while chunk := os.read(fd, 1 << 20):
        data += chunk
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return lines


def _signing_public_key(settings: Settings) -> Any:
    """The signing key's public half, or None when there is no usable key (verify then says so)."""
    path = _key_path(settings)
    try:
        return exports.load_private_key(path.read_bytes()).public_key()
    except (OSError, ValueError, TypeError):
        return None


# --- declarations ----------------------------------------------------------------------------------


# --- the signing key ---------------------------------------------------------------------------------


def signing_key(settings: Settings) -> Any:
    """The Ed25519 key that signs export bundles: ``FLEETSCOPE_SIGNING_KEY`` (a PEM file) or, embedded, a key
    generated once into ``$FLEETSCOPE_DATA_DIR/signing_key.pem`` (0600) with its public half beside it."""
    path = _key_path(settings)
    if not path.exists():
        if settings.signing_key:
            raise AuditError(f"FLEETSCOPE_SIGNING_KEY={path}: no such file")
        private, public = exports.generate_keypair()
        safefiles.write_private(path, private, exclusive=True)
        safefiles.write_private(path.with_name("signing_key.pub.pem"), public)
    return exports.load_private_key(path.read_bytes())

def _key_path(settings: Settings) -> Path:
    return Path(settings.signing_key) if settings.signing_key else settings.data_dir / "signing_key.pem"


def _public_key_path(settings: Settings) -> Path:
    return _key_path(settings).with_name("signing_key.pub.pem")
