"""Input hygiene shared by the line-oriented parsers in ``ingest/``: size limits, NUL bytes, UTF-8, and
JSON lines that must be objects. Pure (no I/O), so parsers may import it; each error names the source and
the first bad line.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fleetscope.core.errors import ParseError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a C0 control character or DEL: what a name, a binding or a source an operator types
    never holds. A NUL is no text to PostgreSQL (a 500 there, stored as given on SQLite), and an escape sequence
    stored would be echoed to whoever lists it in a terminal."""
    return _CONTROL.search(text) is not None


# Most gzip members one input may hold. Collectors and the profiler write one; concatenated files a few.
# Each member restarts the inflater on the rest of the input, so without a bound a body of thousands of
# empty 20-byte members costs CPU quadratic in its size.
MAX_GZIP_MEMBERS = 64


def input_lines(data: bytes, source: str, *, max_input_bytes: int, max_line_bytes: int, strip: bool = True) -> list[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers. ``strip`` trims each line; without it only a leading
    byte-order mark goes (log parsers keep indentation, which carries meaning in some formats)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_input_bytes:
        raise ParseError(f"input of {len(data)} bytes exceeds {max_input_bytes}", source=source)
    out = []
    for lineno, chunk in enumerate(data.split(b"\n"), start=1):
        if len(chunk) > max_line_bytes:
            raise ParseError(f"line longer than {max_line_bytes} bytes", source=source, line=lineno)
        if b"\x00" in chunk:
            raise ParseError("binary data (NUL byte)", source=source, line=lineno)
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError:
            raise ParseError("line is not UTF-8 text", source=source, line=lineno) from None
        if strip:
            text = text.lstrip("\ufeff").strip()
            if text:
                out.append((lineno, text))
        elif text.strip():
            out.append((lineno, text.lstrip("\ufeff")))
    if not out:
        raise ParseError("empty input", source=source)
    return out


def unterminated_line(data: bytes) -> int | None:
    """The number of the last line when it is not blank and has no line feed (a record that may have been
    cut in transit), else None."""
    end = data.rfind(b"\n") + 1
    return data.count(b"\n") + 1 if bytes(data[end:]).strip() else None


def require_final_newline(data: bytes, source: str) -> None:
    """Refuse a body whose last line has no line feed: it was cut in transit (a dropped connection, a
    size limit, a partly written file), and what remains of it can still parse as a different value
    (``} 22563`` cut to ``} 225``). The Prometheus text exposition format 0.0.4 requires it: "Lines are
    separated by a line feed character (\n). The last line must end with a line feed character."
    (https://prometheus.io/docs/instrumenting/exposition_formats/). Blanks after the last line feed
    carry no value and are not a cut line. The error names the line and shows its end."""
    line = unterminated_line(data)
    if line is None:
        return
    shown = bytes(data[data.rfind(b"\n") + 1 :][-40:]).decode("utf-8", "replace")
    raise ParseError(f"the last line ends without a line feed (…{shown!r}): the input was cut mid-line, and its value may be "
                     "wrong, so nothing is stored; a complete file needs its final newline", source=source, line=line, field="line")


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not JSON")


def json_object(text: str, source: str, line: int, *, unterminated: bool = False) -> dict[str, Any]:
    """One JSON Lines record, which must be an object; NaN/Infinity literals are refused (RFC 8259 has none).
    ``unterminated``: the input's last line, without its line feed (``unterminated_line``); if it does not
    parse it is a record cut short, and said to be. Whole, it is read: JSON Lines asks for the line feed
    (https://jsonlines.org/) but a cut object cannot still parse as one."""
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        if unterminated:
            what = f"truncated JSON line: the last line ends without a line feed and is not whole JSON ({e.msg}); nothing is stored"
        else:
            what = "truncated JSON line" if e.pos >= len(text) - 1 else f"malformed JSON ({e.msg})"
        raise ParseError(what, source=source, line=line) from None
    except ValueError as e:  # NaN/Infinity literals, integers with thousands of digits
        raise ParseError(f"malformed JSON ({e})", source=source, line=line) from None
    except RecursionError:  # arrays or objects nested past the interpreter's stack (~1,000 levels)
        raise ParseError("malformed JSON: nested too deeply", source=source, line=line) from None
    if not isinstance(obj, dict):
        raise ParseError("line is not a JSON object", source=source, line=line)
    return obj
