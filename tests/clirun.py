"""Run the ``fleetscope`` command inside the test process, answering as ``subprocess.run`` would.

A ``python -m fleetscope.cli`` subprocess pays the whole import (polars, SQLAlchemy, the services) on every
call: seconds each, and a CLI test makes a dozen calls. ``cli`` invokes the same click group,
``fleetscope.cli.main``, with click's ``CliRunner`` and returns a ``subprocess.CompletedProcess`` with the
exit status in ``returncode`` and stdout and stderr apart, so assertions
written against a subprocess hold word for word.

What a fresh process would have and the test process must be given back:

- the environment: ``env`` is the whole environment of the command, as for ``subprocess.run``; a variable
  the test process has and ``env`` lacks is unset for the call, and everything is restored after it;
- the per-process caches of the product: verified API tokens (``services.auth``) and the day partitions
  known to exist (``store.partitions``) start empty, as in a new process;
- the engines the command opened are disposed after it, as a process's exit closes them, so no pooled
  PostgreSQL connection outlives the call;
- an exception that escapes the command ends it with status 1 and its traceback on stderr, as the
  interpreter does.

The verbs that are processes of their own (``serve``, ``worker``, ``beat``, ``dashboard``, ``demo``, ``agent``)
stay real subprocesses in their tests; ``tests/fleetscope/test_cli.py`` also runs the installed ``fleetscope``
script itself.
"""

from __future__ import annotations

import os
import subprocess
import threading
import traceback
from collections.abc import Mapping

from click.testing import CliRunner
from sqlalchemy import Engine

from fleetscope.cli import main
from fleetscope.services import auth
from fleetscope.store import db, partitions


def _env_for(env: Mapping[str, str] | None) -> dict[str, str | None]:
    """``env`` as CliRunner's overrides: every variable set as given, and the test process's others unset."""
    if env is None:
        return {}
    return {**{k: None for k in os.environ if k not in env}, **dict(env)}


class _Engines:
    """The engines ``db.make_engine`` opens in this thread while a command runs, to dispose them after it."""

    def __init__(self) -> None:
        self.made: list[Engine] = []
        self._thread = threading.get_ident()
        self._create = db.create_engine

    def __enter__(self) -> _Engines:
        def create(*args, **kwargs):  # type: ignore[no-untyped-def]
            engine = self._create(*args, **kwargs)
            if threading.get_ident() == self._thread:  # a live server's thread keeps its own engines
                self.made.append(engine)
            return engine

        db.create_engine = create  # type: ignore[assignment]
        return self

    def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        db.create_engine = self._create  # type: ignore[assignment]
        for engine in self.made:
            engine.dispose()


def _runner() -> CliRunner:
    """A runner that keeps stderr apart: click >= 8.2 always does and has no ``mix_stderr``; 8.1 (which
    pyproject still allows) mixes it into stdout unless told not to."""
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:
        return CliRunner()


def cli(*args: str, env: Mapping[str, str] | None = None, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``fleetscope *args`` with ``env`` as its whole environment (None: the test process's)."""
    auth._cache.clear()
    with partitions._known_lock:
        partitions._known.clear()
    with _Engines():
        result = _runner().invoke(main, list(args), env=_env_for(env), input=input, catch_exceptions=True, prog_name="fleetscope")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["fleetscope", *args], result.exit_code, result.stdout, stderr)
