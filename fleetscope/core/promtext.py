"""The Prometheus text exposition format (version 0.0.4): one exact line lexer and its pieces, shared by
every reader of Prometheus text (dcgm-exporter bodies, the NCCL Inspector's textfile, node_exporter's
InfiniBand series, inference servers' /metrics).

Format: https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format — metric and label
names, label values with exactly three escapes (backslash, double quote and newline), a value as Go's
``strconv.ParseFloat`` reads it, an optional integer timestamp in milliseconds.
"""

from __future__ import annotations

import re

from fleetscope.core.errors import ParseError

# Prometheus text format: label value escapes are \\, \" and \n only, and a line feed is written escaped
# (a raw one ends the line).
VALUE_RE = r'(?:[^"\\\n]|\\[\\"n])*'
LABEL_RE = rf'[a-zA-Z_][a-zA-Z0-9_]*="{VALUE_RE}"'
BLOCK_OK = rf"^(?:{LABEL_RE}(?:,{LABEL_RE})*,?)?$"
NAME_OK = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
# One name="value" pair of an already well-formed block (values still escaped).
LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
NAME_PY = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LNAME_PY = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def label_map(labels: list[tuple[str, str]], *, name: str, source: str, line: int) -> dict[str, str]:
    """``labels`` as a mapping; a label written twice in one sample is an error, as Prometheus has it."""
    out: dict[str, str] = {}
    for k, v in labels:
        if k in out:
            raise ParseError(f"label {k!r} repeated in {name}", source=source, line=line, field=k)
        out[k] = v
    return out


def lex_line(text: str, n: int, source: str) -> tuple[int, str, list[tuple[str, str]], float, int | None] | None:
    """One line of the text exposition format, exactly: ``(line, name, [(label, value)...], value, ts_ms)``,
    or None for a blank or comment line. Label values come back unescaped, in the order written (a repeated
    label is kept twice: callers that need a mapping use ``label_map``). ``ParseError`` names the line and
    the label or field at fault."""
    s = text.rstrip("\r")
    i, end = 0, len(s)
    while i < end and s[i] in " \t":
        i += 1
    if i == end or s[i] == "#":
        return None
    m = NAME_PY.match(s, i)
    if not m:
        raise ParseError("expected a metric name", source=source, line=n, field="name")
    name = m.group()
    i = m.end()
    labels: list[tuple[str, str]] = []
    if i < end and s[i] == "{":
        i += 1
        while True:
            while i < end and s[i] in " \t":
                i += 1
            if i < end and s[i] == "}":
                i += 1
                break
            lm = LNAME_PY.match(s, i)
            if not lm:
                raise ParseError(f"expected a label name in {name}", source=source, line=n, field="labels")
            lname = lm.group()
            i = lm.end()
            while i < end and s[i] in " \t":
                i += 1
            if i >= end or s[i] != "=":
                raise ParseError(f"expected '=' after label {lname}", source=source, line=n, field=lname)
            i += 1
            while i < end and s[i] in " \t":
                i += 1
            if i >= end or s[i] != '"':
                raise ParseError(f"expected '\"' to open label {lname}", source=source, line=n, field=lname)
            i += 1
            buf = []
            while True:
                if i >= end:
                    raise ParseError(f"unterminated value of label {lname}", source=source, line=n, field=lname)
                c = s[i]
                if c == "\\":
                    nxt = s[i + 1] if i + 1 < end else ""
                    if nxt == "n":
                        buf.append("\n")
                    elif nxt in ('"', "\\"):
                        buf.append(nxt)
                    else:
                        raise ParseError(f"invalid escape in label {lname}", source=source, line=n, field=lname)
                    i += 2
                elif c == '"':
                    i += 1
                    break
                else:
                    buf.append(c)
                    i += 1
            labels.append((lname, "".join(buf)))
            while i < end and s[i] in " \t":
                i += 1
            if i < end and s[i] == ",":
                i += 1
            elif i < end and s[i] == "}":
                i += 1
                break
            else:
                raise ParseError(f"expected ',' or '}}' after label {lname}", source=source, line=n, field="labels")
    tokens = s[i:].split()
    if i < end and s[i] not in " \t":
        raise ParseError(f"expected a blank after {name}", source=source, line=n, field="value")
    if not tokens:
        raise ParseError(f"{name} has no value", source=source, line=n, field="value")
    value = go_float(tokens[0])
    if value is None:
        raise ParseError(f"value {tokens[0][:40]!r} of {name} is not a number", source=source, line=n, field="value")
    if len(tokens) > 2:
        raise ParseError(f"unexpected text after the timestamp of {name}", source=source, line=n, field="timestamp")
    ts_ms = None
    if len(tokens) == 2:
        try:
            ts_ms = int(tokens[1])
        except ValueError:
            raise ParseError(
                f"timestamp {tokens[1][:40]!r} of {name} is not integer milliseconds", source=source, line=n, field="timestamp"
            ) from None
    return (n, name, labels, value, ts_ms)


def go_float(tok: str) -> float | None:
    """Go's strconv.ParseFloat as the text format requires (NaN, +Inf, -Inf, exponents; no '_' or hex)."""
    if "_" in tok or "x" in tok.lower():
        return None
    try:
        return float(tok)
    except ValueError:
        return None


def escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)
