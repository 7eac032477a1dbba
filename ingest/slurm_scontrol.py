"""Slurm nodes as ``scontrol show -o nodes`` text: one line per node of ``Key=Value`` pairs
(``scontrol(1)``: ``NodeName``, ``State``, ``CfgTRES``, ``AllocTRES``, ``Gres``, ``GresUsed``,
``Partitions``, ``CPUTot``, ``CPUAlloc``, ``Reason``), any subset and order (the Hábrók tools keep only
``NodeName`` and ``CfgTRES``).

``Reason`` runs to the end of the line (it holds spaces) with its ``[user@time]`` suffix split off. GPUs
configured come from ``CfgTRES`` ``gres/gpu`` (else ``Gres``), allocated from ``AllocTRES`` (else
``GresUsed``). Rows are ``sched_node`` and ``host``, stamped with the time the output was taken.
Pure: bytes in, a ``Batch`` out.
"""

from __future__ import annotations

import datetime as dt
import re

from fleetscope.core import frames as F
from fleetscope.core import scheduler_frames as S
from fleetscope.core import slurm
from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import input_lines
from ingest.format import FormatSpec, Sniff, SniffView

MAX_INPUT_BYTES = 64 * 2**20
MAX_LINE_BYTES = 64 * 1024
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_]*)=")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}$")
_REASON_BY = re.compile(r"^(.*?)\s*\[([^@\]]+)@([0-9T:\-]+)\]$")


def _pairs(text: str) -> dict[str, str]:
    marks = list(_KEY.finditer(text))
    out: dict[str, str] = {}
    for i, m in enumerate(marks):
        key = m.group(1)
        if key == "Reason":  # the rest of the line: the reason holds spaces and '='
            out[key] = text[m.end():].strip()
            break
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        out[key] = text[m.end():end].strip()
    return out


def parse(data: bytes, *, ts: dt.datetime | None, source: str = "scontrol", cluster: str = "") -> F.Batch:
    """One ``sched_node`` row per ``NodeName=`` line."""
    rows: dict[str, dict[str, object]] = {}
    for lineno, text in input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES):
        kv = _pairs(text)
        node = kv.get("NodeName", "")
        if not _NODE.match(node):
            raise ParseError("expected NodeName=<node> Key=Value ... (scontrol show -o nodes)", source=source, line=lineno, field="NodeName")
        try:
            cfg, _ = slurm.tres_gpus(slurm.parse_tres(kv.get("CfgTRES")))
            cfg_types = slurm.tres_gpus(slurm.parse_tres(kv.get("CfgTRES")))[1]
            if cfg is None and kv.get("Gres"):
                cfg, cfg_types, _ = slurm.gres_gpus(kv["Gres"])
            alloc, _ = slurm.tres_gpus(slurm.parse_tres(kv.get("AllocTRES")))
            if alloc is None and kv.get("GresUsed"):
                alloc = slurm.gres_gpus(kv["GresUsed"])[0]
        except ValueError as exc:
            raise ParseError(str(exc), source=source, line=lineno) from None
        reason, by, at = kv.get("Reason") or None, None, None
        if reason and (m := _REASON_BY.match(reason)):
            reason, by = m.group(1), m.group(2)
            try:
                at = dt.datetime.fromisoformat(m.group(3)).replace(tzinfo=dt.UTC)
            except ValueError:
                at = None

        def num(key: str) -> int | None:
            v = kv.get(key)
            return int(v) if v and v.isdigit() else None

        rows[node] = {"cluster": kv.get("ClusterName") or cluster, "host": node, "state": kv.get("State") or None, "reason": reason,
                      "reason_set_by": by, "reason_changed_at": at, "gpus_total": cfg if cfg is not None else (0 if "CfgTRES" in kv else None),
                      "gpus_alloc": alloc, "gpu_types": ",".join(f"{k}:{v}" for k, v in sorted(cfg_types.items())) or None,
                      "cpus_total": num("CPUTot"), "cpus_alloc": num("CPUAlloc"), "partitions": kv.get("Partitions") or None,
                      "observed_at": ts, "source": source}
    return F.Batch(source=source, sched_node=S.frame(S.SCHED_NODE, list(rows.values())),
                   host=S.frame(F.HOST, [{"host": h} for h in rows]),
                   meta={"nodes": len(rows), "gpu_nodes": sum(1 for r in rows.values() if r["gpus_total"]),
                         "gpus": sum(int(r["gpus_total"] or 0) for r in rows.values())})


def _looks_like(view: SniffView) -> bool:
    return view.stripped.startswith("NodeName=") and ("CfgTRES=" in view.text[:4096] or "State=" in view.text[:4096])


FORMATS = (
    FormatSpec("slurm_scontrol_nodes", "Slurm nodes, scontrol show -o nodes text: state, drain reason, GPUs configured and allocated",
               lambda d, s, o: parse(d, ts=o.ts, source=s), sniff=Sniff(47, _looks_like), needs_ts=True),
)
