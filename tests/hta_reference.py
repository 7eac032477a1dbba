"""Meta's Holistic Trace Analysis' own figures for the real traces in ../shared/realdata/traces/hta, and the check
every test of them applies (``tests/analyzers/test_c3.py`` on the analyzer, ``tests/fleetscope/test_job_temporal.py``
through the service, the API and the CLI).

Reference numbers obtained on 2026-11-29 by running HolisticTraceAnalysis 0.5.0 (pip install holistictraceanalysis,
in a separate venv: Python 3.11.7, pandas 3.1.1, numpy 2.4.6) as
  ta = hta.trace_analysis.TraceAnalysis(trace_dir=<dir>)
  ta.get_temporal_breakdown(visualize=False); ta.get_comm_comp_overlap(visualize=False)
once per directory below (default arguments: the last profiler step left out).
Per rank: (idle_us, compute_us, non_compute_us, kernel_us, idle_pctg, compute_pctg, non_compute_pctg,
comp_comm_overlap_pctg); overlap None where HTA reports NaN (no communication kernels).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

HTA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "realdata" / "traces" / "hta"
needs_traces = pytest.mark.skipif(not HTA_DIR.is_dir(), reason=f"real traces not found at {HTA_DIR}")

HTA_REFERENCE: dict[str, dict[int, tuple]] = {
    "two_rank_sampled_128gpu_job": {
        0: (321378, 106252, 172428, 600058, 53.56, 17.71, 28.74, 11.81),
        1: (328671, 135548, 136455, 600674, 54.72, 22.57, 22.72, 20.05),
    },
    "critical_path_alexnet": {0: (12929684, 10637, 55690, 12996011, 99.49, 0.08, 0.43, None)},
    "nccl_data_rank0_of_2": {0: (338781, 75169, 21636, 435586, 77.78, 17.26, 4.97, 14.31)},
    "queue_length_rank0_of_16": {0: (705853, 143836, 166865, 1016554, 69.44, 14.15, 16.41, 1.37)},
    "trace_diff/control": {3: (62119, 234760, 86525, 383404, 16.2, 61.23, 22.57, 47.03)},
    "trace_diff/test": {1: (46910, 429216, 152245, 628371, 7.47, 68.31, 24.23, 68.8)},
    "df_index_resolver_rank1_of_2": {1: (643612, 496485, 256572, 1396669, 46.08, 35.55, 18.37, 0.0)},
}


def trace_files(trace_dir: str) -> list[Path]:
    return sorted((HTA_DIR / trace_dir).glob("*.json*"))


def check_rank(row: dict[str, Any], ref: tuple) -> None:
    """One rank's figures (``analyzers.c3`` column names, as the service serves them) against HTA's."""
    # acceptance: shares within 0.1 percentage points of HTA's
    for col, want in zip(("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"), ref[4:7]):
        assert row[col] == pytest.approx(want, abs=0.1), col
    if ref[7] is None:
        assert row["comp_comm_overlap_pctg"] is None
    else:
        assert row["comp_comm_overlap_pctg"] == pytest.approx(ref[7], abs=0.1)
    # and in fact the same microseconds: same event window, same unions
    got = (row["idle_time_us"], row["compute_time_us"], row["non_compute_time_us"], row["kernel_time_us"])
    assert got == pytest.approx(ref[:4], abs=1.0)
