"""What a process loads to start: an API process (each of `serve --workers N`, and every restart a fleet's agents
wait out) and the CLI's root (`fleetscope --help`) load none of the heavy optional stack. scikit-learn alone,
reached through the monitoring service's fairness what-if, took about two seconds and 136 MB of each API
process before it loaded on first use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("sklearn", "scipy", "pandas", "fairlearn", "weasyprint", "streamlit", "torch", "playwright")


@pytest.mark.parametrize("module", ["fleetscope.api.app", "fleetscope.cli"])
def test_starting_loads_none_of_the_heavy_stack(module):
    code = f"import json, sys; import {module}; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_fairness_what_if_still_loads_scikit_learn_when_used():
    code = ("import sys; from governance import fairness_depth as FD; assert 'sklearn' not in sys.modules; "
            "cls = FD._scores_estimator(); import sklearn.base; assert issubclass(cls, sklearn.base.BaseEstimator); "
            "assert FD._scores_estimator() is cls; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
