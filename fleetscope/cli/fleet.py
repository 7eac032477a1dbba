"""``fleetscope fleet``: the fleet as a whole: its state now, one GPU's history, what it can ingest, what it
analyses, what it concluded, and the derived series in the Prometheus text format."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from fleetscope.cli.common import _emit, _settings, _span_s, _store, _utc_option


@click.group()
def fleet() -> None:
    """The fleet as a whole: its state now, one GPU's history, input formats, the analyzer registry, findings, derived metrics.

    \b
    Examples:
      fleetscope fleet state --problems
      fleetscope fleet gpu GPU-5fb4c1f2-1c5e-4c5e-9d5e-0123456789ab --field temp_c --since 6h
      fleetscope fleet formats
      fleetscope fleet analyzers --json
      fleetscope fleet findings --since 6h
      fleetscope fleet metrics --out /var/lib/node_exporter/textfile/fleetscope.prom
    """


@fleet.command("state")
@click.option("--site", default=None, help="Only this site's hosts and GPUs.")
@click.option("--problems", is_flag=True, help="List only the GPUs whose status is not ok.")
@click.option("--json", "as_json", is_flag=True)
def state_cmd(site: str | None, problems: bool, as_json: bool) -> None:
    """The fleet right now, as the dashboard's Overview shows it: GPUs busy, idle, unhealthy (a serious health
    event in the last hour) and silent (no sample in the last 5 minutes), the power they draw, and the worst
    hosts' GPUs with their latest temperature, power and XID.

    \b
    Examples:
      fleetscope fleet state
      fleetscope fleet state --site site-a --problems
      fleetscope fleet state --json | jq '.grid[] | select(.status == "unhealthy") | .gpu_uuid'
    """
    from fleetscope.services import health_reads  # lazy: keeps --help light

    try:
        state = health_reads.fleet_state(_store(), dt.datetime.now(dt.UTC), site, problems_only=problems)
    except health_reads.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    _emit(as_json, state, describe_state(state))


def describe_state(state: dict) -> str:
    """``fleet_state`` as the terminal shows it: a summary line, then one line per GPU of the grid."""
    inv, c, power = state["inventory"], state["counts"], state["power"]
    watts = f"{power['power_w'] / 1e3:,.1f} kW from {power['gpus_reporting']:,} GPUs" if power["power_w"] is not None else "no power reading"
    lines = [
        f"{c['gpus']:,} GPUs on {inv['hosts']:,} hosts at {inv['sites']:,} site(s): {c['busy']:,} busy, {c['idle']:,} idle, "
        f"{c['unhealthy']:,} unhealthy, {c['silent']:,} silent; {watts}",
    ]
    for g in state["grid"]:
        temp = f"{g['temp_c']:.0f} C" if g["temp_c"] is not None else "-"
        watt = f"{g['power_w']:.0f} W" if g["power_w"] is not None else "-"
        lines.append(f"  {g['status']:<9} {g['host']:<24} {g['gpu_index']:>2} {g['gpu_uuid'] or '-':<42} {temp:>6} {watt:>7}"
                     f"  xid {g['xid_last'] or 0:<3} events {g['events']}")
    return "\n".join(lines)


@fleet.command("gpu")
@click.argument("gpu_uuid")
@click.option("--field", "fields", multiple=True, metavar="FIELD",
              help="A gpu_sample field, repeatable (default util_ratio, power_w and temp_c; at most 8).")
@click.option("--since", default="6h", show_default=True, help="How far back from --end (or now): 30m, 6h, 7d.")
@click.option("--start", default=None, help="Start instead of --since (RFC 3339, with a zone).")
@click.option("--end", default=None, help="End (RFC 3339, with a zone; default now).")
@click.option("--json", "as_json", is_flag=True, help="Print what GET /api/v1/gpus/{uuid}/series answers.")
def gpu_cmd(gpu_uuid: str, fields: tuple[str, ...], since: str, start: str | None, end: str | None, as_json: bool) -> None:
    """One GPU's history: each field's min, max, mean and last per raw sample (a window up to 6 h), per minute (up
    to 7 days) or per hour (beyond), from the roll-up tiers; the buckets a tier has not rolled yet are made from
    raw samples and marked `raw`. Exits 1 naming an unknown field, a bad window or a GPU neither in the
    inventory nor sampled.

    \b
    Examples:
      fleetscope fleet gpu GPU-5fb4c1f2-1c5e-4c5e-9d5e-0123456789ab --field temp_c --field power_w --since 6h
      fleetscope fleet gpu GPU-5fb4c1f2-1c5e-4c5e-9d5e-0123456789ab --since 30d --json | jq '.series[] | select(.field == "temp_c") | .max'
    """
    from fleetscope.services import telemetry  # lazy: keeps --help light

    t_end = _utc_option(end, "--end") or dt.datetime.now(dt.UTC)
    t_start = _utc_option(start, "--start") or t_end - dt.timedelta(seconds=_span_s(since, "--since"))
    try:
        out = telemetry.gpu_series(_store(), gpu_uuid, fields or telemetry.DEFAULT_SERIES_FIELDS, t_start, t_end,
                                   max_days=_settings().hour_tier_retention_days)
    except ValueError as exc:  # an unknown field, a bad window, too many points, an unknown GPU
        raise click.ClickException(str(exc)) from None
    _emit(as_json, out, describe_gpu_series(out))


def describe_gpu_series(out: dict) -> str:
    """``gpu_series`` as the terminal shows it: a line saying what was read, then a table a field at a time."""
    what = {"raw": "one row a sample", "minute": "one row a minute", "hour": "one row an hour"}[out["tier"]]
    known = "" if out["in_inventory"] else " (not in the inventory)"
    lines = [f"{out['gpu_uuid']}{known}: {out['start']} to {out['end']}, {what}, {out['points']:,} points"]
    if not out["series"]:
        return lines[0] + "\nno samples in this window"

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:,.6g}"

    lines.append(f"{'field':<24} {'time (UTC)':<19} {'samples':>7} {'min':>12} {'max':>12} {'mean':>12} {'last':>12}  from")
    for r in out["series"]:
        ts = r["ts"][:19].replace("T", " ")
        lines.append(f"{r['field']:<24} {ts:<19} {r['samples']:>7} {num(r['min']):>12} {num(r['max']):>12} {num(r['mean']):>12} {num(r['last']):>12}"
                     f"  {'raw' if r['from_raw'] else r['tier']}")
    return "\n".join(lines)


@fleet.command("formats")
@click.option("--json", "as_json", is_flag=True)
def formats_cmd(as_json: bool) -> None:
    """List the input formats `fleetscope ingest` understands.

    \b
    Examples:
      fleetscope fleet formats
      fleetscope fleet formats --json | jq -r '.[].name'
    """
    from fleetscope.door.ingestion import FORMATS  # lazy: the format registry imports every parser

    rows = [{"name": f.name, "description": f.description} for f in FORMATS.values()]
    _emit(as_json, rows, "\n".join(f"{r['name']:<22} {r['description']}" for r in rows))


@fleet.command("findings")
@click.option("--since", default="1h", show_default=True, help="How far back: 30m, 6h, 7d (findings whose window reaches into it).")
@click.option("--analyzer", default=None, help="Only this analyzer's (health, absence, hangs, fabric, stragglers, sdc, aiact, ...).")
@click.option("--kind", default=None, help="Only this kind; % matches any run of characters (e.g. 'straggler_%').")
@click.option("--limit", type=click.IntRange(1, 100_000), default=200, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def findings_cmd(since: str, analyzer: str | None, kind: str | None, limit: int, as_json: bool) -> None:
    """What the analyzers concluded, newest first, most severe first within a window.

    \b
    Examples:
      fleetscope fleet findings --analyzer absence          # GPUs, hosts and sites that went quiet
      fleetscope fleet findings --kind job_hang --since 1d
      fleetscope fleet findings --kind 'ib_%' --json
    """
    from fleetscope.services import health_reads  # lazy: keeps --help light

    end = dt.datetime.now(dt.UTC)
    rows = health_reads.findings(_store(), end - dt.timedelta(seconds=_span_s(since, "--since")), end, kind_like=kind, analyzer=analyzer, limit=limit)
    data = [{**r, "window_start": r["window_start"].isoformat(), "window_end": r["window_end"].isoformat() if r["window_end"] else None}
            for r in rows.drop("evidence").to_dicts()]
    _emit(as_json, data, "\n".join(f"{r['severity']:<8} {r['kind']:<24} {r['subject']:<40} {r['summary'] or ''}" for r in data) or "no findings")


@fleet.command("analyzers")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def analyzers_cmd(as_json: bool) -> None:
    """The analyses the service runs, per job, per fleet window and on a schedule of their own, in the order they
    run: the pure modules each calls, the frames it reads and writes, and the beat entry that runs it and when.

    \b
    Examples:
      fleetscope fleet analyzers
      fleetscope fleet analyzers --json | jq '.[] | select(.writes | index("finding")) | .name'
      fleetscope fleet analyzers --json | jq '.[] | select(.cadence == "scheduled") | {name, beat, when}'
    """
    from fleetscope.services import catalog  # lazy: imports every analyzer, only for this verb

    rows = catalog.analyses()
    _emit(as_json, rows, "\n".join(
        f"{r['cadence']:<9} {r['name']:<19} {' '.join(r['modules']):<58} {r['summary']}\n"
        f"{'':<9} reads {', '.join(r['reads']) or '-'}; writes {', '.join(r['writes'] + r['files']) or '-'}; beat's {r['beat']} {r['when']}"
        for r in rows))


@fleet.command("metrics")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write to this file (atomically, for node_exporter's textfile collector) instead of stdout.")
def metrics_cmd(out_path: str | None) -> None:
    """Print the derived fleet series (goodput, C3 shares, stragglers, hangs, GPU health and absence, site PUE
    and power) in the Prometheus text format: what GET /api/v1/fleet/metrics serves.

    \b
    Examples:
      fleetscope fleet metrics | grep fleetscope_job_goodput_ratio
      fleetscope fleet metrics --out /var/lib/node_exporter/textfile/fleetscope.prom
    """
    from fleetscope.services.fleet_metrics import exposition  # lazy: imports the analyzers its series come from

    text = exposition(_store())
    if out_path is None:
        click.echo(text.decode(), nl=False)
        return
    tmp = Path(out_path).with_name(Path(out_path).name + ".tmp")
    tmp.write_bytes(text)
    tmp.replace(out_path)  # a scrape never reads half a file
