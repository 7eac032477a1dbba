"""The canonical series key, ``name{a="1",b="2"}`` (labels sorted, values escaped as the Prometheus text
format escapes them), and its inverse. ``metric_sample`` rows, alert rules and the fleet series all name a
series this way.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetscope.core.promtext import LABEL_PAIR, escape, unescape


def series_key(name: str, labels: Mapping[str, str] | None = None) -> str:
    """The canonical series key ``name{a="1",b="2"}``: labels sorted, values escaped as Prometheus does."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{escape(str(labels[k]))}"' for k in sorted(labels)) + "}"


def parse_series_key(key: str) -> tuple[str, dict[str, str]]:
    """The inverse of :func:`series_key`: ``name{a="1",b="2"}`` → (name, labels), values unescaped."""
    name, brace, rest = key.partition("{")
    labels: dict[str, str] = {}
    if brace:
        for m in LABEL_PAIR.finditer(rest):
            labels[m.group(1)] = unescape(m.group(2))
    return name, labels
