"""``fleetscope fleet``: the fleet as a whole: its state now, what it can ingest, what it analyses, what it
concluded, and the derived series in the Prometheus text format."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from fleetscope.cli.common import _emit, _span_s, _store


@click.group()
def fleet() -> None:
    """The fleet as a whole: its state now, input formats, the analyzer registry, findings, derived metrics.

    \b
    Examples:
      fleetscope fleet state --problems
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
