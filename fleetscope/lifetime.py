"""Process lifetime: a child that ends with its parent.

A supervisor killed alone (SIGKILL of its pid, an OOM kill) otherwise leaves its children running unsupervised:
the API's workers keep serving on the socket they inherited, a worker's alerting process keeps consuming its
queue. Linux's ``PR_SET_PDEATHSIG`` (prctl(2)) sends the child a signal when the thread that spawned it ends;
the spawning threads here are their processes' main threads, so the signal comes when the parent process ends.
"""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """Ask Linux for SIGTERM when this process's parent dies; nothing on other systems. Safe as a
    ``subprocess.Popen(preexec_fn=...)``: it calls only prctl."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
