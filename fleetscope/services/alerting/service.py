"""What the API, the worker and the CLI share to run alerting: settings, the rules file and the secret box.

The CLI's alerting verbs are thin over ``fleetscope.services.alerting.state``; ``open_alerting`` gives them what
those functions take (``store.engine``, ``box``, ``settings.outbound``, ``effective_config()``). Changes of
rules, silences and receivers go through the audited functions at the end of this module.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from fleetscope import settings as settings_mod
from fleetscope.services.alerting import config as C
from fleetscope.services.alerting import dispatch as D
from fleetscope.services.alerting import state as ST
from fleetscope.services.alerting.rules import AlertingConfig, Rule, load_config
from fleetscope.services import auditlog
from fleetscope.store import Store


@dataclass
class Alerting:
    settings: C.AlertSettings
    base: AlertingConfig  # the rules file, read once at start
    box: ST.SecretBox

    def effective_config(self, engine: Engine) -> AlertingConfig:
        """The file's rules with the API's edits on top, read now."""
        return ST.effective_config(engine, self.base)


def open_alerting(settings: settings_mod.Settings | None = None) -> Alerting:
    """Load the alerting settings, validate the rules file (``RuleError`` names the rule and field) and
    open the secret box (generating the embedded key file on first use)."""
    settings = settings or settings_mod.load()
    alert = C.load(settings)
    base = load_config(alert.rules_path)
    if not base.external_url:
        base = AlertingConfig(base.rules, base.route, base.inhibit_rules, alert.external_url)
    return Alerting(alert, base, ST.SecretBox(C.secret_keys(settings, alert)))


# --- audited changes --------------------------------------------------------------------------------
#
# Who changed what the alerting sends, to whom, and what it keeps quiet belongs in the governance trail: a
# silenced page or a receiver pointed elsewhere is how an incident goes unseen. Every edge (API, CLI,
# dashboard) changes rules, silences and receivers through these, never through ``state`` directly, and
# each change is appended to the audit log (``fleetscope.services.auditlog.log``) as ``actor`` once it is
# committed. A change refused (``ValueError``, ``RuleError``, ``DeliveryError``) writes nothing and logs
# nothing.


def _audit(store: Store, actor: str, action: str, subject: str, payload: dict[str, Any]) -> None:
    auditlog.log(store, actor=actor, action=action, subject=subject, payload=payload)


def put_rule(store: Store, spec: Mapping[str, Any], *, actor: str) -> Rule:
    rule = ST.put_rule(store.engine, spec, by=actor)
    _audit(store, actor, "alert_rule_put", f"alert_rule:{rule.name}", {"spec": dict(spec)})
    return rule


def delete_rule(store: Store, name: str, *, actor: str) -> None:
    ST.delete_rule(store.engine, name, by=actor)
    _audit(store, actor, "alert_rule_delete", f"alert_rule:{name}", {})


def create_silence(store: Store, matchers: Sequence[str | Mapping[str, Any]], starts_at: dt.datetime | None, ends_at: dt.datetime, *,
                   created_by: str, comment: str, actor: str, now: dt.datetime | None = None) -> D.Silence:
    """A new silence kept with ``created_by`` (the API sets it to the token's name), logged as ``actor``."""
    sil = ST.create_silence(store.engine, matchers, starts_at, ends_at, created_by, comment, now=now)
    _audit(store, actor, "silence_create", f"silence:{sil.id}", {
        "matchers": [m.to_dict() for m in sil.matchers], "starts_at": sil.starts_at.isoformat(), "ends_at": sil.ends_at.isoformat(),
        "created_by": created_by, "comment": comment})
    return sil


def expire_silence(store: Store, silence_id: str, *, actor: str, now: dt.datetime | None = None) -> bool:
    """End a silence now; False (and nothing logged) when there is no active or pending one of that id."""
    if not ST.expire_silence(store.engine, silence_id, now=now):
        return False
    _audit(store, actor, "silence_expire", f"silence:{silence_id}", {})
    return True


def put_receiver(store: Store, alerting: Alerting, name: str, kind: str, url: str, *, actor: str, secrets: Sequence[str] | None = None,
                 options: Mapping[str, Any] | None = None, resolver: Any = None) -> dict[str, Any]:
    """Create or replace a receiver (``state.put_receiver``); the log holds what the receiver list shows
    (kind, scheme and host, options, whether secrets changed), never the URL's path or the secrets."""
    info = ST.put_receiver(store.engine, alerting.box, name, kind, url, secrets=secrets, options=options, policy=alerting.settings.outbound,
                           resolver=resolver)
    _audit(store, actor, "alert_receiver_put", f"alert_receiver:{name}", {
        "kind": kind, "url_display": info["url_display"], "options": info["options"], "secrets_changed": secrets is not None})
    return info


def delete_receiver(store: Store, name: str, *, actor: str) -> bool:
    """False (and nothing logged) when there is no such receiver."""
    if not ST.delete_receiver(store.engine, name):
        return False
    _audit(store, actor, "alert_receiver_delete", f"alert_receiver:{name}", {})
    return True
