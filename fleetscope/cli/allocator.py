"""The API server's memory allocators, tuned for a body of a hundred megabytes every scrape interval.

A 16,384-GPU dcgm-exporter scrape inflates to 112 MB, and parsing it makes a few hundred MB of polars
buffers. With the allocators' defaults every scrape maps that memory afresh and the kernel faults in and
zeroes each 4 KiB page again: a quarter of the server's CPU for a large scrape went to page faults,
``madvise`` and ``munmap`` (``perf``, docs/BENCHMARKS.md). Two settings keep it:

- jemalloc, which polars brings and sets to return unused pages after half a second (a default for notebook
  memory, pola-rs/polars#18088), keeps them for ``DECAY_MS`` instead, past one scrape interval, so the
  next scrape reuses them (jemalloc's ``dirty_decay_ms`` and ``muzzy_decay_ms``, its TUNING.md);
- glibc's malloc, which takes the inflated body, asks for transparent huge pages on its large mappings
  (the ``glibc.malloc.hugetlb=1`` tunable, glibc 2.35): a 2 MiB page faults once where 512 small ones did.

Both allocators read these only when the process starts, so ``fleetscope serve`` executes itself again
once with them in its environment. ``FLEETSCOPE_TUNE_ALLOCATOR=0`` leaves the environment as given.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

DECAY_MS = 10_000
JEMALLOC_CONF = f"dirty_decay_ms:{DECAY_MS},muzzy_decay_ms:{DECAY_MS}"
GLIBC_HUGETLB = "glibc.malloc.hugetlb=1"
TUNED = "FLEETSCOPE_ALLOCATOR_TUNED"
"""Set in the environment of the process executed with the settings, so it does not execute itself again."""


def tuned_environment(env: Mapping[str, str], platform: str = sys.platform) -> dict[str, str] | None:
    """The environment to execute the server again with, or None where it runs as it is: not Linux (the
    tunable is glibc's), or already tuned. polars (``_RJEM_MALLOC_CONF``) reads its own defaults first and
    this variable after them, so the later keys set here take effect; a ``glibc.malloc.hugetlb`` the
    operator set is kept."""
    if platform != "linux" or env.get(TUNED):
        return None
    out = dict(env)
    out[TUNED] = "1"
    jemalloc = env.get("_RJEM_MALLOC_CONF", "")
    out["_RJEM_MALLOC_CONF"] = f"{jemalloc},{JEMALLOC_CONF}" if jemalloc else JEMALLOC_CONF
    glibc = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" not in glibc:
        out["GLIBC_TUNABLES"] = f"{glibc}:{GLIBC_HUGETLB}" if glibc else GLIBC_HUGETLB
    return out


def _program(argv: Sequence[str]) -> list[str] | None:
    """How to run this ``fleetscope`` command again: its script where the script started it (``python -m``
    would put the working directory first on the module path, where the script does not), else
    ``python -m fleetscope.cli``; None where a program calls the command in process."""
    first = argv[0] if argv else ""
    if os.path.basename(first) == "fleetscope":
        return [first]
    if first.endswith(os.path.join("fleetscope", "cli", "__main__.py")):
        return [sys.executable, "-m", "fleetscope.cli"]
    return None


def started_as_cli(argv: Sequence[str]) -> bool:
    """Whether this process is the ``fleetscope`` command (its script, or ``python -m fleetscope.cli``), not a
    program that calls the command in process (a test's ``CliRunner``), which must never be replaced."""
    return _program(argv) is not None


def execute_tuned(args: Sequence[str], enabled: bool) -> None:
    """Replace this process with ``fleetscope ARGS`` under the tuned environment, where that applies; returns
    only where it does not (or the execution failed, which leaves the server running untuned)."""
    program = _program(sys.argv)
    env = tuned_environment(os.environ) if enabled and program is not None else None
    if program is None or env is None:
        return
    argv = [*program, *args]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(argv[0], argv, env)
    except OSError as exc:
        print(f"warning: could not restart with the tuned allocator settings ({exc}); serving without them", file=sys.stderr)
