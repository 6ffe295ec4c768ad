"""Content guardrails (RE2 blocklist, PII with Luhn and mod 97), redaction, and the output
scanner that must catch a finding however the stream splits it."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferflux.api.admin.protocol import guardrails_view
from inferflux.config.auth_settings import AuthSettings
from inferflux.config.security_settings import GuardrailSettings
from inferflux.errors import ConfigError, ContentFiltered
from inferflux.security.api_keys import KeyDigester
from inferflux.security.digest import TextDigester
from inferflux.security.guardrails import Blocklist, OutputBlocked, PiiScanner, iban_ok, luhn_ok
from inferflux.security.guardrails.chain import CompiledChain, Guardrails, OutputScanner, redact
from inferflux.security.guardrails.opa import DecisionContext
from inferflux.security.live_policy import build_live_policy
from inferflux.security.policy import GuardrailPolicy, Policy, StaticPolicySource
from inferflux.security.policy_store import PolicyStore
from inferflux.security.principal import ANONYMOUS
from inferflux.security.rbac import roles_table


def test_blocklist_matches_whole_words_case_insensitively_in_any_script():
    blocklist = Blocklist(("secret plan", "élan"), ())
    assert [f.rule for f in blocklist.find("The SECRET  plan? no: the Secret plan.")] == [
        "blocklist"
    ]
    assert blocklist.find("a secret planet") == []
    assert len(blocklist.find("avec Élan!")) == 1
    assert blocklist.find("xélan") == []


def test_blocklist_regex_is_re2_and_refuses_backtracking_constructs():
    blocklist = Blocklist((), (r"\bpass(word)?\s*[:=]",))
    assert blocklist.find("my password: hunter2")[0].rule == "blocklist_regex"
    with pytest.raises(ConfigError):
        Blocklist((), (r"(a)\1",))
    # a pattern that is catastrophic for backtracking engines runs in linear time
    Blocklist((), (r"(a+)+$",)).find("a" * 50_000 + "b")


@pytest.mark.parametrize(
    ("number", "ok"),
    [("4111111111111111", True), ("4111111111111112", False), ("378282246310005", True)],
)
def test_luhn(number, ok):
    assert luhn_ok(number) is ok


@pytest.mark.parametrize(
    ("iban", "ok"),
    [
        ("GB82WEST12345698765432", True),
        ("GB82WEST12345698765433", False),
        ("DE89370400440532013000", True),
    ],
)
def test_iban_mod97(iban, ok):
    assert iban_ok(iban) is ok


def test_pii_kinds_and_validation():
    scanner = PiiScanner("redact")
    text = (
        "mail jane.doe@example.co.uk, card 4111 1111 1111 1111, bad card 4111 1111 1111 1112, "
        "iban GB82 WEST 1234 5698 7654 32, call +1 555-123-4567 on 2024-01-15"
    )
    rules = [f.rule for f in scanner.find(text)]
    assert rules == ["pii:email", "pii:card", "pii:iban", "pii:phone"]
    redacted = redact(text, scanner.find(text))
    assert "jane.doe" not in redacted and "[REDACTED_EMAIL]" in redacted
    assert "[REDACTED_CARD]" in redacted and "4111 1111 1111 1112" in redacted
    assert "2024-01-15" in redacted


def _scan_in_pieces(scanner: OutputScanner, pieces: list[str]) -> str:
    released = []
    for i, piece in enumerate(pieces):
        released.append(scanner.feed(piece, final=i == len(pieces) - 1))
    return "".join(released)


def _guardrails(policy: GuardrailPolicy) -> Guardrails:
    return Guardrails(
        StaticPolicySource(Policy(guardrails=policy)),
        GuardrailSettings(stream_window_chars=32),
        TextDigester(b"k" * 32),
        httpx.AsyncClient(),
    )


def _splits(text: str) -> st.SearchStrategy[list[str]]:
    cuts = st.lists(st.integers(0, len(text)), max_size=8).map(sorted)
    return cuts.map(lambda c: [text[a:b] for a, b in zip([0, *c], [*c, len(text)], strict=True)])


SENTENCE = "Here is the plan: do not reveal the launch codes to anyone today."


@given(_splits(SENTENCE))
def test_a_blocked_phrase_is_caught_however_the_stream_splits_it(pieces):
    guardrails = _guardrails(GuardrailPolicy(blocklist=("launch codes",)))
    scanner = guardrails.output_scanner()
    assert scanner is not None
    released = []
    with pytest.raises(OutputBlocked):
        for i, piece in enumerate(pieces):
            released.append(scanner.feed(piece, final=i == len(pieces) - 1))
    assert "launch" not in "".join(released)


EMAIL_TEXT = "Write to alice.smith@example.com for the details, or call later."


@given(_splits(EMAIL_TEXT))
def test_pii_split_across_deltas_is_redacted_and_the_rest_released(pieces):
    guardrails = _guardrails(GuardrailPolicy(pii_action="redact"))
    scanner = guardrails.output_scanner()
    assert scanner is not None and scanner.redacts
    out = _scan_in_pieces(scanner, pieces)
    assert out == EMAIL_TEXT.replace("alice.smith@example.com", "[REDACTED_EMAIL]")


def test_a_word_at_the_end_waits_for_the_next_delta():
    guardrails = _guardrails(GuardrailPolicy(blocklist=("foo",)))
    scanner = guardrails.output_scanner()
    assert scanner is not None
    # "foo" ends the text so far: it may become "foobar", so no verdict yet (and held)
    assert scanner.feed("x" * 40 + " foo") == "x" * 12
    assert scanner.feed("bar and more", final=True) == "x" * 28 + " foobar and more"
    scanner = guardrails.output_scanner()
    assert scanner is not None
    scanner.feed("x" * 40 + " foo")
    with pytest.raises(OutputBlocked):
        scanner.feed(" and more")


def test_without_content_rules_there_is_no_output_scanner():
    assert _guardrails(GuardrailPolicy()).output_scanner() is None
    assert not CompiledChain((), None).active


async def test_input_verdicts_block_or_redact():
    guardrails = _guardrails(GuardrailPolicy(blocklist=("forbidden",), pii_action="redact"))
    context = DecisionContext(ANONYMOUS, "m", "/v1/chat/completions")
    with pytest.raises(ContentFiltered):
        await guardrails.check_input("a forbidden word", context)
    verdict = await guardrails.check_input("mail bob@example.org now", context)
    assert verdict.redacted and verdict.text == "mail [REDACTED_EMAIL] now"
    assert verdict.decisions == ("guardrail:pii:email:redact",)
    await guardrails.aclose()


async def test_a_stored_pattern_re2_cannot_run_is_skipped_not_fatal(tmp_path, caplog):
    """Only a store written before the admin API checked patterns can hold one. Loading it
    (a restart) works, the pattern is skipped and logged, the other guardrails apply."""
    store = PolicyStore(tmp_path / "policy.enc", "a passphrase, long enough", log2_n=14)
    patterns = ("(a)\\1", r"secret\d+")
    store.save(Policy(guardrails=GuardrailPolicy(blocklist_regex=patterns)))
    auth = AuthSettings()
    live = build_live_policy(auth, Policy(), KeyDigester(None), roles_table(auth.roles), store)
    guardrails = Guardrails(live, GuardrailSettings(), TextDigester(b"k" * 32), httpx.AsyncClient())
    context = DecisionContext(ANONYMOUS, "m", "/")
    assert (await guardrails.check_input("nothing to see", context)).text == "nothing to see"
    with pytest.raises(ContentFiltered):
        await guardrails.check_input("the secret42 is out", context)
    assert "'(a)" in caplog.text and "SKIPPED" in caplog.text
    view = guardrails_view(live.current().guardrails)
    assert view["invalid_blocklist_regex"] == ["(a)\\1"]
    await guardrails.aclose()
