"""``fleetscope serving``: inference deployments as the service sees them — replicas, latency quantiles,
SLO status, DistServe goodput, energy and money per token, and the findings beside them — and what an
operator records for them: SLOs and the price book. The servers' own ``/metrics`` come in with
``fleetscope agent --serving URL`` or ``fleetscope ingest FILE``."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import click

from fleetscope.cli.common import _emit, _os_user, _store, _utc_option, _when
from fleetscope.core.errors import FleetscopeError

_WINDOW = click.option("--since", "since_s", type=click.IntRange(60, 31 * 86400), default=3600, show_default=True,
                       help="Seconds before --end.")
_END = click.option("--end", "end_text", default=None, help="RFC 3339, exclusive (default: now).")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _window(since_s: int, end_text: str | None) -> tuple[dt.datetime, dt.datetime]:
    end = _utc_option(end_text, "--end") or dt.datetime.now(dt.UTC)
    return end - dt.timedelta(seconds=since_s), end


def _num(v: Any, spec: str = ".3g") -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _call(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    try:
        return fn(*args, **kwargs)
    except (FleetscopeError, ValueError) as exc:  # an unknown deployment, a window with nothing to read
        raise click.ClickException(str(exc)) from None


@click.group()
def serving() -> None:
    """Inference deployments: latency against SLOs, goodput, cost per token.

    \b
    Examples:
      fleetscope serving deployments
      fleetscope serving quantiles chat --metric ttft_seconds --q 0.99 --since 3600
      fleetscope serving slo chat ttft-p99 --kind latency --metric ttft_seconds --threshold-s 0.5 --objective 0.99
      fleetscope serving slos chat
      fleetscope serving goodput chat --ttft-slo-s 0.5 --tpot-slo-s 0.05
      fleetscope serving price site-a --currency EUR --valid-from 2026-01-01T00:00:00Z --gpu-hour-price 2.1
      fleetscope serving cost chat --json
      fleetscope serving crossover llama-3-8b
    """


@serving.command("deployments")
@_JSON
def deployments(as_json: bool) -> None:
    """Every known replica with its deployment, server, model and where it runs.

    \b
    Examples:
      fleetscope serving deployments
      fleetscope serving deployments --json
    """
    from fleetscope.services import serving as svc  # lazy: keeps --help light

    df = svc.deployments(_store())
    rows = df.to_dicts()
    _emit(as_json, rows, "\n".join(f"{r['deployment']:<24} {r['replica']:<28} {r.get('server') or '-':<8} {r.get('model') or '-'}"
                                   for r in rows) or "no serving replicas: run fleetscope agent --serving URL on the nodes")


@serving.command("quantiles")
@click.argument("deployment")
@click.option("--metric", default="ttft_seconds", show_default=True, help="A histogram: ttft_seconds, tpot_seconds, e2e_seconds, queue_seconds.")
@click.option("--q", "q", type=click.FloatRange(0, 1), default=0.99, show_default=True)
@click.option("--step-s", type=click.FloatRange(1), default=60, show_default=True)
@click.option("--rate-window-s", type=click.FloatRange(1), default=300, show_default=True,
              help="The increase() window each point is computed over.")
@_WINDOW
@_END
@_JSON
def quantiles(deployment: str, metric: str, q: float, step_s: float, rate_window_s: float, since_s: int, end_text: str | None,
              as_json: bool) -> None:
    """histogram_quantile(Q, sum by (le) (increase(METRIC[window]))) of DEPLOYMENT over time.

    \b
    Examples:
      fleetscope serving quantiles chat --metric ttft_seconds --q 0.99 --since 3600
      fleetscope serving quantiles chat --metric tpot_seconds --q 0.5 --step-s 300 --json
    """
    from fleetscope.services import serving as svc  # lazy: keeps --help light

    start, end = _window(since_s, end_text)
    df = _call(svc.quantiles_over_time, _store(), deployment, metric, q, start=start, end=end, step_s=step_s, window_s=rate_window_s)
    rows = df.to_dicts()
    _emit(as_json, rows, "\n".join(f"{r['ts']:%Y-%m-%d %H:%M:%S}  {_num(r.get('value'))}" + ("  (capped)" if r.get("capped") else "")
                                   for r in rows) or f"no {metric} histogram of {deployment} in the window")


@serving.command("slos")
@click.argument("deployment")
@_END
@_JSON
def slos(deployment: str, end_text: str | None, as_json: bool) -> None:
    """DEPLOYMENT's recorded SLOs: SLI, error budget left, burn rates and the multiwindow alerts firing.

    \b
    Examples:
      fleetscope serving slos chat
      fleetscope serving slos chat --end 2026-12-01T00:00:00Z --json
    """
    from fleetscope.services import serving as svc  # lazy: keeps --help light

    now = _utc_option(end_text, "--end") or dt.datetime.now(dt.UTC)
    rows = _call(svc.slo_table, _store(), deployment, now=now).to_dicts()
    _emit(as_json, rows, "\n".join(
        f"{r['slo']:<32} sli {_num(r['sli'], '.4f')}  budget left {_num(r['budget_left'], '.2f')}  burn 5m/1h/6h "
        f"{_num(r['burn_5m'])}/{_num(r['burn_1h'])}/{_num(r['burn_6h'])}  {r['alerts'] or ''}" if not r.get("error") else f"{r['slo']:<32} {r['error']}"
        for r in rows) or f"no SLO recorded for {deployment}: fleetscope serving slo {deployment} NAME --kind ... --objective ...")


@serving.command("slo")
@click.argument("deployment")
@click.argument("name")
@click.option("--kind", type=click.Choice(["latency", "availability"]), required=True,
              help="latency: requests whose --metric is at most --threshold-s; availability: requests that ended well.")
@click.option("--objective", type=click.FloatRange(0, 1, min_open=True, max_open=True), required=True,
              help="Target fraction of good requests, e.g. 0.99.")
@click.option("--metric", default="", help="latency only: a histogram, e.g. ttft_seconds, tpot_seconds, e2e_seconds.")
@click.option("--threshold-s", "threshold_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="latency only: seconds, one of the histogram's bucket bounds.")
@click.option("--window-days", type=click.IntRange(1, 31), default=28, show_default=True, help="The SLO's rolling window.")
@click.option("--by", "actor", default=None, help="Who records it (default: the OS user); kept with the SLO.")
@_JSON
def slo(deployment: str, name: str, kind: str, objective: float, metric: str, threshold_s: float | None, window_days: int,
        actor: str | None, as_json: bool) -> None:
    """Record (or replace) SLO NAME of DEPLOYMENT; beat's serving window evaluates every recorded SLO each five
    minutes and writes slo_burn findings while a multiwindow burn-rate rule fires (PUT /api/v1/serving/slos).

    \b
    Examples:
      fleetscope serving slo chat ttft-p99 --kind latency --metric ttft_seconds --threshold-s 0.5 --objective 0.99
      fleetscope serving slo chat availability --kind availability --objective 0.999 --window-days 7 --by "S. Re"
    """
    from analyzers.slo import SLO  # lazy: keeps --help light
    from fleetscope.services import serving as svc  # lazy: keeps --help light

    try:  # what PUT /api/v1/serving/slos builds from its body
        s = SLO(name, deployment, kind, objective, metric if kind == "latency" else "",
                threshold_s if threshold_s is not None else math.nan, dt.timedelta(days=window_days))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    row = _call(svc.put_slo, _store(), s, actor=actor or _os_user(), now=dt.datetime.now(dt.UTC))
    target = f"{row['metric']} <= {row['threshold_s']:g} s" if kind == "latency" else "requests that ended well"
    _emit(as_json, row, f"{deployment} SLO {name}: {target} for {objective * 100:g} % of requests over {window_days} days "
                        f"(recorded by {row['updated_by']} at {row['updated_at']})")


@serving.command("goodput")
@click.argument("deployment")
@click.option("--ttft-slo-s", type=click.FloatRange(min=0, min_open=True), required=True)
@click.option("--tpot-slo-s", type=click.FloatRange(min=0, min_open=True), required=True)
@_WINDOW
@_END
@_JSON
def goodput(deployment: str, ttft_slo_s: float, tpot_slo_s: float, since_s: int, end_text: str | None, as_json: bool) -> None:
    """DistServe goodput of DEPLOYMENT: requests/s meeting both limits, exact from request logs or bounded
    from histograms (the output says which).

    \b
    Examples:
      fleetscope serving goodput chat --ttft-slo-s 0.5 --tpot-slo-s 0.05
      fleetscope serving goodput chat --ttft-slo-s 0.5 --tpot-slo-s 0.05 --since 86400 --json
    """
    from fleetscope.services import serving as svc  # lazy: keeps --help light

    start, end = _window(since_s, end_text)
    out = _call(svc.goodput, _store(), deployment, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, start=start, end=end)
    _emit(as_json, out, "  ".join(f"{k}={_num(v) if isinstance(v, float) else v}" for k, v in out.items()))


@serving.command("cost")
@click.argument("deployment")
@_WINDOW
@_END
@_JSON
def cost(deployment: str, since_s: int, end_text: str | None, as_json: bool) -> None:
    """Energy, CO2e and money per million output tokens of DEPLOYMENT, from its GPUs and the price book.

    \b
    Examples:
      fleetscope serving cost chat
      fleetscope serving cost chat --since 86400 --json
    """
    from fleetscope.services import serving as svc  # lazy: keeps --help light

    start, end = _window(since_s, end_text)
    out = _call(svc.cost_per_token, _store(), deployment, start=start, end=end)
    _emit(as_json, out, "\n".join(f"{k}: {_num(v) if isinstance(v, float) else v}" for k, v in out.items()))


@serving.command("findings")
@click.argument("deployment")
@_WINDOW
@_END
@_JSON
def findings(deployment: str, since_s: int, end_text: str | None, as_json: bool) -> None:
    """DEPLOYMENT's serving findings with those of the GPUs and hosts it ran on.

    \b
    Examples:
      fleetscope serving findings chat
      fleetscope serving findings chat --since 86400 --json
    """
    from fleetscope.services import serving as svc  # lazy: keeps --help light

    start, end = _window(since_s, end_text)
    rows = _call(svc.deployment_health, _store(), deployment, start=start, end=end).to_dicts()
    _emit(as_json, rows, "\n".join(f"{r.get('severity', ''):<8} {r.get('kind', ''):<28} {r.get('subject', ''):<40} {r.get('summary') or ''}"
                                   for r in rows) or "no findings")


@serving.command("crossover")
@click.argument("model")
@click.option("--projection-days", type=click.IntRange(1, 3650), default=28, show_default=True,
              help="Project serving at its mean daily cost of the last this many days.")
@_JSON
def crossover(model: str, projection_days: int, as_json: bool) -> None:
    """MODEL's training cost against its cumulative serving cost from the price book, and the date serving
    passed training (observed) or will (projected).

    \b
    Examples:
      fleetscope serving crossover llama-3-8b
      fleetscope serving crossover llama-3-8b --projection-days 7 --json
    """
    from fleetscope.services import serving as svc  # lazy: keeps --help light

    out = _call(svc.serving_vs_training_cost, _store(), model, projection_days=projection_days)
    cur = out.get("currency") or ""
    when = (f"serving passes training on {out['crossover_date']} ({out['crossover_basis']})" if out.get("crossover_date")
            else "serving has not passed training, nor is it projected to")
    _emit(as_json, out, f"{model}: training {_num(out.get('training_cost'), ',.2f')} {cur}, serving so far "
                        f"{_num(out.get('serving_cost'), ',.2f')} {cur} over {out.get('serving_days', 0)} days; {when}")


def _price(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A price: finite and not negative (click's FloatRange lets NaN through)."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise click.BadParameter(f"{value!r} is not a price: give a finite number, 0 or more")
    return value


@serving.command("price")
@click.argument("site_id")
@click.option("--currency", required=True, help="ISO 4217 code, e.g. EUR.")
@click.option("--valid-from", "valid_from_text", required=True, help="RFC 3339: the price holds from then until the next one.")
@click.option("--gpu-model", default="", help="The GPU model the GPU-hour price is for (default: any GPU at the site).")
@click.option("--gpu-hour-price", type=float, default=None, callback=_price, help="Price of one GPU-hour, in --currency.")
@click.option("--energy-price-per-kwh", type=float, default=None, callback=_price, help="The site's electricity tariff per kWh, in --currency.")
@click.option("--by", "actor", default=None, help="Who records it (default: the OS user); kept with the row and in the audit log.")
@_JSON
def price(site_id: str, currency: str, valid_from_text: str, gpu_model: str, gpu_hour_price: float | None, energy_price_per_kwh: float | None,
          actor: str | None, as_json: bool) -> None:
    """Record a GPU-hour price at SITE_ID (per GPU model, or any GPU there) and/or its energy tariff, valid from
    --valid-from; re-sent for the same site, model and start, it updates the row. Appended to the audit log
    (PUT /api/v1/serving/prices). Serving cost, team showback and idle-allocation cost read it.

    \b
    Examples:
      fleetscope serving price site-a --currency EUR --valid-from 2026-01-01T00:00:00Z --gpu-hour-price 2.1 --energy-price-per-kwh 0.18
      fleetscope serving price site-a --currency EUR --valid-from 2026-07-01T00:00:00Z --gpu-model H100 --gpu-hour-price 2.9 --by finance
    """
    from fleetscope.services import serving as svc  # lazy: keeps --help light

    if not (len(currency) == 3 and currency.isascii() and currency.isalpha() and currency.isupper()):
        raise click.BadParameter(f"{currency!r} is not an ISO 4217 code: three capital letters, e.g. EUR", param_hint="--currency")
    if gpu_hour_price is None and energy_price_per_kwh is None:
        raise click.UsageError("give --gpu-hour-price, --energy-price-per-kwh or both")
    record = {"site_id": site_id, "gpu_model": gpu_model, "valid_from": _when(valid_from_text, "--valid-from"), "currency": currency,
              "gpu_hour_price": gpu_hour_price, "energy_price_per_kwh": energy_price_per_kwh}
    out = _call(svc.record_price, _store(), record, recorded_by=actor or _os_user())
    what = ", ".join(x for x in (f"{gpu_hour_price:g} {currency}/GPU-h" if gpu_hour_price is not None else "",
                                 f"{energy_price_per_kwh:g} {currency}/kWh" if energy_price_per_kwh is not None else "") if x)
    _emit(as_json, out, f"{site_id} {gpu_model or 'any GPU'} from {out['valid_from']}: {what} (recorded by {out['recorded_by']})")


@serving.command("prices")
@click.option("--site", "site_id", default=None, help="Only this site's.")
@_JSON
def prices(site_id: str | None, as_json: bool) -> None:
    """The price book: GPU-hour prices and energy tariffs per site and GPU model, by start (GET /api/v1/serving/prices).

    \b
    Examples:
      fleetscope serving prices
      fleetscope serving prices --site site-a --json
    """
    from fleetscope.services import serving as svc  # lazy: keeps --help light

    rows = svc.price_book(_store(), site_id).sort("site_id", "gpu_model", "valid_from").to_dicts()
    _emit(as_json, rows, "\n".join(f"{r['site_id']:<16} {r['gpu_model'] or 'any GPU':<12} from {r['valid_from']:%Y-%m-%d %H:%M}  "
                                   f"{_num(r['gpu_hour_price'], ',.4g'):>8} {r['currency']}/GPU-h  {_num(r['energy_price_per_kwh'], ',.4g'):>8} "
                                   f"{r['currency']}/kWh  (by {r['recorded_by']})" for r in rows)
          or "no prices recorded: fleetscope serving price SITE --currency EUR --valid-from T --gpu-hour-price X")
