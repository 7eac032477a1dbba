"""Label sets, fingerprints and matchers with Alertmanager's exact semantics.

Pure: no I/O. Receivers written for Alertmanager key on the ``fingerprint`` and ``groupKey`` fields, so
both are computed the way Prometheus' ``common/model`` and Alertmanager's dispatcher compute them:

- fingerprint: 64-bit FNV-1a over the label names in byte order, each name and each value followed by
  the separator byte 0xff, printed as 16 lowercase hex digits (``model.LabelSet.Fingerprint``);
- label set string: ``{a="1", b="2"}``, names sorted, values quoted as Go's ``%q`` does;
- matchers: ``=``, ``!=``, ``=~``, ``!~``, regexes anchored at both ends, a missing label reads as ""
  (Alertmanager configuration docs, "<matcher>").

Matcher regexes are RE2, the syntax and semantics of Go's ``regexp`` that Alertmanager uses (RE2 wiki,
"Syntax"): matching takes time linear in the value's length, so no pattern can make a worker backtrack
for ever (``(a+)+$`` against a long run of ``a`` is the classic case). Patterns RE2 does not accept
(backreferences, lookaround) are refused when the matcher is made, naming it. ``.`` matches a newline
too, as Fleetscope's matchers always have. A pattern is at most ``MAX_PATTERN_CHARS`` long, and a label
value longer than ``MAX_VALUE_CHARS`` is not matched by any regex (``=~`` false, ``!~`` true).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import re2

_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_MASK = 0xFFFFFFFFFFFFFFFF
_SEP = 0xFF

LabelSet = Mapping[str, str]


def fingerprint_int(labels: LabelSet) -> int:
    """``model.LabelSet.Fingerprint()``: FNV-1a 64 over sorted names and values, 0xff after each."""
    h = _FNV_OFFSET
    for name in sorted(labels, key=lambda n: n.encode()):
        for part in (name, labels[name]):
            for b in part.encode():
                h = ((h ^ b) * _FNV_PRIME) & _MASK
            h = ((h ^ _SEP) * _FNV_PRIME) & _MASK
    return h


def fingerprint(labels: LabelSet) -> str:
    """The fingerprint as Alertmanager prints it in webhook payloads and its API: ``%016x``."""
    return _fingerprint_cached(tuple(sorted(labels.items())))


@lru_cache(maxsize=65536)
def _fingerprint_cached(items: tuple[tuple[str, str], ...]) -> str:
    # The same alerts come back at every evaluation; FNV over bytes in Python is the costly part.
    return f"{fingerprint_int(dict(items)):016x}"


def go_quote(value: str) -> str:
    """Go's ``%q`` for the printable text labels carry: backslash, quote and control characters escaped."""
    out = ['"']
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def labelset_string(labels: LabelSet) -> str:
    """``model.LabelSet.String()``: ``{a="1", b="2"}`` (used inside Alertmanager's groupKey)."""
    return "{" + ", ".join(f"{k}={go_quote(labels[k])}" for k in sorted(labels)) + "}"


_MATCHER_RE = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|([^\s"]*))\s*$')


MAX_PATTERN_CHARS = 4096
MAX_VALUE_CHARS = 131072
_RE2_MAX_MEM_BYTES = 8 << 20  # RE2's own default, stated: a pattern whose program needs more is refused


def _re2_options() -> re2.Options:
    o = re2.Options()
    o.dot_nl = True
    o.log_errors = False  # a refused pattern is reported to the caller, not printed on stderr
    o.max_mem = _RE2_MAX_MEM_BYTES
    return o


_OPTIONS = _re2_options()


@lru_cache(maxsize=4096)
def _anchored(pattern: str) -> re2._Regexp:
    # Alertmanager anchors matcher regexes ("^(?:" + pattern + ")$"); ``fullmatch`` on the pattern compiled
    # alone anchors the same way, and a pattern such as "a)|(b" that would escape the wrapping by
    # closing its group does not compile alone.
    return re2.compile(pattern, _OPTIONS)


def _re2_reason(exc: Exception) -> str:
    raw = exc.args[0] if exc.args else exc
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


@dataclass(frozen=True)
class Matcher:
    """One label matcher: ``name op value`` (Alertmanager's ``<matcher>``)."""

    name: str
    op: str
    value: str

    def __post_init__(self) -> None:
        if self.op not in ("=", "!=", "=~", "!~"):
            raise ValueError(f"matcher {self.name!r}: unknown operator {self.op!r} (expected =, !=, =~ or !~)")
        if self.op in ("=~", "!~"):
            if len(self.value) > MAX_PATTERN_CHARS:
                raise ValueError(f"matcher {self.name!r}: the regex is {len(self.value)} characters, over the {MAX_PATTERN_CHARS}-character limit")
            try:
                _anchored(self.value)
            except re2.error as exc:
                raise ValueError(f"matcher {self.name!r}: {self.value!r} is not an RE2 regex (Alertmanager's syntax: no backreferences "
                                 f"or lookaround): {_re2_reason(exc)}") from None

    def matches(self, labels: LabelSet) -> bool:
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        hit = len(v) <= MAX_VALUE_CHARS and _anchored(self.value).fullmatch(v) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f"{self.name}{self.op}{go_quote(self.value)}"

    def to_dict(self) -> dict[str, object]:
        """The API v2 shape: ``{"name", "value", "isRegex", "isEqual"}``."""
        return {"name": self.name, "value": self.value, "isRegex": self.op in ("=~", "!~"), "isEqual": self.op in ("=", "=~")}

    @classmethod
    def parse(cls, text: str) -> Matcher:
        """``severity="critical"``, ``host=~"gpu-.*"``, ``env!=prod`` (quotes optional for simple values)."""
        m = _MATCHER_RE.match(text)
        if not m:
            raise ValueError(f"cannot parse matcher {text!r}: expected name=\"value\" with =, !=, =~ or !~")
        raw = m.group(3) if m.group(3) is not None else m.group(4)
        value = re.sub(r"\\(.)", lambda g: {"n": "\n", "t": "\t"}.get(g.group(1), g.group(1)), raw)
        return cls(m.group(1), m.group(2), value)

    @classmethod
    def from_any(cls, obj: object) -> Matcher:
        """A matcher from its text form or an API v2 object."""
        if isinstance(obj, Matcher):
            return obj
        if isinstance(obj, str):
            return cls.parse(obj)
        if isinstance(obj, Mapping) and "name" in obj and "value" in obj:
            regex, equal = bool(obj.get("isRegex", False)), bool(obj.get("isEqual", True))
            op = {(False, True): "=", (False, False): "!=", (True, True): "=~", (True, False): "!~"}[(regex, equal)]
            return cls(str(obj["name"]), op, str(obj["value"]))
        raise ValueError(f"cannot read a matcher from {obj!r}")


def matches_all(matchers: Iterable[Matcher], labels: LabelSet) -> bool:
    return all(m.matches(labels) for m in matchers)


def matchers_string(matchers: Iterable[Matcher]) -> str:
    """``{a="1",b=~"x"}``: how Alertmanager prints a route's matchers inside its route key."""
    return "{" + ",".join(str(m) for m in matchers) + "}"
