"""What every verb group shares: settings, the store, time and span options, and output.

The CLI's import rule: a verb imports its service (and with it the analyzers, Celery, uvicorn, ...) when it
runs, so ``fleetscope --help`` and a verb's ``--help`` load none of them; each such import is marked
``# lazy:``. Everything else (the standard library, click, the store and settings this module loads anyway)
is imported at the top of its module.
"""

from __future__ import annotations

import datetime as dt
import getpass
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


def _when(text: str, option: str) -> dt.datetime:
    """A required RFC 3339 option as an aware time."""
    t = _utc_option(text, option)
    assert t is not None
    return t


def _period(start_text: str, end_text: str) -> tuple[dt.datetime, dt.datetime]:
    """--start and --end as aware times, the end after the start (the routes answer 400 otherwise)."""
    start, end = _when(start_text, "--start"), _when(end_text, "--end")
    if end <= start:
        raise click.BadParameter("must be after --start", param_hint="--end")
    return start, end


_SPANS = {"m": 60, "h": 3600, "d": 86400}


def _span_s(text: str, option: str) -> int:
    """``30m``, ``2h``, ``7d`` as seconds."""
    if not text or text[-1] not in _SPANS or not text[:-1].isdigit() or int(text[:-1]) == 0:
        raise click.BadParameter("use a number and m, h or d, e.g. 30m", param_hint=option)
    return int(text[:-1]) * _SPANS[text[-1]]


def _store():  # type: ignore[no-untyped-def]
    return Store(_engine(_settings()))


def _os_user() -> str:
    """Who runs the command, for the audit log of writes that take no ``--by``: the OS user, else ``cli``."""
    try:
        return getpass.getuser() or "cli"
    except (KeyError, OSError):  # no user name in the environment nor the password database
        return "cli"
