"""PII redaction of a prompt with images (GuardedEngine, fake tokenizer: one token per
byte): the text between images is redacted on its own and each image moves to where its
text now ends, so an image never lands inside re-tokenized text."""

from __future__ import annotations

import httpx

from inferflux.api.guarded_engine import GuardedEngine
from inferflux.config.security_settings import GuardrailSettings
from inferflux.engine.messages import AddRequest, ImageInput, SamplingParams
from inferflux.security.digest import TextDigester
from inferflux.security.guardrails.chain import Guardrails
from inferflux.security.policy import GuardrailPolicy, Policy, StaticPolicySource
from tests.fakes.engine import FakeEngineClient, FakeTokenizer


async def test_redaction_keeps_images_between_their_texts():
    tokenizer = FakeTokenizer()
    source = StaticPolicySource(Policy(guardrails=GuardrailPolicy(pii_action="redact")))
    async with httpx.AsyncClient() as client:
        guardrails = Guardrails(source, GuardrailSettings(), TextDigester(b"k" * 32), client)
        engine = GuardedEngine(
            FakeEngineClient(),  # type: ignore[arg-type]
            tokenizer=tokenizer,
            model="m",
            source=source,
            limits=None,
            guardrails=guardrails,
        )
        first = tokenizer.tokenize(
            "mail jane.doe@example.com ", add_special=True, parse_special=False
        )
        second = tokenizer.tokenize(" and that", add_special=False, parse_special=False)
        images = [
            ImageInput(sha256="a" * 64, data=b"x", position=len(first)),
            ImageInput(sha256="b" * 64, data=b"y", position=len(first + second)),
        ]
        request = AddRequest(
            request_id="r",
            prompt_token_ids=first + second,
            sampling=SamplingParams(max_tokens=1),
            images=images,
        )
        assert await engine._redacts_input(request.prompt_token_ids, _context())
        redacted = engine._redacted(request)
    tokens = redacted.prompt_token_ids
    a, b = (image.position for image in redacted.images)
    assert tokenizer.detokenize(tokens[:a]) == "mail [REDACTED_EMAIL] "
    assert tokenizer.detokenize(tokens[a:b]) == " and that"
    assert b == len(tokens)
    assert [image.sha256[0] for image in redacted.images] == ["a", "b"]


def _context():
    from inferflux.security.context import RequestContext
    from inferflux.security.principal import ANONYMOUS

    return RequestContext("req-1", started_at=0.0, principal=ANONYMOUS)
