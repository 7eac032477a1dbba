"""``fleetscope token``: the API's bearer tokens."""

from __future__ import annotations

import datetime as dt

import click

from fleetscope.cli.common import _emit, _engine, _settings


@click.group("token")
def token_group() -> None:
    """API tokens (bearer secrets with scopes ingest, read, governance, admin).

    \b
    Examples:
      fleetscope token create --scope ingest --name node-agents
      fleetscope token list
      fleetscope token revoke 3
    """


@token_group.command("create")
@click.option("--scope", "scopes", multiple=True, required=True, type=click.Choice(["ingest", "read", "governance", "admin"]), help="Repeat for several.")
@click.option("--name", default="cli", show_default=True, help="What the token is for.")
@click.option("--expires-days", type=int, default=None, help="Expire after this many days.")
@click.option("--site", default=None, help="Bind: rows the token pushes that name a site must name this one.")
@click.option("--host", default=None, help="Bind: rows the token pushes that name a host must name this one (a node agent's token).")
@click.option("--source", default=None, help="Bind: pushes must claim this source (the default source of its pushes).")
@click.option("--json", "as_json", is_flag=True)
def token_create(scopes: tuple[str, ...], name: str, expires_days: int | None, site: str | None, host: str | None, source: str | None,
                 as_json: bool) -> None:
    """Create a token and print its secret. It is shown only this once.

    \b
    Examples:
      fleetscope token create --scope read --scope governance --name auditor --expires-days 30
      fleetscope token create --scope ingest --name n7 --host n7 --site dc1 --json
    """
    from fleetscope.services import auth  # lazy: keeps --help light

    s = _settings()
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(days=expires_days) if expires_days else None
    try:
        binding = auth.check_binding(auth.Binding(site, host, source))
        secret = auth.create_token(_engine(s), name, list(scopes), expires_at=expires, binding=binding)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    bound = {"site": binding.site, "host": binding.host, "source": binding.source} if binding else None
    _emit(as_json, {"token": secret, "name": name, "scopes": sorted(scopes), "expires_at": expires, "binding": bound}, secret)


@token_group.command("list")
@click.option("--json", "as_json", is_flag=True)
def token_list(as_json: bool) -> None:
    """List tokens (never their secrets).

    \b
    Examples:
      fleetscope token list
      fleetscope token list --json | jq '.[] | select(.revoked_at == null) | .name'
    """
    from fleetscope.services import auth  # lazy: keeps --help light

    rows = auth.list_tokens(_engine(_settings()))
    def bound(r: dict) -> str:
        return " ".join(f"{k}={r['bound_' + k]}" for k in ("site", "host", "source") if r["bound_" + k] is not None)

    lines = [f"{r['token_id']:>4}  {r['name']:<20} {r['scopes']:<30} {'revoked' if r['revoked_at'] else 'active':<8} {bound(r)}".rstrip() for r in rows]
    _emit(as_json, rows, "\n".join(lines) or "no tokens")


@token_group.command("revoke")
@click.argument("token_id", type=int)
def token_revoke(token_id: int) -> None:
    """Revoke the token with TOKEN_ID (see `token list`).

    \b
    Example:
      fleetscope token revoke 3
    """
    from fleetscope.services import auth  # lazy: keeps --help light

    if not auth.revoke_token(_engine(_settings()), token_id):
        raise click.ClickException(f"no active token with id {token_id}")
    click.echo(f"revoked token {token_id}")
