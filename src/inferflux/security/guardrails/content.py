"""Content guardrails: find what must not pass in a text. `Blocklist` (words and RE2
patterns → block) and `PiiScanner` (emails, phone numbers, card numbers that pass Luhn,
IBANs that pass mod 97 → redact or block).

Every pattern runs on RE2 (google-re2): matching is linear in the text, so no pattern,
however written, can backtrack catastrophically; RE2 refuses backreferences and
lookaround at compile time. Patterns are compiled once per policy (`chain.py` caches the
compiled chain per `GuardrailPolicy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import re2

from inferflux.errors import ConfigError

Action = Literal["block", "redact"]
_MAX_MEM = 64 << 20  # RE2's memory budget per compiled pattern


@dataclass(frozen=True, slots=True)
class Finding:
    """`text[start:end]` must not pass: `rule` names why (`blocklist`, `pii:email`)."""

    start: int
    end: int
    rule: str
    action: Action
    label: str = ""  # the redaction mark, e.g. EMAIL


class ContentGuardrail(Protocol):
    """Scans text; pure and synchronous (input and streamed output alike)."""

    name: str

    def find(self, text: str) -> list[Finding]:
        """Every finding in `text`, in order of `start`, not overlapping."""
        ...


def compile_re2(pattern: str, *, what: str) -> re2._Regexp:
    """Compile with RE2, quietly; an invalid pattern raises ConfigError naming `what`."""
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ConfigError(f"{what}: {pattern!r} is not valid RE2: {reason}") from None


_NOT_WORD = r"[^\pL\pN_]"


class Blocklist:
    """Whole words (case-insensitive; Unicode letters, not only ASCII) and patterns."""

    name = "blocklist"

    def __init__(self, words: tuple[str, ...], patterns: tuple[str, ...]) -> None:
        self._words = None
        if words:
            alternatives = "|".join(re2.escape(w.strip()) for w in words)
            self._words = compile_re2(
                f"(?i)(?:^|{_NOT_WORD})({alternatives})(?:{_NOT_WORD}|$)",
                what="guardrails.blocklist",
            )
        self._patterns = [compile_re2(p, what="guardrails.blocklist_regex") for p in patterns]

    def find(self, text: str) -> list[Finding]:
        findings = []
        if self._words is not None:
            findings += [
                Finding(m.start(1), m.end(1), "blocklist", "block")
                for m in self._words.finditer(text)
            ]
        for pattern in self._patterns:
            findings += [
                Finding(m.start(), m.end(), "blocklist_regex", "block")
                for m in pattern.finditer(text)
                if m.end() > m.start()
            ]
        return _disjoint(findings)


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum of a card number (digits only)."""
    total = 0
    for i, char in enumerate(reversed(digits)):
        n = int(char)
        if i % 2 == 1:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def iban_ok(iban: str) -> bool:
    """ISO 13616 mod-97 check (spaces removed, upper case)."""
    if not 15 <= len(iban) <= 34:
        return False
    moved = iban[4:] + iban[:4]
    number = "".join(str(int(c, 36)) for c in moved)
    return int(number) % 97 == 1


_PII_PATTERNS: tuple[tuple[str, str], ...] = (
    ("email", r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
    ("iban", r"\b[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}\b"),
    ("card", r"\b(?:[0-9][ -]?){12,18}[0-9]\b"),
    (
        "phone",
        r"(?:\+[0-9]{1,3}[ .-]?)?(?:\([0-9]{2,4}\)|[0-9]{2,4})[ .-][0-9]{3,4}[ .-][0-9]{3,4}\b"
        r"|\+[0-9]{8,15}\b",
    ),
)


class PiiScanner:
    """Emails, IBANs (mod 97), card numbers (13-19 digits, Luhn) and phone numbers."""

    name = "pii"

    def __init__(self, action: Action) -> None:
        self.action = action
        self._patterns = [(kind, compile_re2(p, what="pii")) for kind, p in _PII_PATTERNS]

    def find(self, text: str) -> list[Finding]:
        findings = []
        for kind, pattern in self._patterns:
            for match in pattern.finditer(text):
                if _valid(kind, match.group()) and not _inside_number(text, match):
                    label = kind.upper()
                    findings.append(
                        Finding(match.start(), match.end(), f"pii:{kind}", self.action, label)
                    )
        return _disjoint(findings)


def _valid(kind: str, found: str) -> bool:
    if kind == "card":
        digits = "".join(c for c in found if c.isdigit())
        return 13 <= len(digits) <= 19 and luhn_ok(digits)
    if kind == "iban":
        return iban_ok(found.replace(" ", ""))
    return True


def _inside_number(text: str, match: object) -> bool:
    """A match that continues a longer run of digit groups (`4111 1111 1111 1112`
    read as a phone number) is part of some other number."""
    start, end = match.start(), match.end()  # type: ignore[attr-defined]
    after = text[end : end + 2]
    before = text[max(0, start - 2) : start]
    continues = after[:1].isdigit() or (after[:1] in " .-" and after[1:2].isdigit())
    precedes = before[-1:].isdigit() or (before[-1:] in " .-" and before[:1].isdigit())
    return continues or precedes


def _disjoint(findings: list[Finding]) -> list[Finding]:
    """Sorted by start; a finding overlapping an earlier (or longer, same-start) one is
    dropped."""
    kept: list[Finding] = []
    for finding in sorted(findings, key=lambda f: (f.start, -(f.end - f.start))):
        if not kept or finding.start >= kept[-1].end:
            kept.append(finding)
    return kept
