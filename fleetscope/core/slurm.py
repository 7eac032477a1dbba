"""Slurm's own notations, read the way Slurm writes them: host lists (``node[01-04,07]``), TRES strings
(``cpu=8,gres/gpu:a100=2,gres/gpu=2``), GRES strings with their device indices
(``gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)``), ``tres_per_job``/``tres_per_node`` requests
(``gres/gpu:h100:1``), durations (``D-HH:MM:SS``, ``MM:SS.mmm``) and job states (``CANCELLED by 1234``).

Shared by the scheduler parsers (``ingest/slurm_*.py``, ``ingest/slurmrestd.py``), the agent's slurmrestd
poll and the scheduler analyses, so every one reads a node list or a GPU count alike. Pure: strings in,
values out; malformed text raises ``ValueError`` naming what was wrong (the parsers turn it into a
``ParseError`` with the line).

References: Slurm ``hostlist.c`` (``hostlist_create``: comma-separated ranges inside brackets, zero padding
kept from the lower bound, several bracket groups in one name multiply), ``sacct(1)`` (TRES, Elapsed
``[DD-[HH:]]MM:SS``), ``gres.conf(5)`` and ``scontrol show node`` (``Gres``/``GresUsed`` with ``IDX``),
``sbatch(1)`` ``--gpus``/``--gres`` (``tres_per_job``), ``squeue(1)`` JOB STATE CODES.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A hostlist that would expand past this is refused, not allocated: ``n[0-999999999]`` is one line of text.
MAX_HOSTS = 200_000
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_HOST_CHARS = re.compile(r"^[A-Za-z0-9_.\-]*$")
# What Slurm prints where a job holds no node (sacct ``None assigned``, squeue ``(null)``).
NO_NODES = frozenset({"", "none assigned", "(null)", "none", "n/a"})


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and parentheses (``a[1-2],b`` -> ``a[1-2]``, ``b``)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced {ch!r} in {text[:80]!r}")
        elif ch == sep and depth == 0:
            out.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unclosed bracket in {text[:80]!r}")
    out.append(text[start:])
    return out


def _expand_ranges(body: str, limit: int) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise ValueError(f"bad range {part!r} in host list")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise ValueError(f"range {part!r} runs backwards")
        if len(values) + hi - lo + 1 > limit:
            raise ValueError(f"host list expands to more than {limit} hosts")
        width = len(lo_s) if lo_s.startswith("0") or len(lo_s) == len(hi_s) else 0
        values.extend(str(v).zfill(width) for v in range(lo, hi + 1))
    return values


def _expand_one(name: str, limit: int) -> list[str]:
    i = name.find("[")
    if i < 0:
        if "]" in name or not _HOST_CHARS.match(name):
            raise ValueError(f"bad host name {name[:80]!r}")
        return [name]
    j = name.find("]", i)
    if j < 0:
        raise ValueError(f"unclosed bracket in {name[:80]!r}")
    prefix, body, rest = name[:i], name[i + 1:j], name[j + 1:]
    if not _HOST_CHARS.match(prefix):
        raise ValueError(f"bad host name {name[:80]!r}")
    heads = _expand_ranges(body, limit)
    tails = _expand_one(rest, limit) if rest else [""]
    if len(heads) * len(tails) > limit:
        raise ValueError(f"host list expands to more than {limit} hosts")
    return [prefix + h + t for h in heads for t in tails]


def expand_hostlist(text: str | None, *, limit: int = MAX_HOSTS) -> list[str]:
    """The host names a Slurm host list stands for, in Slurm's order, duplicates kept out.

    ``expand_hostlist("node[01-04,07]")`` is ``node01 node02 node03 node04 node07``; ``ia[1-2]`` is
    ``ia1 ia2``; ``rack[1-2]n[1-2]`` multiplies (``rack1n1 rack1n2 rack2n1 rack2n2``); ``None assigned``,
    ``(null)`` and the empty string are no hosts. Zero padding follows the lower bound, as Slurm's does.
    """
    if text is None:
        return []
    text = text.strip()
    if text.lower() in NO_NODES:
        return []
    hosts: list[str] = []
    seen: set[str] = set()
    for item in _split_top(text):
        item = item.strip()
        if not item:
            continue
        for h in _expand_one(item, limit - len(hosts)):
            if h not in seen:
                seen.add(h)
                hosts.append(h)
    return hosts


def parse_tres(text: str | None) -> dict[str, str]:
    """A TRES string (``billing=24,cpu=8,mem=199G,node=1,gres/gpu:a100=2,gres/gpu=2``) as name -> value text."""
    out: dict[str, str] = {}
    if not text:
        return out
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, eq, value = part.partition("=")
        if not eq or not name:
            raise ValueError(f"bad TRES item {part[:80]!r}")
        out[name.strip()] = value.strip()
    return out


def _count(value: str, what: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{what}: {value[:40]!r} is not a whole number") from None
    if n < 0:
        raise ValueError(f"{what}: negative count {n}")
    return n


def tres_gpus(tres: dict[str, str]) -> tuple[int | None, dict[str, int]]:
    """GPUs in a parsed TRES: (count, by type). The untyped ``gres/gpu`` is the count when present (Slurm
    lists the typed ones beside it, so adding them would count twice); without it, the typed ones summed.
    ``None`` when the TRES says nothing of GPUs (older accounting without ``gres/gpu`` in
    AccountingStorageTRES: unknown, not zero)."""
    typed: dict[str, int] = {}
    untyped: int | None = None
    for name, value in tres.items():
        if name == "gres/gpu":
            untyped = _count(value, name)
        elif name.startswith("gres/gpu:"):
            typed[name[len("gres/gpu:"):]] = _count(value, name)
    if untyped is not None:
        return untyped, typed
    if typed:
        return sum(typed.values()), typed
    return None, {}


def tres_per_gpus(text: str | None) -> tuple[int | None, dict[str, int]]:
    """GPUs in a ``tres_per_job``/``tres_per_node`` request (``gres/gpu:12``, ``gres/gpu:h100:1,gres/gpu:h200:1``,
    ``gres:gpu:4``, ``gres/gpu`` alone = 1): (count, by type); ``None`` when it asks for no GPU."""
    if not text:
        return None, {}
    total, typed, seen = 0, {}, False
    for part in _split_top(text):
        part = part.strip()
        if part.startswith("gres:gpu"):  # the pre-21.08 spelling
            part = "gres/gpu" + part[len("gres:gpu"):]
        if not part.startswith("gres/gpu"):
            continue
        bits = part[len("gres/gpu"):].lstrip(":").split(":") if part != "gres/gpu" else []
        bits = [b for b in bits if b]
        if not bits:
            n, kind = 1, ""
        elif len(bits) == 1:
            n, kind = (_count(bits[0], part), "") if bits[0].isdigit() else (1, bits[0])
        else:
            n, kind = _count(bits[-1], part), ":".join(bits[:-1])
        seen = True
        total += n
        if kind:
            typed[kind] = typed.get(kind, 0) + n
    return (total if seen else None), typed


@dataclass(frozen=True)
class Gres:
    """One item of a GRES string: ``gpu:h100:2(IDX:0-1)`` is kind ``gpu``, type ``h100``, count 2, indices 0, 1."""

    kind: str
    type: str
    count: int
    indices: tuple[int, ...] | None  # None: the string gave none (IDX:N/A, S:0-1 is sockets, not devices)


def _index_list(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise ValueError(f"bad index range {part!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo or hi - lo > 4096 or len(out) > 4096:
            raise ValueError(f"index range {part!r} out of bounds")
        out.extend(range(lo, hi + 1))
    return tuple(out)


def parse_gres(text: str | None) -> list[Gres]:
    """A node's or job's GRES string: ``gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)``, ``gpu:8(S:0-1)``,
    ``gpu:(null):8(IDX:0-7)``, ``gpu:1g.10gb:9(IDX:0-3,5-9)``, ``gpu:h100:0(IDX:N/A)``; ``(null)``/``N/A``: none."""
    if not text or text.strip().lower() in ("(null)", "n/a", "none"):
        return []
    out: list[Gres] = []
    for item in _split_top(text.strip()):
        item = item.strip()
        if not item:
            continue
        item = item.replace(":(null)", "")  # an untyped GPU in gres_used: gpu:(null):8(IDX:0-7)
        extra = ""
        if item.endswith(")") and "(" in item:
            item, _, extra = item.rpartition("(")
            extra = extra[:-1]
        bits = item.split(":")
        kind = bits[0]
        if not kind:
            raise ValueError(f"bad GRES item {item[:80]!r}")
        rest = [b for b in bits[1:]]
        if rest and rest[-1].isdigit():
            count = _count(rest.pop(), item)
        else:
            count = 1
        gtype = ":".join(b for b in rest if b and b != "(null)")
        indices: tuple[int, ...] | None = None
        if extra.startswith("IDX:") and extra[4:] not in ("N/A", ""):
            indices = _index_list(extra[4:])
        out.append(Gres(kind, gtype, count, indices))
    return out


def gres_gpus(text: str | None) -> tuple[int, dict[str, int], tuple[int, ...] | None]:
    """GPUs in a GRES string: (count, by type, device indices or ``None`` when not all were given)."""
    total, typed, idx, known = 0, {}, [], True
    for g in parse_gres(text):
        if g.kind != "gpu":
            continue
        total += g.count
        if g.type:
            typed[g.type] = typed.get(g.type, 0) + g.count
        if g.indices is None:
            known = known and g.count == 0
        else:
            idx.extend(g.indices)
    return total, typed, (tuple(idx) if known else None)


_DURATION = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")
UNLIMITED = frozenset({"UNLIMITED", "INFINITE", "Partition_Limit", "NONE", "INVALID", ""})


def parse_duration_s(text: str | None) -> float | None:
    """Seconds in a Slurm duration: ``2-21:09:16``, ``11:23:23``, ``23:08.358`` (MM:SS.mmm), ``1-04:33``
    is not a form sacct prints; ``UNLIMITED``/``Partition_Limit``/empty: ``None``."""
    if text is None:
        return None
    text = text.strip()
    if text in UNLIMITED:
        return None
    m = _DURATION.match(text)
    if not m:
        # ``D-HH`` and ``D-HH:MM`` (time limits as sbatch takes them) are not printed by sacct; refuse them.
        raise ValueError(f"bad duration {text[:40]!r}")
    days, hours, minutes, seconds = m.groups()
    if days is not None and hours is None:  # D-MM:SS is not a Slurm form; D-HH:MM:SS always has hours
        raise ValueError(f"bad duration {text[:40]!r}")
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)


# squeue(1) JOB STATE CODES: the base states; anything else in a state list is a flag (COMPLETING, ...).
BASE_STATES = (
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PENDING",
    "PREEMPTED", "RUNNING", "SUSPENDED", "TIMEOUT", "REQUEUED", "RESIZING", "REVOKED", "STOPPED",
)
_BASE = frozenset(BASE_STATES)


def job_state(value: str | list[str] | None) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(base state, cancelled by, flags) of a job state as sacct prints it (``CANCELLED by 33128806``) or
    slurmrestd gives it (``["RUNNING"]``, ``["CANCELLED", "COMPLETING"]``, ``"RUNNING"`` before v0.0.40)."""
    if value is None:
        return None, None, ()
    items = [value] if isinstance(value, str) else [str(v) for v in value]
    base, by, flags = None, None, []
    for item in items:
        item = item.strip()
        head, _, tail = item.partition(" by ")
        head = head.strip().upper()
        if head in _BASE and base is None:
            base = head
            if tail.strip():
                by = tail.strip()
        elif head:
            flags.append(head)
    if base is None and flags:
        base = flags.pop(0)
    return base, by, tuple(flags)
