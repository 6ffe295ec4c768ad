"""`Guardrails`: the chain applied to every generation, on the prompt before it is queued
and on the output as it streams.

The chain, in order: content guardrails (`Blocklist`, `PiiScanner`; findings block, or
redact as `[REDACTED_<KIND>]`), then on input only the OPA decision (on the redacted
text). It is compiled once per `GuardrailPolicy` (the policy source is read on every
check, so an admin change applies to the next request; recompiling happens only when
the policy object changes).

Output: `OutputScanner` holds back the last `guardrails.stream_window_chars` characters
of the text, plus any finding that touches the end of what arrived (it may continue), so
a blocked word or PII split across two deltas is still seen whole before any of it is
released. A block ends the generation (finish reason `content_filter`); what was released
before stays released, and it never contains the finding.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

from inferflux.config.policy_schema import re2_error
from inferflux.config.security_settings import GuardrailSettings
from inferflux.errors import ConfigError, ContentFiltered, PolicyDenied, PolicyUnavailable
from inferflux.security.digest import TextDigester
from inferflux.security.guardrails.content import (
    Blocklist,
    ContentGuardrail,
    Finding,
    PiiScanner,
)
from inferflux.security.guardrails.opa import DecisionContext, OpaGuardrail
from inferflux.security.policy import GuardrailPolicy, PolicySource

logger = logging.getLogger(__name__)


class GuardrailEvents(Protocol):
    """What the chain reports (the metrics exporter implements it)."""

    def on_verdict(self, stage: str, seconds: float) -> None: ...

    def on_decision(self, stage: str, rule: str, action: str) -> None: ...


@dataclass(frozen=True, slots=True)
class InputVerdict:
    """An allowed prompt: `text` is what may be queued (redacted when `redacted`)."""

    text: str
    redacted: bool
    decisions: tuple[str, ...]


class OutputBlocked(Exception):
    """The output hit a blocking guardrail; `rule` names which."""

    def __init__(self, rule: str) -> None:
        super().__init__(rule)
        self.rule = rule


@dataclass(frozen=True, slots=True)
class CompiledChain:
    content: tuple[ContentGuardrail, ...]
    opa: OpaGuardrail | None

    @property
    def active(self) -> bool:
        return bool(self.content) or self.opa is not None

    def find(self, text: str) -> list[Finding]:
        findings: list[Finding] = []
        for guardrail in self.content:
            findings += guardrail.find(text)
        return sorted(findings, key=lambda f: f.start)


def invalid_patterns(patterns: Sequence[str]) -> list[str]:
    """The blocklist patterns RE2 cannot run (only a store written before the admin API
    checked them can hold one: the config and the admin API refuse them)."""
    return [pattern for pattern in patterns if re2_error(pattern) is not None]


def usable_patterns(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """`patterns` less those RE2 cannot run, which are logged (at each compile of a
    policy: once per policy change). Skipping them keeps one bad stored pattern from
    refusing every generation (a restart on such a store would otherwise serve nothing);
    `GET /v1/admin/guardrails` lists them as `invalid_blocklist_regex` until fixed."""
    invalid = invalid_patterns(patterns)
    if not invalid:
        return patterns
    logger.error(
        "guardrails.blocklist_regex: %d stored pattern(s) are not valid RE2 and are SKIPPED "
        "until replaced (PUT /v1/admin/guardrails): %s",
        len(invalid),
        ", ".join(repr(p) for p in invalid),
    )
    return tuple(p for p in patterns if p not in invalid)


def redact(text: str, findings: Sequence[Finding]) -> str:
    """`text` with each (disjoint, sorted) redacting finding replaced by its mark."""
    parts: list[str] = []
    position = 0
    for finding in findings:
        if finding.action == "redact" and finding.start >= position:
            parts += [text[position : finding.start], f"[REDACTED_{finding.label}]"]
            position = finding.end
    parts.append(text[position:])
    return "".join(parts)


class Guardrails:
    """The guardrail chain of the current policy, with its metrics."""

    def __init__(
        self,
        source: PolicySource,
        settings: GuardrailSettings,
        digester: TextDigester,
        client: httpx.AsyncClient,
        events: GuardrailEvents | None = None,
    ) -> None:
        self.source = source
        self.settings = settings
        self.digester = digester
        self.client = client
        self.events = events
        self._compiled: tuple[GuardrailPolicy, CompiledChain] | None = None

    def chain(self) -> CompiledChain:
        """The chain of the current policy (compiled on the first use of each policy).
        Raises PolicyUnavailable when the policy holds a pattern RE2 refuses."""
        policy = self.source.current().guardrails
        if self._compiled is None or self._compiled[0] != policy:
            try:
                self._compiled = (policy, self._compile(policy))
            except ConfigError as exc:
                logger.error("the guardrail policy does not compile: %s", exc.message)
                raise PolicyUnavailable("the guardrail policy is invalid; see the logs") from None
        return self._compiled[1]

    def _compile(self, policy: GuardrailPolicy) -> CompiledChain:
        content: list[ContentGuardrail] = []
        patterns = usable_patterns(policy.blocklist_regex)
        if policy.blocklist or patterns:
            content.append(Blocklist(policy.blocklist, patterns))
        if policy.pii_action != "off":
            content.append(PiiScanner(policy.pii_action))
        opa = None
        if policy.opa_endpoint is not None:
            opa = OpaGuardrail(
                policy.opa_endpoint,
                client=self.client,
                timeout_s=self.settings.opa_timeout_s,
                fail_open=policy.opa_fail_open,
                send_text=self.settings.opa_input == "text",
                digester=self.digester,
            )
        return CompiledChain(tuple(content), opa)

    async def check_input(self, text: str, context: DecisionContext) -> InputVerdict:
        """Apply the chain to a prompt. Raises ContentFiltered (400) for a blocking
        finding, PolicyDenied (403) for an OPA deny, PolicyUnavailable (503) when OPA
        cannot decide and fails closed."""
        chain = self.chain()
        started = time.perf_counter()
        try:
            findings = chain.find(text)
            decisions = tuple(dict.fromkeys(f"guardrail:{f.rule}:{f.action}" for f in findings))
            blocking = next((f for f in findings if f.action == "block"), None)
            if blocking is not None:
                self._report("input", blocking.rule, "block")
                raise ContentFiltered(
                    f"the prompt was blocked by the content filter ({blocking.rule})"
                )
            redacted = redact(text, findings) if findings else text
            for finding in findings:
                self._report("input", finding.rule, finding.action)
            if chain.opa is not None:
                outcome = await self._decide(chain.opa, context, redacted)
                decisions += (f"guardrail:opa:{outcome}",)
            return InputVerdict(redacted, bool(findings), decisions)
        finally:
            if self.events is not None:
                self.events.on_verdict("input", time.perf_counter() - started)

    async def _decide(self, opa: OpaGuardrail, context: DecisionContext, text: str) -> str:
        """OPA's decision: `allow` or `fail_open`; raises (and counts) a deny or an outage."""
        try:
            outcome = await opa.decide(context, text) or "allow"
        except PolicyDenied:
            self._report("input", "opa", "deny")
            raise
        except PolicyUnavailable:
            self._report("input", "opa", "unavailable")
            raise
        self._report("input", "opa", outcome)
        return outcome

    def output_scanner(self) -> OutputScanner | None:
        """A scanner for one generation's output, or None when no content guardrail is on."""
        chain = self.chain()
        if not chain.content:
            return None
        return OutputScanner(chain, self.settings.stream_window_chars, self)

    def _report(self, stage: str, rule: str, action: str) -> None:
        if self.events is not None:
            self.events.on_decision(stage, rule, action)

    async def aclose(self) -> None:
        await self.client.aclose()


class OutputScanner:
    """Scans one generation's streamed text (see the module docstring). `feed` each
    delta's text in order; `final=True` with the last one releases everything left."""

    def __init__(self, chain: CompiledChain, window: int, owner: Guardrails) -> None:
        self._chain = chain
        self._window = window
        self._owner = owner
        self._pending = ""
        self.redacted = False
        # True when some finding may be redacted (rather than blocked) from the output
        self.redacts = any(getattr(g, "action", "block") == "redact" for g in chain.content)

    def feed(self, text: str, *, final: bool = False) -> str:
        """The text that may be released now (redacted). Raises OutputBlocked."""
        started = time.perf_counter()
        try:
            self._pending += text
            findings = self._chain.find(self._pending)
            end = len(self._pending)
            for finding in findings:
                if finding.action == "block" and (final or finding.end < end):
                    self._owner._report("output", finding.rule, "block")
                    raise OutputBlocked(finding.rule)
            cut = end if final else max(0, end - self._window)
            for finding in findings:
                if finding.start < cut < finding.end or (not final and finding.end >= end):
                    cut = min(cut, finding.start)
            released = [f for f in findings if f.end <= cut]
            out = redact(self._pending[:cut], released)
            for finding in released:
                self.redacted = True
                self._owner._report("output", finding.rule, finding.action)
            self._pending = self._pending[cut:]
            return out
        finally:
            events = self._owner.events
            if events is not None:
                events.on_verdict("output", time.perf_counter() - started)
