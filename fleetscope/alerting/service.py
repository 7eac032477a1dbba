"""What the API, the worker and the CLI share to run alerting: settings, the rules file and the secret box.

The CLI's alerting verbs are thin over ``fleetscope.alerting.state``; ``open_alerting`` gives them what
those functions take (``store.engine``, ``box``, ``settings.outbound``, ``effective_config()``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from fleetscope import settings as settings_mod
from fleetscope.alerting import config as C
from fleetscope.alerting import state as ST
from fleetscope.alerting.rules import AlertingConfig, load_config


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
