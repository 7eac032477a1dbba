"""Alerting settings (environment variables with embedded defaults) and the secret key for receivers.

Kept apart from ``fleetscope.settings`` so alerting can be configured without touching the kernel; the
variables follow the same convention and ``table()`` lists them for the README.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from fleetscope import safefiles
from fleetscope import settings as settings_mod
from fleetscope.settings import env as _env
from fleetscope.services.alerting.notifiers import OutboundPolicy, RetryPolicy
from cryptography.fernet import Fernet


def _float(name: str, default: float) -> float:
    raw = _env(name, str(default))
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}: must not be negative")
    return value


def _positive(name: str, default: float) -> float:
    value = _float(name, default)
    if not 0 < value < float("inf"):
        raise ValueError(f"{name}={value!r}: expected a positive, finite number of seconds")
    return value


def _bytes(name: str, default: int) -> int:
    raw = _env(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a whole number of bytes") from None
    if not 1024 <= value <= 64 * 1024 * 1024:
        raise ValueError(f"{name}={raw!r}: expected 1024 to 67108864 bytes")
    return value


def _bool(name: str, default: bool) -> bool:
    raw = _env(name, "1" if default else "0").lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def _f(env: str, default: str, doc: str):  # type: ignore[no-untyped-def]
    return field(metadata={"env": env, "default": default, "doc": doc})


@dataclass(frozen=True)
class AlertSettings:
    rules_path: Path | None = _f("FLEETSCOPE_ALERT_RULES", "shipped default_rules.yaml", "alerting YAML (rules, route, inhibit_rules) loaded at start; API rule edits are layered on top")
    eval_interval_s: float = _f("FLEETSCOPE_ALERT_EVAL_INTERVAL_S", "5", "how often beat evaluates the rules and flushes notification groups")
    deliver_interval_s: float = _f("FLEETSCOPE_ALERT_DELIVER_INTERVAL_S", "5", "how often beat sweeps the outbox for due retries and deliveries a dead worker left")
    delivery_timeout_s: float = _f("FLEETSCOPE_ALERT_DELIVERY_TIMEOUT_S", "10", "deadline of one delivery attempt: resolving, connecting, sending and the answer together (a receiver's timeout_s option can shorten it, not lengthen it)")
    response_max_bytes: int = _f("FLEETSCOPE_ALERT_RESPONSE_MAX_BYTES", "65536", "most bytes of a receiver's refusing (non-2xx) answer read for the error text; a 2xx answer's body is not read")
    backoff_base_s: float = _f("FLEETSCOPE_ALERT_BACKOFF_BASE_S", "2", "first retry delay; doubles per attempt, with jitter")
    backoff_cap_s: float = _f("FLEETSCOPE_ALERT_BACKOFF_CAP_S", "300", "longest delay between retries")
    dead_after_s: float = _f("FLEETSCOPE_ALERT_DEAD_AFTER_S", "86400", "a notification not delivered after this long is dead-lettered")
    allow_loopback: bool = _f("FLEETSCOPE_ALERT_ALLOW_LOOPBACK", "false", "allow webhook URLs on loopback addresses (tests, a receiver on the same host)")
    allow_private: bool = _f("FLEETSCOPE_ALERT_ALLOW_PRIVATE", "false", "allow webhook URLs on private (RFC 1918, ULA, CGNAT) addresses; metadata and link-local stay refused")
    external_url: str = _f("FLEETSCOPE_ALERT_EXTERNAL_URL", "$FLEETSCOPE_API_URL", "externalURL and generatorURL base in notifications")
    secret_key: str | None = _f("FLEETSCOPE_SECRET_KEY", "generated into $FLEETSCOPE_DATA_DIR/secret.key (0600)", "Fernet key(s) encrypting receiver URLs and secrets; comma-separated for rotation, the first encrypts")

    @property
    def outbound(self) -> OutboundPolicy:
        return OutboundPolicy(self.allow_loopback, self.allow_private)

    @property
    def retry(self) -> RetryPolicy:
        return RetryPolicy(base_s=self.backoff_base_s, cap_s=self.backoff_cap_s, dead_after_s=self.dead_after_s)


def load(settings: settings_mod.Settings | None = None) -> AlertSettings:
    settings = settings or settings_mod.load()
    rules = os.environ.get("FLEETSCOPE_ALERT_RULES")
    return AlertSettings(
        rules_path=Path(rules).expanduser() if rules else None,
        eval_interval_s=_float("FLEETSCOPE_ALERT_EVAL_INTERVAL_S", 5.0),
        deliver_interval_s=_float("FLEETSCOPE_ALERT_DELIVER_INTERVAL_S", 5.0),
        delivery_timeout_s=_positive("FLEETSCOPE_ALERT_DELIVERY_TIMEOUT_S", 10.0),
        response_max_bytes=_bytes("FLEETSCOPE_ALERT_RESPONSE_MAX_BYTES", 65536),
        backoff_base_s=_float("FLEETSCOPE_ALERT_BACKOFF_BASE_S", 2.0),
        backoff_cap_s=_float("FLEETSCOPE_ALERT_BACKOFF_CAP_S", 300.0),
        dead_after_s=_float("FLEETSCOPE_ALERT_DEAD_AFTER_S", 86400.0),
        allow_loopback=_bool("FLEETSCOPE_ALERT_ALLOW_LOOPBACK", False),
        allow_private=_bool("FLEETSCOPE_ALERT_ALLOW_PRIVATE", False),
        external_url=_env("FLEETSCOPE_ALERT_EXTERNAL_URL", settings.api_url),
        secret_key=os.environ.get("FLEETSCOPE_SECRET_KEY") or None,
    )


def table() -> list[tuple[str, str, str]]:
    return [(f.metadata["env"], f.metadata["default"], f.metadata["doc"]) for f in fields(AlertSettings)]


def secret_keys(settings: settings_mod.Settings, alert_settings: AlertSettings) -> list[bytes]:
    """The Fernet keys: ``FLEETSCOPE_SECRET_KEY`` (comma-separated, first one encrypts), or in the embedded
    mode a key generated once into ``$FLEETSCOPE_DATA_DIR/secret.key`` with mode 0600. Several hosts
    sharing one database must share the key: set the variable."""
    if alert_settings.secret_key:
        return [k.strip().encode() for k in alert_settings.secret_key.split(",") if k.strip()]

    path = settings.data_dir / "secret.key"
    safefiles.private_dir(settings.data_dir)
    try:
        # O_EXCL: two processes starting together must not each write a different key.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return [path.read_bytes().strip()]
    with os.fdopen(fd, "wb") as fh:
        fh.write(Fernet.generate_key())
    return [path.read_bytes().strip()]
