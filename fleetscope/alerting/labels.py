"""Label sets, fingerprints and matchers with Alertmanager's exact semantics.

Pure: no I/O. Receivers written for Alertmanager key on the ``fingerprint`` and ``groupKey`` fields, so
both are computed the way Prometheus' ``common/model`` and Alertmanager's dispatcher compute them:

- fingerprint: 64-bit FNV-1a over the label names in byte order, each name and each value followed by
  the separator byte 0xff, printed as 16 lowercase hex digits (``model.LabelSet.Fingerprint``);
- label set string: ``{a="1", b="2"}``, names sorted, values quoted as Go's ``%q`` does;
- matchers: ``=``, ``!=``, ``=~``, ``!~``, regexes anchored at both ends, a missing label reads as ""
  (Alertmanager configuration docs, "<matcher>").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

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


@lru_cache(maxsize=4096)
def _anchored(pattern: str) -> re.Pattern[str]:
    # Alertmanager anchors matcher regexes: "^(?:" + pattern + ")$".
    return re.compile(f"^(?:{pattern})$", re.DOTALL)


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
            try:
                _anchored(self.value)
            except re.error as exc:
                raise ValueError(f"matcher {self.name!r}: bad regex {self.value!r}: {exc}") from None

    def matches(self, labels: LabelSet) -> bool:
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        hit = _anchored(self.value).match(v) is not None
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
