"""The ``fleetscope`` command: a small root of groups, one module per domain, mirroring the services.

Top-level verbs are the processes an operator starts (``serve``, ``worker``, ``beat``, ``dashboard``,
``agent``, ``demo``), the way files come in (``ingest``) and the one check an auditor runs (``verify``);
everything else is a group: ``db``, ``token``, ``jobs``, ``health``, ``topology``, ``fleet``, ``energy``,
``alerts``, ``governance``, ``audit``, ``monitoring``, ``serving``. Each group lives in its own module
and is registered here with ``main.add_command``; each verb's --help has examples, and --json where
scripts read the output. How verbs import their services is said in ``common.py``.
"""

from __future__ import annotations

import click

from fleetscope import __version__
# The modules, not their commands: a command named like its module would hide the module's attribute.
from fleetscope.cli import alerts, audit, db, energy, fleet, governance, health, ingest, jobs, monitoring, processes, serving, teams, tokens, topology

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fleetscope")
def main() -> None:
    """Fleetscope: observability, ops and governance for GPU training and serving fleets.

    Configuration comes from FLEETSCOPE_* environment variables (see the README); with none set,
    everything runs embedded in ./.fleetscope (SQLite, and a SQLite-backed Celery broker).

    \b
    Examples:
      fleetscope demo
      fleetscope ingest telemetry/ && fleetscope jobs analyze job-llm-a
      fleetscope serve & fleetscope worker & fleetscope beat
      fleetscope audit report && fleetscope audit export --out bundle.zip
    """


# The processes, the way in, the one check.
for _verb in (processes.serve, processes.worker, processes.beat, processes.dashboard_cmd, processes.agent, processes.demo,
              ingest.ingest, audit.verify):
    main.add_command(_verb)

# One group per domain.
main.add_command(db.db_group)
main.add_command(tokens.token_group)
main.add_command(jobs.jobs)
main.add_command(health.health)
main.add_command(topology.topology)
main.add_command(fleet.fleet)
main.add_command(energy.energy)
main.add_command(alerts.alerts)
main.add_command(governance.governance)
main.add_command(audit.audit)
main.add_command(monitoring.monitoring)
main.add_command(serving.serving)
main.add_command(teams.teams)
