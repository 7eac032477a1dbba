"""What every verb group shares: settings, the store, time options and output."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click

from fleetscope import settings as settings_mod
from fleetscope.store import Store
from fleetscope.store import db


def _settings() -> settings_mod.Settings:
    try:
        return settings_mod.load()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def _engine(settings: settings_mod.Settings, *, migrate: bool = True):  # type: ignore[no-untyped-def]

    engine = db.make_engine(settings.database_url)
    if migrate:
        try:
            db.ensure_schema(settings, engine)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    return engine


def _emit(as_json: bool, data: Any, text: str) -> None:
    click.echo(json.dumps(data, default=str, indent=2) if as_json else text)


def _utc_option(value: str | None, name: str) -> dt.datetime | None:
    if value is None:
        return None
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an RFC 3339 time, e.g. 2026-03-01T12:00:00Z", param_hint=name) from None
    if t.tzinfo is None:
        raise click.BadParameter("needs a time zone, e.g. 2026-03-01T12:00:00Z", param_hint=name)
    return t


def _store():  # type: ignore[no-untyped-def]

    return Store(_engine(_settings()))


def _os_user() -> str:
    """Who runs the command, for the audit log of writes that take no ``--by``: the OS user, else ``cli``."""
    import getpass

    try:
        return getpass.getuser() or "cli"
    except (KeyError, OSError):  # no user name in the environment nor the password database
        return "cli"
