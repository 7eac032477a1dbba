"""``fleetscope health``: the fleet's hardware health: health scores per GPU and node, the SDC known-answer
probe, fabric link health, and interruptions with MTBF and checkpoint advice (reliability)."""

from __future__ import annotations

import datetime as dt
import json
import sys

import click

from fleetscope.cli.common import _emit, _settings, _store, _utc_option


@click.group()
def health() -> None:
    """Hardware health: GPU and node scores, the SDC probe, InfiniBand/RoCE link health, interruptions and MTBF.

    \b
    Examples:
      fleetscope health scores --level node
      fleetscope health probe --backend cuda
      fleetscope health fabric --json
      fleetscope health reliability --job-id job-llm-a
    """


@health.command("scores")
@click.option("--start", "start_text", default=None, help="RFC 3339 start (default: 15 minutes before --end, the window beat sweeps).")
@click.option("--end", "end_text", default=None, help="RFC 3339 end, exclusive (default: now); at most a day after --start.")
@click.option("--level", type=click.Choice(["gpu", "node"]), default="gpu", show_default=True, help="A row per GPU or per node.")
@click.option("--json", "as_json", is_flag=True)
def scores(start_text: str | None, end_text: str | None, level: str, as_json: bool) -> None:
    """Health score (100 healthy .. 0), recommendation (none, watch, restart_app, investigate, reset_gpu,
    drain_node, send_for_repair) and the reasons, per GPU or node, over a window of raw samples: what
    GET /api/v1/health serves. Reads only: the findings are the sweep's to write.

    \b
    Examples:
      fleetscope health scores
      fleetscope health scores --level node --start 2026-12-01T00:00:00Z --end 2026-12-01T06:00:00Z
      fleetscope health scores --json | jq '.[] | select(.score < 70) | .gpu_uuid'
    """
    from fleetscope.services.health import health_window  # lazy: imports the health analyzers

    end = _utc_option(end_text, "--end") or dt.datetime.now(dt.UTC)
    start = _utc_option(start_text, "--start") or end - dt.timedelta(minutes=15)
    settings = _settings()
    try:
        out = health_window(_store(), start, end, write=False, hang_min_stall_s=settings.hang_min_stall_s,
                            idle_min_s=settings.idle_allocation_min_s)
    except ValueError as exc:  # an empty or reversed window, or one longer than a day
        raise click.ClickException(str(exc)) from None
    df = out["gpus" if level == "gpu" else "nodes"]
    rows = df.sort("score", "gpu_uuid" if level == "gpu" else "host").to_dicts() if df.height else []
    if level == "gpu":
        lines = [f"{r['gpu_uuid']:<44} {r.get('host') or '-':<20} {r['score']:>5.0f}  {r['recommendation']:<15} {'; '.join(r['reasons'])}"
                 for r in rows]
    else:
        lines = [f"{r['host']:<20} {r['gpus']:>3} GPUs  worst {r['score']:>5.0f}  mean {r['score_mean']:>5.1f}  {r['recommendation']:<15} "
                 f"{', '.join(r['gpus_flagged'])}" + (f"  ({r['node_reason']})" if r.get("node_reason") else "") for r in rows]
    head = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC: {len(rows)} {level}(s), worst first"
    _emit(as_json, rows, "\n".join([head, *lines]) if rows else f"no GPU samples between {start.isoformat()} and {end.isoformat()}")


@health.command("reliability")
@click.option("--start", "start_text", default=None, help="RFC 3339 start (default: 30 days before --end).")
@click.option("--end", "end_text", default=None, help="RFC 3339 end, exclusive (default: now).")
@click.option("--job-id", default=None, help="One job only.")
@click.option("--parts", type=click.IntRange(min=1), default=None, help="N for the all-up availability A^N (default: the job's GPUs).")
@click.option("--part-availability", type=click.FloatRange(0.0, 1.0), default=None, help="A per part (default: measured from the window).")
@click.option("--json", "as_json", is_flag=True)
def reliability(start_text: str | None, end_text: str | None, job_id: str | None, parts: int | None, part_availability: float | None,
                as_json: bool) -> None:
    """Interruptions by root cause (Llama 3 categories), MTBF per GPU-hour and per job, all-up availability
    A^N, and Young/Daly checkpoint advice per job, over a window of job events.

    \b
    Examples:
      fleetscope health reliability
      fleetscope health reliability --job-id job-llm-a --part-availability 0.999 --json
    """
    from fleetscope.services.reliability import UnknownJob, reliability_report  # lazy: keeps --help light

    end = _utc_option(end_text, "--end") or dt.datetime.now(dt.UTC)
    start = _utc_option(start_text, "--start") or end - dt.timedelta(days=30)
    try:
        out = reliability_report(_store(), start, end, job_id=job_id, parts=parts, part_availability=part_availability)
    except (UnknownJob, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out, default=str))
        return

    def hours(h: float | None) -> str:
        return "no failures" if h is None else f"{h:.4g} h"

    m = out["mtbf"]
    click.echo(f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC: {out['interruptions']['total']} unexpected interruption(s) "
               f"in {m['gpu_hours']:.6g} GPU-hours; GPU MTBF {hours(m['gpu_mtbf_hours'])}")
    for c in out["interruptions"]["by_category"]:
        if c["interruptions"]:
            click.echo(f"  {c['category']:<32} {c['component']:<22} {c['interruptions']:>6}  {c['share']:6.1%}")
    for j in m["jobs"]:
        click.echo(f"  job {j['job_id']}: {j['gpus']} GPUs x {j['wall_hours']:.4g} h, {j['interruptions']} interruption(s), "
                   f"job MTBF {hours(j['job_mtbf_hours'])}")
    a = out["availability"]
    if a["parts"] is not None:
        up = "unknown" if a["all_up"] is None else f"{a['all_up']:.1%}"
        click.echo(f"  all {a['parts']} parts up: {up} (A = {a['part_availability']}; {a['basis']})")
    for c in out["checkpoint"]:
        line = f"  checkpoint {c['job_id']}: save {c['save_cost_s']:.0f} s"
        if c["interval_s"] is not None:
            line += f" every {c['interval_s'] / 60:.1f} min"
        if c["daly_interval_s"] is not None:
            line += f"; advised: Young {c['young_interval_s'] / 60:.1f} min, Daly {c['daly_interval_s'] / 60:.1f} min"
        if c["lost_fraction_actual"] is not None and c["lost_fraction_advised"] is not None:
            line += f"; time lost {c['lost_fraction_actual']:.1%} now vs {c['lost_fraction_advised']:.1%} advised"
        click.echo(line + f" (MTBF: {c['mtbf_basis']})")


@health.command("fabric")
@click.option("--start", "start_text", default=None, help="RFC 3339 start (default: 15 minutes before --end).")
@click.option("--end", "end_text", default=None, help="RFC 3339 end, exclusive (default: now).")
@click.option("--json", "as_json", is_flag=True)
def fabric(start_text: str | None, end_text: str | None, as_json: bool) -> None:
    """InfiniBand/RoCE link health over a window: flapping, erroring, congested and degraded links from
    the stored port counters and topology, and the usual HCA link rate.

    \b
    Examples:
      fleetscope health fabric
      fleetscope health fabric --start 2026-12-01T00:00:00Z --end 2026-12-01T06:00:00Z --json
    """
    from fleetscope.services.health import fabric_health  # lazy: imports the health analyzers

    end = _utc_option(end_text, "--end") or dt.datetime.now(dt.UTC)
    start = _utc_option(start_text, "--start") or end - dt.timedelta(minutes=15)
    try:
        out = fabric_health(_store(), start, end)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    found = out["findings"]
    if as_json:
        click.echo(json.dumps({"start": start, "end": end, "nic_rate_gbps": out["nic_rate_gbps"], "links": out["links"],
                               "ports_seen": out["ports"].height, "findings": found.to_dicts()}, default=str))
        return
    rate = f"{out['nic_rate_gbps']:g} Gb/s" if out["nic_rate_gbps"] else "unknown"
    click.echo(f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC: {out['ports'].height} port(s) sampled, {out['links']} link(s) "
               f"in the topology, HCA link rate {rate}; {found.height} finding(s)")
    for r in found.sort("kind", "subject").to_dicts():
        click.echo(f"  {r['kind']:<17} {r['severity']:<8} {r['summary']}")


@health.command("probe")
@click.option("--backend", type=click.Choice(["numpy", "torch", "cupy", "cuda"]), default="numpy", show_default=True,
              help="numpy runs on the CPU; torch and cupy on a CUDA device; cuda takes whichever of the two can.")
@click.option("--device-index", type=click.IntRange(min=0), default=0, show_default=True, help="CUDA device number.")
@click.option("--gpu-uuid", default=None, help="Record the result against this GPU.")
@click.option("--no-record", is_flag=True, help="Print only; do not write a health event.")
@click.option("--json", "as_json", is_flag=True)
def probe(backend: str, device_index: int, gpu_uuid: str | None, no_record: bool, as_json: bool) -> None:
    """Known-answer test for silent data corruption: a deterministic matrix multiply whose result must
    hash to the golden digest, the same for every device type. Exits 0 on pass, 5 on a mismatch (a
    confirmed SDC suspect), 1 when the backend cannot run here (the message names what is missing).

    \b
    Examples:
      fleetscope health probe --no-record
      fleetscope health probe --backend cuda --device-index 3 --gpu-uuid GPU-5c1a... --json
    """
    from fleetscope.services.health import run_probe  # lazy: imports the health analyzers

    try:
        result = run_probe(None if no_record else _store(), backend, gpu_uuid=gpu_uuid, device_index=device_index)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result.to_dict(), default=str))
    else:
        verdict = "PASS" if result.passed else "FAIL: result differs from the golden digest" if result.passed is False else "no golden digest"
        wrong = f", {result.mismatched_elements} of {result.n * result.n} elements wrong" if result.mismatched_elements else ""
        click.echo(f"{backend} on {result.device}: {verdict} ({result.n}x{result.n}, {result.rounds} rounds, {result.seconds:.2f} s{wrong})\n"
                   f"  digest {result.digest}\n  golden {result.golden or 'none for this probe shape'} (device type {result.device_type})")
    sys.exit(5 if result.passed is False else 0)
