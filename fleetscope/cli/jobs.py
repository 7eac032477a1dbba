"""``fleetscope jobs``: one training job's analyses: C3, HTA's temporal breakdown, goodput and MFU, stragglers, the
what-if, SDC; and scaling across the runs of one model with the Fleet Law fit."""

from __future__ import annotations

import datetime as dt
import json

import click

from fleetscope.cli.common import _period, _store
from fleetscope.core.errors import NotFound
from fleetscope.core.textinput import has_control


@click.group()
def jobs() -> None:
    """One job's analyses: run them now (analyze), or read what was last stored (goodput, temporal, whatif, sdc); scaling
    across the runs of one model (scaling).

    \b
    Examples:
      fleetscope jobs analyze job-llm-a
      fleetscope jobs goodput job-llm-a
      fleetscope jobs temporal job-llm-a
      fleetscope jobs whatif job-llm-a
      fleetscope jobs sdc job-llm-a --json
      fleetscope jobs scaling llama-7b
    """


@jobs.command("analyze")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.option("--incremental", is_flag=True, help="read only the steps since the job's watermark, as beat does each minute (same results)")
def analyze(job_id: str, as_json: bool, incremental: bool) -> None:
    """Analyse JOB_ID now: C3 breakdown, goodput (with MFU and the goodput product), stragglers and the
    what-if, stored and printed.

    \b
    Examples:
      fleetscope jobs analyze job-llm-a
      fleetscope jobs analyze job-llm-a --incremental
      fleetscope jobs analyze job-llm-a --json | jq .goodput.goodput_ratio
    """
    from fleetscope.services.jobs import analyze_job  # lazy: imports every job analyzer

    result = analyze_job(_store(), job_id, incremental=incremental)
    if as_json:
        click.echo(json.dumps(result.to_dict(), default=str))
        return
    click.echo(f"job {job_id}")
    if result.c3:
        c = result.c3
        click.echo(f"  C3      step {c['step_s_mean']:.4g} s mean (p99 {c['step_s_p99']:.4g} s) over {c['ranks']} ranks x {c['steps']} steps")
        click.echo(f"          C1 compute {c['c1_ratio']:.1%}  C2 communication {c['c2_ratio']:.1%}  C3 coordination {c['c3_ratio']:.1%}  -> {c['dominant']} dominates")
        click.echo(f"          {c['advice']}")
    if result.goodput:
        g = result.goodput
        _echo_goodput(g)
        if g.get("mfu_ratio") is not None:
            product = g.get("goodput_product_ratio")
            click.echo(f"          MFU {g['mfu_ratio']:.1%} ({g['mfu_dtype']} peak of {g['gpu_model']})"
                       + (f"; ML Productivity Goodput {product:.1%} (scheduling x runtime x program)" if product is not None else ""))
        if result.goodput_trend:
            trend = result.to_dict()["goodput_trend"]
            _echo_trend(trend["rolling"], trend["step_time_deviation"], tables=False)
    if result.whatif:
        _echo_whatif(result.whatif)
    for f in result.stragglers:
        click.echo(f"  straggler [{f['severity']}] {f['summary']}")
    for f in result.sdc:
        if f["kind"] != "sdc_rerun":
            click.echo(f"  sdc [{f['severity']}] {f['summary']}")
    for v in result.sdc_reruns:
        click.echo(f"  sdc rerun {v['case_id']} on {v['suspect_gpu']}: {v['verdict']} ({v['reason']})")
    for note in result.notes:
        click.echo(f"  note: {note}")


def _echo_whatif(w: dict) -> None:
    click.echo(f"  what-if slowdown S {w['slowdown']:.3f} (ideal step {w['ideal_step_s']:.4g} s, replayed {w['simulated_step_s']:.4g} s); "
               f"M_W {w['m_w']:.2f}, M_S {w['m_s']:.2f}: {w['verdict']}" + (f" ({', '.join(w['culprits'])})" if w["culprits"] else ""))
    stages = ", ".join(f"stage {r['stage']} {r['slowdown_only']:.3f}" for r in sorted(w["by_stage"], key=lambda r: r["stage"]))
    click.echo(f"          per stage: {stages}")
    worst = ", ".join(f"rank {r['rank']} {r['slowdown']:.3f}" for r in w["by_worker"][:5])
    click.echo(f"          slowest ranks: {worst}")


# The bounds of GET /api/v1/jobs/{id}/goodput's windows and steps (services.job_reads.GOODPUT_WINDOWS_MAX and
# GOODPUT_STEPS_MAX, which --help must not import; a test holds them equal).
_GOODPUT_WINDOWS_MAX, _GOODPUT_STEPS_MAX = 48, 100


def _echo_goodput(g: dict) -> None:
    top = sorted(((k, v) for k, v in g["badput_s"].items() if v), key=lambda kv: -kv[1])[:3]
    click.echo(f"  goodput {g['goodput_ratio']:.1%} of {g['total_s']:.0f} s; badput: " + (", ".join(f"{k} {v:.0f} s" for k, v in top) or "none"))


def _echo_trend(roll: dict, dev: dict, *, tables: bool) -> None:
    if roll["why"]:
        click.echo(f"  rolling goodput: none ({roll['why']})")
    else:
        ws = roll["windows"]
        click.echo(f"  rolling goodput over windows of {roll['window_s']:g} s ({roll['windows_total']} in all, "
                   f"the newest {len(ws)} shown): " + (f"newest {ws[-1]['goodput_ratio']:.1%}, lowest {min(w['goodput_ratio'] for w in ws):.1%}" if ws else "none asked for"))
        if tables and ws:
            click.echo(f"    {'window start (UTC)':<25}  {'length':>8}  {'goodput':>8}  top badput")
            for w in ws:
                worst = min(w["badput_s"].items(), key=lambda kv: (-kv[1], kv[0]))  # the largest; by name on a tie
                click.echo(f"    {w['window_start'][:25]:<25}  {w['total_s']:>6g} s  {w['goodput_ratio']:>8.1%}  "
                           + (f"{worst[0]} {worst[1]:g} s" if worst[1] else "none"))
    if dev["why"]:
        click.echo(f"  step time: no deviation ({dev['why']})")
        return
    click.echo(f"  step time: ideal {dev['ideal_step_time_s']:.4g} s over {dev['steps']} steps; {dev['anomalous_steps']} above "
               f"{dev['anomaly_threshold_s']:.4g} s (median + 3 MAD); largest deviation {dev['max_deviation_s']:+.4g} s at step {dev['max_deviation_step']}")
    if tables and dev["last"]:
        click.echo(f"    {'step':>8}  {'step time':>10}  {'deviation':>10}")
        for r in dev["last"]:
            click.echo(f"    {r['step']:>8}  {r['step_time_s']:>8.4g} s  {r['deviation_s']:>+8.4g} s")


@jobs.command("goodput")
@click.argument("job_id")
@click.option("--windows", type=click.IntRange(0, _GOODPUT_WINDOWS_MAX), default=_GOODPUT_WINDOWS_MAX, show_default=True,
              help="the newest rolling-goodput windows to show")
@click.option("--steps", type=click.IntRange(0, _GOODPUT_STEPS_MAX), default=_GOODPUT_STEPS_MAX, show_default=True,
              help="the newest steps' step-time deviation to show")
@click.option("--start", "start_text", default=None, help="with --end: goodput within this interval only, computed now (RFC 3339)")
@click.option("--end", "end_text", default=None, help="exclusive end of the interval (RFC 3339)")
@click.option("--json", "as_json", is_flag=True, help="what GET /api/v1/jobs/{id}/goodput (or .../goodput/interval) answers")
def goodput(job_id: str, windows: int, steps: int, start_text: str | None, end_text: str | None, as_json: bool) -> None:
    """Goodput of JOB_ID as last analysed: runtime goodput with its badput, then over time: rolling goodput
    (consecutive windows of the run, each at least 10 ideal steps long) and step-time deviation (each step
    against the ideal step time, the mean of the steps not above median + 3 MAD). What the Jobs page shows.
    With --start and --end: goodput and badput within that interval, computed now from the job's events
    (ml-goodput-measurement's interval goodput; the denominator is the interval's overlap with the run).

    \b
    Examples:
      fleetscope jobs goodput job-llm-a
      fleetscope jobs goodput job-llm-a --windows 6 --steps 10
      fleetscope jobs goodput job-llm-a --json | jq '.rolling.windows[-1].goodput_ratio'
      fleetscope jobs goodput job-llm-a --start 2026-11-30T00:00:00Z --end 2026-12-01T00:00:00Z
    """
    from fleetscope.services import job_reads  # lazy: imports the C3 analyzer
    from fleetscope.services.jobs import job_exists  # lazy: imports every job analyzer

    if (start_text is None) != (end_text is None):
        raise click.BadParameter("give --start and --end together", param_hint="--start" if start_text is None else "--end")
    st = _store()
    if not job_exists(st, job_id):
        raise click.ClickException(f"no job {job_id!r}: nothing ingested under that id")
    if start_text is not None and end_text is not None:
        start, end = _period(start_text, end_text)
        try:
            got = job_reads.interval_goodput(st, job_id, start, end, now=dt.datetime.now(dt.UTC))
        except (NotFound, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
        if as_json:
            click.echo(json.dumps(got, default=str))
            return
        click.echo(f"job {job_id} from {got['window_start']} to {got['window_end']}"
                   + ("" if got["finished"] else " (running: up to now)"))
        _echo_goodput(got)
        return
    found = job_reads.job_goodput(st, job_id, windows=windows, steps=steps)
    if found is None:
        raise click.ClickException(f"job {job_id!r} has no goodput analysis yet: `fleetscope jobs analyze {job_id}` or wait for beat")
    if as_json:
        click.echo(json.dumps(found, default=str))
        return
    click.echo(f"job {job_id} (analysed {found['computed_at']})")
    _echo_goodput(found["result"])
    _echo_trend(found["rolling"], found["step_time_deviation"], tables=True)


@jobs.command("whatif")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
def whatif(job_id: str, as_json: bool) -> None:
    """Straggler what-if of JOB_ID as last analysed: slowdown against the ideal timeline, M_W, M_S, and the
    slowdown of each rank and pipeline stage (ingest the trace with --format bytedance_whatif --job-id).

    \b
    Examples:
      fleetscope ingest ops.json --format bytedance_whatif --job-id job-llm-a && fleetscope jobs analyze job-llm-a
      fleetscope jobs whatif job-llm-a --json
    """
    from fleetscope.services.jobs import job_exists, stored_analysis  # lazy: imports every job analyzer

    st = _store()
    if not job_exists(st, job_id):
        raise click.ClickException(f"no job {job_id!r}: nothing ingested under that id")
    found = stored_analysis(st, job_id, "whatif")
    if found is None:
        raise click.ClickException(f"job {job_id!r} has no what-if analysis: ingest its operations (format bytedance_whatif), "
                                   f"then `fleetscope jobs analyze {job_id}`")
    if as_json:
        click.echo(json.dumps(found, default=str))
        return
    click.echo(f"job {job_id} (analysed {found['computed_at']})")
    _echo_whatif(found["result"])


_WINDOW_WORDS = {"before_last_step": "last profiler step left out", "through_last_step": "through the last profiler step",
                 "all": "every device event (the traces name fewer than two profiler steps)"}


@jobs.command("temporal")
@click.argument("job_id")
@click.option("--include-last-step", is_flag=True, help="count the last profiler step too (HTA's include_last_profiler_step); computed now, not stored")
@click.option("--rank", type=click.IntRange(min=0), default=None, help="that rank only")
@click.option("--json", "as_json", is_flag=True, help="as GET /api/v1/jobs/{id}/temporal answers")
def temporal(job_id: str, include_last_step: bool, rank: int | None, as_json: bool) -> None:
    """HTA's temporal breakdown of JOB_ID's Kineto traces per rank: kernel time, and the shares of it the GPU was
    idle, computing and doing anything else (communication, memory copies), with the share of communication time
    that ran under computation (Meta's Holistic Trace Analysis' get_temporal_breakdown and get_comm_comp_overlap).
    The stored analysis where it has run (`fleetscope jobs analyze`, or beat each minute), else computed now.

    \b
    Examples:
      fleetscope ingest rank-0.json.gz rank-1.json.gz --job-id job-llm-a && fleetscope jobs analyze job-llm-a
      fleetscope jobs temporal job-llm-a
      fleetscope jobs temporal job-llm-a --rank 3 --json | jq '.ranks[0].idle_time_pctg'
    """
    from fleetscope.services import job_reads  # lazy: imports the C3 analyzer
    from fleetscope.services.jobs import job_exists  # lazy: imports every job analyzer

    st = _store()
    if not job_exists(st, job_id):
        raise click.ClickException(f"no job {job_id!r}: nothing ingested under that id")
    out = job_reads.temporal(st, job_id, include_last_step=include_last_step, rank=rank)
    if as_json:
        click.echo(json.dumps(out, default=str))
        return
    if not out["ranks"]:
        click.echo(f"job {job_id}: {out['reason']}")
        return
    when = f"analysed {out['computed_at']}" if out["stored"] else "computed now from the stored traces"
    n = out["job"]["ranks"]
    click.echo(f"job {job_id}: HTA temporal breakdown of {n} rank{'s' if n != 1 else ''}, {_WINDOW_WORDS[out['window']]} ({when})")
    click.echo(f"  {'rank':>6}  {'kernel (µs)':>14}  {'idle %':>7}  {'compute %':>9}  {'non-compute %':>13}  {'overlap %':>9}")
    pct = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    for r in [*out["ranks"], {**out["job"], "rank": "all"}]:
        click.echo(f"  {r['rank']:>6}  {r['kernel_time_us']:>14,.0f}  {pct(r['idle_time_pctg']):>7}  {pct(r['compute_time_pctg']):>9}"
                   f"  {pct(r['non_compute_time_pctg']):>13}  {pct(r['comp_comm_overlap_pctg']):>9}")


@jobs.command("sdc")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
def sdc(job_id: str, as_json: bool) -> None:
    """Silent-data-corruption screen of JOB_ID: suspects with their evidence, and the rerun protocol's
    records and verdicts (record replays as `sdc_rerun` job events, docs/job_events.md).

    \b
    Examples:
      fleetscope jobs sdc job-llm-a
      fleetscope jobs sdc job-llm-a --json | jq '.reruns.verdicts'
    """
    from fleetscope.services.jobs import job_exists, job_sdc  # lazy: imports every job analyzer

    st = _store()
    if not job_exists(st, job_id):
        raise click.ClickException(f"no job {job_id!r}: nothing ingested under that id")
    out = job_sdc(st, job_id)
    if as_json:
        click.echo(json.dumps(out, default=str))
        return
    click.echo(f"job {job_id}: {out['steps_screened']} rank-steps screened, {len(out['suspects'])} suspect(s)")
    for f in out["suspects"]:
        click.echo(f"  [{f['severity']}] {f['summary']}")
    for m in out["checksum_mismatches"]:
        if m["verdict"] == "tie":
            click.echo(f"  tie at step {m['step']} (group {m['replica_group']}): rank {m['rank']} holds {m['param_checksum']}; no majority")
    for v in out["reruns"]["verdicts"]:
        click.echo(f"  rerun {v['case_id']} on {v['suspect_gpu']}: {v['verdict']} ({v['reason']})")
        for r in v["runs"]:
            what = "original" if r["attempt"] == 0 else f"replay {r['attempt']}"
            click.echo(f"      {what:<9} on {r['gpu_uuid']}: {r['result']}  ({r['source']}, {r['ts']})")
        if v["expected"] is not None:
            click.echo(f"      expected  {v['expected']} ({v['expected_source']})")
    for p in out["reruns"]["problems"]:
        click.echo(f"  rerun {p['case_id']} not judged: {p['problem']}")


# The Fleet Law's growing terms (analyzers.c3.COMM_TERMS, which --help must not import; a test holds them equal).
_COMM_TERMS = ("ring", "tree", "ring_bandwidth")


@jobs.command("scaling")
@click.argument("model")
@click.option("--points", type=click.IntRange(2, 1000), default=None,
              help="world sizes the fitted curve is predicted at (--json's curve; default 64, the Jobs page's)")
@click.option("--comm-term", type=click.Choice(_COMM_TERMS), default=None,
              help="the fit's growing term: ring 2(N-1) (default, the Jobs page's), tree log2 N, ring_bandwidth 2(N-1)/N")
@click.option("--json", "as_json", is_flag=True, help="runs, fit and curve as GET /api/v1/models/{name}/scaling answers")
def scaling(model: str, points: int | None, comm_term: str | None, as_json: bool) -> None:
    """Scaling across the runs of MODEL (the job inventory's model_name) at different world sizes: each run's
    mean step time and efficiency η = T1 / (N · T_N) (relative to the smallest run without a 1-GPU one), and the
    Fleet Law T_step(N) = a/N + b·2(N−1) + c fitted to them (three world sizes or more) with N*, past which adding
    GPUs makes every step slower. What the Jobs page shows under "Scaling across runs".

    \b
    Examples:
      fleetscope jobs scaling llama-7b
      fleetscope jobs scaling llama-7b --comm-term tree
      fleetscope jobs scaling llama-7b --json | jq .fit.n_opt
    """
    from fleetscope.services import job_reads  # lazy: imports the C3 analyzer

    if has_control(model):
        raise click.BadParameter("a model name holds no control characters", param_hint="MODEL")
    kwargs = {k: v for k, v in (("points", points), ("comm_term", comm_term)) if v is not None}
    try:
        out = job_reads.scaling_report(_store(), model, **kwargs)
    except NotFound as exc:
        raise click.ClickException(f"{exc}: `fleetscope jobs scaling` takes a job's model_name") from None
    if as_json:
        click.echo(json.dumps(out, default=str))
        return
    runs = out["runs"]
    click.echo(f"model {model}: {len(runs)} run{'s' if len(runs) != 1 else ''} with step records")
    if runs:
        width = max(len("job"), *(len(r["job_id"]) for r in runs))
        click.echo(f"  {'job':<{width}}  {'N':>6}  {'mean step':>11}  {'η':>6}")
        for r in runs:
            click.echo(f"  {r['job_id']:<{width}}  {r['world_size']:>6}  {r['step_time_mean_s']:>9.4g} s  {r['efficiency_ratio']:>6.3f}")
    fit = out["fit"]
    if fit is None:
        click.echo(f"no Fleet Law fit: {out['why']}")
        return
    term = {"ring": "2(N−1)", "tree": "log2 N", "ring_bandwidth": "2(N−1)/N"}.get(fit["comm_term"], fit["comm_term"])
    click.echo(f"Fleet Law ({fit['comm_term']}): T_step(N) = a/N + b·{term} + c")
    click.echo(f"  a {fit['a_s']:.4g} s  b {fit['b_s']:.4g} s  c {fit['c_s']:.4g} s  R² {fit['r2']:.4f}")
    if fit["a_s"] <= 0:
        click.echo("  a ≤ 0: these runs' step times do not shrink with N as one model and global batch would "
                   "(different batch sizes, or a straggler in one run); read η only")
    elif fit["n_opt"] is None:
        click.echo("  N* none: the fitted step time keeps falling as GPUs are added")
    else:
        click.echo(f"  N* {fit['n_opt']:,.1f} GPUs: past it, adding GPUs makes every step slower")
