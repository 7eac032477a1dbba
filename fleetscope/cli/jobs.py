"""``fleetscope jobs``: one training job's analyses: C3, goodput and MFU, stragglers, the what-if, SDC."""

from __future__ import annotations

import json

import click

from fleetscope.cli.common import _store


@click.group()
def jobs() -> None:
    """One job's analyses: run them now (analyze), or read what was last stored (whatif, sdc).

    \b
    Examples:
      fleetscope jobs analyze job-llm-a
      fleetscope jobs whatif job-llm-a
      fleetscope jobs sdc job-llm-a --json
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
        top = sorted(((k, v) for k, v in g["badput_s"].items() if v), key=lambda kv: -kv[1])[:3]
        click.echo(f"  goodput {g['goodput_ratio']:.1%} of {g['total_s']:.0f} s; badput: " + (", ".join(f"{k} {v:.0f} s" for k, v in top) or "none"))
        if g.get("mfu_ratio") is not None:
            product = g.get("goodput_product_ratio")
            click.echo(f"          MFU {g['mfu_ratio']:.1%} ({g['mfu_dtype']} peak of {g['gpu_model']})"
                       + (f"; ML Productivity Goodput {product:.1%} (scheduling x runtime x program)" if product is not None else ""))
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
