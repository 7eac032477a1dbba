"""``fleetscope energy``: energy and carbon: energy by any grouping, contractual instruments (market-based
Scope 2), a site's carbon and PUE, a job's energy, the fleet's energy productivity, a model's training
footprint and its serving against its training. Each verb reads the same service function as its
``GET /api/v1/...`` route (``fleetscope/services/energy.py``)."""

from __future__ import annotations

from typing import Any

import click

from fleetscope.cli.common import _emit, _period, _store, _when
from fleetscope.core.errors import ValidationError

_START = click.option("--start", "start_text", required=True, help="RFC 3339, e.g. 2026-11-01T00:00:00Z.")
_END = click.option("--end", "end_text", required=True, help="RFC 3339, exclusive.")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _num(v: Any, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else format(v, spec)


@click.group()
def energy() -> None:
    """Energy and carbon: energy by group, instruments for market-based Scope 2, a site's carbon and PUE, a job's
    energy, fleet FLOP/J, a model's footprint, serving vs training.

    \b
    Examples:
      fleetscope energy report --start 2026-11-01T00:00:00Z --end 2026-12-01T00:00:00Z --by site_id
      fleetscope energy job job-llm-a
      fleetscope energy carbon site-a --start 2026-11-01T00:00:00Z --end 2026-12-01T00:00:00Z
      fleetscope energy pue site-a --start 2026-11-01T00:00:00Z --end 2026-12-01T00:00:00Z
      fleetscope energy productivity --start 2026-11-01T00:00:00Z --end 2026-12-01T00:00:00Z
      fleetscope energy footprint llama-3-8b
      fleetscope energy instruments --site site-a --json
    """


@energy.command("report")
@_START
@_END
@click.option("--by", "by", multiple=True, help="Group by (repeatable): job_id, rank, gpu_uuid, host, site_id, gpu_model, model_name, "
                                                 "job_kind, minute, hour, day. Default: site_id.")
@_JSON
def energy_report(start_text: str, end_text: str, by: tuple[str, ...], as_json: bool) -> None:
    """GPU energy (J and kWh) from the per-minute roll-ups over a period, grouped; grouped by site_id, also
    location- and market-based kgCO2e with their basis (what GET /api/v1/energy serves).

    \b
    Examples:
      fleetscope energy report --start 2026-11-01T00:00:00Z --end 2026-12-01T00:00:00Z
      fleetscope energy report --start 2026-11-01T00:00:00Z --end 2026-11-02T00:00:00Z --by site_id --by hour --json
      fleetscope energy report --start 2026-11-01T00:00:00Z --end 2026-12-01T00:00:00Z --by job_id
    """
    from fleetscope.services import energy as es  # lazy: keeps --help light

    start, end = _period(start_text, end_text)
    groups = list(by) or ["site_id"]
    try:
        df = es.energy_report(_store(), start, end, groups)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    rows = df.to_dicts() if df.width else []
    carbon = "kgco2e" in df.columns
    head = " ".join(f"{g:<24}" for g in groups) + f" {'kWh':>12}" + (f" {'kgCO2e loc':>11} {'kgCO2e mkt':>11}" if carbon else "")
    lines = [head] + [" ".join(f"{str(r[g]) if r[g] is not None else '-':<24}" for g in groups) + f" {r['energy_kwh']:>12,.3f}"
                      + (f" {_num(r['kgco2e'], ',.3f'):>11} {_num(r.get('market_kgco2e'), ',.3f'):>11}" if carbon else "") for r in rows]
    _emit(as_json, rows, "\n".join(lines) if rows else f"no energy roll-ups between {start.isoformat()} and {end.isoformat()}")


@energy.command("instrument")
@click.argument("instrument_id")
@click.option("--site", "site_id", required=True, help="Site that holds it.")
@click.option("--kind", required=True, help="ppa, virtual_ppa, rec, go, i_rec, green_tariff or supplier_specific.")
@click.option("--start", "start_text", required=True, help="Start of the consumption period it applies to (RFC 3339).")
@click.option("--end", "end_text", required=True, help="End of that period, exclusive (RFC 3339).")
@click.option("--mwh", "volume_mwh", type=float, required=True, help="Electricity it conveys over the period, MWh.")
@click.option("--g-per-kwh", "g_per_kwh", type=float, required=True, help="Its emission factor, gCO2e/kWh (0 for renewables).")
@click.option("--supplier", default=None, help="Supplier, generator or issuing registry.")
@click.option("--by", "recorded_by", required=True, help="Who records it (kept with the record and in the audit log).")
def energy_instrument(instrument_id: str, site_id: str, kind: str, start_text: str, end_text: str, volume_mwh: float, g_per_kwh: float,
                      supplier: str | None, recorded_by: str) -> None:
    """Record (or update) contractual instrument INSTRUMENT_ID: a PPA, certificate or supplier rate a site holds.

    \b
    Examples:
      fleetscope energy instrument ppa-2026 --site site-a --kind ppa --start 2026-01-01T00:00:00Z --end 2027-01-01T00:00:00Z \\
          --mwh 12000 --g-per-kwh 0 --supplier "Windpark Nord" --by "E. Ops"
    """
    from fleetscope.services import energy as es  # lazy: keeps --help light

    rec = {"instrument_id": instrument_id, "site_id": site_id, "kind": kind, "start": _when(start_text, "--start"),
           "end": _when(end_text, "--end"), "volume_mwh": volume_mwh, "g_per_kwh": g_per_kwh, "supplier": supplier}
    try:
        out = es.record_instrument(_store(), rec, recorded_by=recorded_by)
    except (ValidationError, es.NotFound, es.Conflict) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{'updated' if out['updated'] else 'recorded'} {kind} {instrument_id} for {site_id}: {volume_mwh:g} MWh at {g_per_kwh:g} g/kWh")


@energy.command("instruments")
@click.option("--site", "site_id", default=None, help="Only this site's.")
@click.option("--json", "as_json", is_flag=True)
def energy_instruments(site_id: str | None, as_json: bool) -> None:
    """Contractual instruments recorded, by start of period.

    \b
    Examples:
      fleetscope energy instruments
      fleetscope energy instruments --site site-a --json
    """
    from fleetscope.services import energy as es  # lazy: keeps --help light

    rows = es.instruments(_store(), [site_id] if site_id else None).to_dicts()
    lines = [f"{r['site_id']:<12} {r['instrument_id']:<24} {r['kind']:<18} {r['start']:%Y-%m-%d} .. {r['end']:%Y-%m-%d}  "
             f"{r['volume_mwh']:g} MWh at {r['g_per_kwh']:g} g/kWh" for r in rows]
    _emit(as_json, rows, "\n".join(lines) or "no instruments recorded")


@energy.command("withdraw")
@click.argument("site_id")
@click.argument("instrument_id")
@click.option("--by", "actor", required=True, help="Who withdraws it (kept in the audit log).")
def energy_withdraw(site_id: str, instrument_id: str, actor: str) -> None:
    """Withdraw instrument INSTRUMENT_ID of SITE_ID, recorded in error.

    \b
    Example:
      fleetscope energy withdraw site-a ppa-2026 --by "E. Ops"
    """
    from fleetscope.services import energy as es  # lazy: keeps --help light

    try:
        es.withdraw_instrument(_store(), site_id, instrument_id, actor=actor)
    except es.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"withdrew {instrument_id} from {site_id}")


@energy.command("carbon")
@click.argument("site_id")
@click.option("--start", "start_text", required=True, help="RFC 3339.")
@click.option("--end", "end_text", required=True, help="RFC 3339, exclusive.")
@click.option("--json", "as_json", is_flag=True)
def energy_carbon(site_id: str, start_text: str, end_text: str, as_json: bool) -> None:
    """SITE_ID's Scope 2 over a period: location- and market-based kgCO2e side by side, with their basis.

    \b
    Examples:
      fleetscope energy carbon site-a --start 2026-11-01T00:00:00Z --end 2026-12-01T00:00:00Z
      fleetscope energy carbon site-a --start 2026-11-01T00:00:00Z --end 2026-11-02T00:00:00Z --json
    """
    from fleetscope.services import energy as es  # lazy: keeps --help light

    start, end = _when(start_text, "--start"), _when(end_text, "--end")
    if end <= start:
        raise click.BadParameter("must be after --start", param_hint="--end")
    try:
        out = es.site_carbon(_store(), site_id, start, end)
    except es.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    text = (f"{site_id} {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC: {out['energy_kwh']:.3f} kWh ({out['energy_basis']})\n"
            f"  location-based {out['location_based_kgco2e']:.3f} kgCO2e\n  market-based   {out['market_based_kgco2e']:.3f} kgCO2e "
            f"({out['covered_energy_j'] / 3.6e6:.3f} kWh covered by {len(out['instruments'])} instrument(s); rest at {out['uncovered_basis']})")
    _emit(as_json, out, text)


@energy.command("job")
@click.argument("job_id")
@click.option("--start", "start_text", help="RFC 3339: keep the part of the run from here.")
@click.option("--end", "end_text", help="RFC 3339, exclusive.")
@click.option("--json", "as_json", is_flag=True)
def energy_job(job_id: str, start_text: str | None, end_text: str | None, as_json: bool) -> None:
    """JOB_ID's energy and emissions (location- and market-based), per step and per million tokens.

    \b
    Examples:
      fleetscope energy job job-llm-a
      fleetscope energy job job-llm-a --start 2026-12-01T00:00:00Z --json
    """
    from fleetscope.services import energy as es  # lazy: keeps --help light

    start = _when(start_text, "--start") if start_text else None
    end = _when(end_text, "--end") if end_text else None
    if start and end and end <= start:
        raise click.BadParameter("must be after --start", param_hint="--end")
    try:
        out = es.job_report(_store(), job_id, start, end)
    except es.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    text = (f"{job_id} {out['start']} .. {out['end']}: GPU {out['gpu_energy_kwh']:.3f} kWh, facility "
            f"{num(out['facility_energy_j'] and out['facility_energy_j'] / 3.6e6, '.3f')} kWh{' (estimate)' if out['estimate'] else ''}\n"
            f"  location-based {num(out['location_based_kgco2e'], '.3f')} kgCO2e, market-based {num(out['market_based_kgco2e'], '.3f')} kgCO2e\n"
            f"  {num(out['energy_per_step_j'], '.1f')} J/step, {num(out['energy_per_mtok_j'], '.1f')} J per million tokens, "
            f"{num(out['flops_per_j'], '.3g')} useful FLOP/J")
    hint = out["carbon_shift_hint"]
    text += (f"\n  shifted to {hint['site_id']}'s cleanest hours within a day: {hint['saving_kgco2e']:.3f} kgCO2e less ({hint['saving_ratio']:.0%})"
             if hint.get("feasible") else f"\n  no carbon-shift hint: {hint['basis']}")
    _emit(as_json, out, text)


@energy.command("serving")
@click.argument("model")
@click.option("--projection-days", type=click.IntRange(1, 3650), default=28, show_default=True, help="Serving days the projection averages.")
@click.option("--json", "as_json", is_flag=True)
def energy_serving(model: str, projection_days: int, as_json: bool) -> None:
    """MODEL's training energy against its cumulative serving energy, and when serving passes training.

    \b
    Examples:
      fleetscope energy serving llama
      fleetscope energy serving llama --projection-days 7 --json
    """
    from fleetscope.services import energy as es  # lazy: keeps --help light

    try:
        out = es.serving_vs_training(_store(), model, projection_days=projection_days)
    except es.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    kwh = lambda j: "unknown" if j is None else f"{j / 3.6e6:.3f} kWh"  # noqa: E731
    text = (f"{model}: training {kwh(out['training_energy_j'])}, serving {kwh(out['serving_energy_j'])} over {out['serving_days']} day(s)\n"
            f"  crossover {out['crossover_date'] or '-'} ({out['crossover_basis']}: {out['crossover_explanation']})")
    _emit(as_json, out, text)


@energy.command("pue")
@click.argument("site_id")
@_START
@_END
@_JSON
def energy_pue(site_id: str, start_text: str, end_text: str, as_json: bool) -> None:
    """SITE_ID's PUE over a period with its ISO/IEC 30134-2 category (or its declared PUE, marked as an
    estimate, where it has no meters), and WUE in L/kWh where it has a water meter (GET /api/v1/sites/SITE/pue).

    \b
    Examples:
      fleetscope energy pue site-a --start 2026-11-01T00:00:00Z --end 2026-12-01T00:00:00Z
      fleetscope energy pue site-a --start 2026-11-01T00:00:00Z --end 2026-11-02T00:00:00Z --json
    """
    from fleetscope.services import energy as es  # lazy: keeps --help light

    start, end = _period(start_text, end_text)
    try:
        out = es.site_pue(_store(), site_id, start, end)
    except ValueError as exc:  # a site not in the inventory
        raise click.ClickException(str(exc)) from None
    kwh = lambda j: "-" if j is None else f"{j / 3.6e6:,.3f} kWh"  # noqa: E731
    cat = f", category {out['category']}" if out["category"] is not None else ""
    text = (f"{site_id} {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC: PUE {_num(out['pue'], '.3f')} ({out['basis']}{cat}"
            f"{', estimate' if out['estimate'] else ''}{', interim' if out['interim'] else ''}) {out['label']}\n"
            f"  facility {kwh(out['facility_energy_j'])}, IT {kwh(out['it_energy_j'])}, meter coverage {_num(out['coverage_ratio'], '.1%')}\n"
            f"  WUE {_num(out['wue_l_per_kwh'], '.3f')} L/kWh ({out['wue_basis']})")
    _emit(as_json, out, text)


@energy.command("productivity")
@_START
@_END
@_JSON
def energy_productivity(start_text: str, end_text: str, as_json: bool) -> None:
    """The fleet's energy productivity over a period: useful FLOPs (the model FLOPs of the steps recorded) per
    joule of all GPU energy at the fleet's sites, idle GPUs included (GET /api/v1/energy/productivity).

    \b
    Examples:
      fleetscope energy productivity --start 2026-11-01T00:00:00Z --end 2026-12-01T00:00:00Z
      fleetscope energy productivity --start 2026-11-01T00:00:00Z --end 2026-11-02T00:00:00Z --json
    """
    from fleetscope.services import energy as es  # lazy: keeps --help light

    start, end = _period(start_text, end_text)
    out = es.fleet_productivity(_store(), start, end)
    text = (f"{start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC: {_num(out['flops_per_j'], '.4g')} useful FLOP/J "
            f"({_num(out['useful_flops'], '.4g')} FLOPs over {out['gpu_energy_j'] / 3.6e6:,.3f} kWh of GPU energy)\n  {out['basis']}")
    _emit(as_json, out, text)


@energy.command("footprint")
@click.argument("model")
@_JSON
def energy_footprint(model: str, as_json: bool) -> None:
    """MODEL's training compute (FLOPs), time, energy and CO2e (location- and market-based), each with its
    basis: the EU AI Act Annex XI 1.2(d)-(e) figures (GET /api/v1/models/MODEL/footprint).

    \b
    Examples:
      fleetscope energy footprint llama-3-8b
      fleetscope energy footprint llama-3-8b --json
    """
    from fleetscope.services import energy as es  # lazy: keeps --help light

    try:
        out = es.model_footprint(_store(), model)
    except ValueError as exc:  # no training job of the model (NotFound)
        raise click.ClickException(str(exc)) from None
    hours = None if out["training_time_s"] is None else out["training_time_s"] / 3600
    text = (f"{model}: training jobs {', '.join(out['jobs'])}{' (estimate)' if out['estimate'] else ''}\n"
            f"  compute  {_num(out['training_flops'], '.4g')} FLOPs ({out['flops_basis']})\n"
            f"  time     {_num(hours, ',.3f')} h ({out['time_basis']})\n"
            f"  energy   {_num(out['energy_kwh'], ',.3f')} kWh ({out['energy_basis']})\n"
            f"  CO2e     {_num(out['kgco2e'], ',.3f')} kgCO2e location-based ({out['emissions_basis']}), "
            f"{_num(out['market_kgco2e'], ',.3f')} kgCO2e market-based")
    _emit(as_json, out, text)
