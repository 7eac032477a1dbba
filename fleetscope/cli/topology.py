"""``fleetscope topology``: fabric analyses against the stored topology — all-to-all runs against the bound
the leaves' uplinks and the hosts' NICs allow, and the port, host or switch a job's slow ranks share."""

from __future__ import annotations

import datetime as dt

import click

from fleetscope.cli.common import _emit, _store, _utc_option


@click.group()
def topology() -> None:
    """Fabric analyses against the stored topology (ibnetdiscover, NCCL topology, nvidia-smi topo -m).

    \b
    Examples:
      fleetscope topology alltoall --json
      fleetscope topology attribution --job job-llm-a
    """


@topology.command("alltoall")
@click.option("--start", "start_text", default=None, help="RFC 3339 start (default: a day before --end).")
@click.option("--end", "end_text", default=None, help="RFC 3339 end, exclusive (default: now).")
@click.option("--low", "low_only", is_flag=True, help="Only runs below half their bound.")
@click.option("--json", "as_json", is_flag=True)
def alltoall(start_text: str | None, end_text: str | None, low_only: bool, as_json: bool) -> None:
    """nccl-tests all-to-all runs against the bound the topology implies: busbw, bound, utilisation.

    \b
    Example:
      fleetscope topology alltoall --start 2026-12-01T00:00:00Z --low
    """
    from fleetscope.services import health as health_service  # lazy: imports the health analyzers

    end = _utc_option(end_text, "--end") or dt.datetime.now(dt.UTC)
    start = _utc_option(start_text, "--start") or end - health_service.NCCL_TEST_LOOKBACK
    if end <= start:
        raise click.BadParameter("must be after --start", param_hint="--end")
    util = health_service.alltoall_utilization(_store(), end, start=start)
    if low_only:
        util = util.filter(util["low"])
    lines = [f"{util.height} all-to-all run(s) from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"]
    for r in util.to_dicts():
        got = (f"{r['utilization_ratio']:.0%} of {r['bound_busbw_gbps']:.1f} GB/s ({r['limit']})" if r["utilization_ratio"] is not None
               else "no bound (topology unknown for its hosts)")
        lines.append(f"  {r['run_id'][:16]:<16} {r['nranks']:>5} ranks  busbw {r['busbw_gbps']:8.2f} GB/s  {got}{'  LOW' if r['low'] else ''}")
    _emit(as_json, {"start": start, "end": end, "runs": util.to_dicts()}, "\n".join(lines))


@topology.command("attribution")
@click.option("--job", "job_id", default=None, help="Only this job.")
@click.option("--start", "start_text", default=None, help="RFC 3339 start (default: 15 minutes before --end).")
@click.option("--end", "end_text", default=None, help="RFC 3339 end, exclusive (default: now).")
@click.option("--json", "as_json", is_flag=True)
def attribution(job_id: str | None, start_text: str | None, end_text: str | None, as_json: bool) -> None:
    """The HCA port, host or leaf switch a job's slow-communicating ranks share, with the evidence.

    \b
    Example:
      fleetscope topology attribution --job job-llm-a --json
    """
    from fleetscope.services import health as health_service  # lazy: imports the health analyzers

    end = _utc_option(end_text, "--end") or dt.datetime.now(dt.UTC)
    start = _utc_option(start_text, "--start") or end - dt.timedelta(minutes=15)
    if end <= start or end - start > health_service.MAX_WINDOW:
        raise click.BadParameter(f"must be after --start and at most {health_service.MAX_WINDOW} later", param_hint="--end")
    out = health_service.straggler_attribution(_store(), start, end, job_id=job_id)
    found = out["findings"]
    lines = [f"{out['slow'].height} slow rank(s) in {out['slow']['job_id'].n_unique()} job(s); {found.height} suspect(s)"]
    lines += [f"  {r['severity']:<8} {r['subject']}: {r['summary']}" for r in found.to_dicts()]
    _emit(as_json, {"start": start, "end": end, "slow_ranks": out["slow"].to_dicts(), "components": out["attribution"].to_dicts(),
                    "findings": found.to_dicts()}, "\n".join(lines))
