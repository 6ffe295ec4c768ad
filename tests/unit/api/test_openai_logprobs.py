"""Logprob alignment and the two OpenAI logprob shapes, over hand-made RequestDeltas."""

from __future__ import annotations

import math

import pytest

from inferflux.api.generation.logprobs import LogprobAligner, TokenTexts, prompt_entries
from inferflux.api.openai.logprobs import CompletionLogprobs, chat_logprobs
from inferflux.engine.messages import FinishReason, RequestDelta, TokenLogprob
from inferflux.errors import EngineError
from tests.fakes.engine import FakePieceTokenizer

# id → bytes: "Hel", "lo", " wor", "ld", ".", "\xe2\x82" + "\xac" (the euro sign, split)
PIECES = {10: b"Hel", 11: b"lo", 12: b" wor", 13: b"ld", 14: b".", 15: b"\xe2\x82", 16: b"\xac"}
EOS = 2


def texts() -> TokenTexts:
    return TokenTexts(FakePieceTokenizer(PIECES))


def lp(token_id: int, logprob: float = -0.5) -> TokenLogprob:
    """The token, then one alternative two nats less likely ("lo", or "Hel" for "lo")."""
    other = 11 if token_id != 11 else 10
    return TokenLogprob(token_id, logprob, [(token_id, logprob), (other, logprob - 2)])


def delta(
    text: str, token_ids: list[int], finish: FinishReason | None = None, **kw: object
) -> RequestDelta:
    return RequestDelta(
        request_id="r",
        text=text,
        token_ids=token_ids,
        finish_reason=finish,
        logprobs=[lp(t) for t in token_ids],
        **kw,  # type: ignore[arg-type]
    )


def tokens_of(entries: list) -> list[str]:
    return [e.token.text for e in entries]


def test_entries_follow_text_and_the_end_token_is_dropped() -> None:
    aligner = LogprobAligner(texts(), enabled=True)
    assert tokens_of(aligner.push(delta("Hel", [10]))) == ["Hel"]
    assert tokens_of(aligner.push(delta("lo", [11]))) == ["lo"]
    assert tokens_of(aligner.push(delta("", [EOS], FinishReason.STOP))) == []


def test_held_back_text_holds_its_entry_until_released() -> None:
    aligner = LogprobAligner(texts(), enabled=True)
    assert tokens_of(aligner.push(delta("Hel", [10, 11]))) == ["Hel"]  # "lo" held back
    assert tokens_of(aligner.push(delta("lo wor", [12]))) == ["lo", " wor"]
    assert tokens_of(aligner.push(delta("ld", [13], FinishReason.LENGTH))) == ["ld"]


def test_a_split_character_is_released_with_its_last_byte() -> None:
    aligner = LogprobAligner(texts(), enabled=True)
    assert aligner.push(delta("", [15])) == []
    entries = aligner.push(delta("€", [16]))
    assert tokens_of(entries) == ["\ufffd", "\ufffd"]  # each half alone is not valid UTF-8
    assert [e.token.raw for e in entries] == [b"\xe2\x82", b"\xac"]


def test_stop_string_tokens_are_dropped_unless_partly_shown() -> None:
    # stop " wo": " wor" is only stop text → dropped
    aligner = LogprobAligner(texts(), enabled=True)
    assert tokens_of(aligner.push(delta("Hel", [10]))) == ["Hel"]
    assert tokens_of(aligner.push(delta("lo", [11, 12], FinishReason.STOP_SEQUENCE))) == ["lo"]
    # stop "o": "lo" was half shown ("l") → kept
    aligner = LogprobAligner(texts(), enabled=True)
    aligner.push(delta("Hel", [10]))
    assert tokens_of(aligner.push(delta("l", [11], FinishReason.STOP_SEQUENCE))) == ["lo"]


def test_length_finish_flushes_whatever_is_held() -> None:
    aligner = LogprobAligner(texts(), enabled=True)
    assert aligner.push(delta("", [10, 11])) == []
    assert tokens_of(aligner.push(delta("Hello", [], FinishReason.LENGTH))) == ["Hel", "lo"]


def test_disabled_aligner_ignores_deltas_without_logprobs() -> None:
    aligner = LogprobAligner(texts(), enabled=False)
    assert aligner.push(RequestDelta(request_id="r", text="Hel", token_ids=[10])) == []


@pytest.mark.parametrize("logprobs", [None, [lp(10)]])
def test_missing_or_misaligned_logprobs_are_an_engine_error(logprobs: object) -> None:
    aligner = LogprobAligner(texts(), enabled=True)
    bad = RequestDelta(request_id="r", text="Hello", token_ids=[10, 11], logprobs=logprobs)  # type: ignore[arg-type]
    with pytest.raises(EngineError):
        aligner.push(bad)


def test_chat_shape() -> None:
    aligner = LogprobAligner(texts(), enabled=True)
    entries = aligner.push(delta("Hel", [10]))
    assert chat_logprobs(entries) == {
        "content": [
            {
                "token": "Hel",
                "logprob": -0.5,
                "bytes": [72, 101, 108],
                "top_logprobs": [
                    {"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108]},
                    {"token": "lo", "logprob": -2.5, "bytes": [108, 111]},
                ],
            }
        ],
        "refusal": None,
    }


def test_infinite_logprobs_become_minus_9999() -> None:
    entry = texts().entry(TokenLogprob(10, -math.inf, [(11, -math.inf)]))
    assert entry.logprob == -9999.0 and entry.top == ((texts()(11), -9999.0),)


def test_completion_shape_offsets_carry_across_chunks() -> None:
    aligner = LogprobAligner(texts(), enabled=True)
    render = CompletionLogprobs()
    first = render.render(aligner.push(delta("Hello", [10, 11])))
    second = render.render(aligner.push(delta(" wor", [12])))
    assert first == {
        "tokens": ["Hel", "lo"],
        "token_logprobs": [-0.5, -0.5],
        "top_logprobs": [{"Hel": -0.5, "lo": -2.5}, {"lo": -0.5, "Hel": -2.5}],
        "text_offset": [0, 3],
    }
    assert second["text_offset"] == [5]


def test_completion_top_dict_always_holds_the_sampled_token() -> None:
    entry = texts().entry(TokenLogprob(12, -3.0, [(10, -0.1)]))  # sampled is not in the top 1
    rendered = CompletionLogprobs().render([entry])
    assert rendered["top_logprobs"] == [{"Hel": -0.1, " wor": -3.0}]


def test_prompt_entries_first_is_null() -> None:
    first = RequestDelta(request_id="r", prompt_logprobs=[None, lp(11), lp(12)])
    entries = prompt_entries(texts(), [10, 11, 12], first)
    rendered = CompletionLogprobs().render(entries)
    assert rendered["tokens"] == ["Hel", "lo", " wor"]
    assert rendered["token_logprobs"] == [None, -0.5, -0.5]
    assert rendered["top_logprobs"][0] is None
    assert rendered["text_offset"] == [0, 3, 5]


def test_prompt_entries_missing_is_an_engine_error() -> None:
    with pytest.raises(EngineError):
        prompt_entries(texts(), [10, 11], RequestDelta(request_id="r"))
