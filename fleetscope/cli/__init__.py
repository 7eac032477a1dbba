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
from fleetscope.cli.alerts import alerts
from fleetscope.cli.audit import audit, verify
from fleetscope.cli.db import db_group
from fleetscope.cli.energy import energy
from fleetscope.cli.fleet import fleet
from fleetscope.cli.governance import governance
from fleetscope.cli.health import health
from fleetscope.cli.ingest import ingest
from fleetscope.cli.jobs import jobs
from fleetscope.cli.monitoring import monitoring
from fleetscope.cli.processes import agent, beat, dashboard_cmd, demo, serve, worker
from fleetscope.cli.serving import serving
from fleetscope.cli.tokens import token_group
from fleetscope.cli.topology import topology


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
for _verb in (serve, worker, beat, dashboard_cmd, agent, demo, ingest, verify):
    main.add_command(_verb)

# One group per domain.
main.add_command(db_group)
main.add_command(token_group)
main.add_command(jobs)
main.add_command(health)
main.add_command(topology)
main.add_command(fleet)
main.add_command(energy)
main.add_command(alerts)
main.add_command(governance)
main.add_command(audit)
main.add_command(monitoring)
main.add_command(serving)
