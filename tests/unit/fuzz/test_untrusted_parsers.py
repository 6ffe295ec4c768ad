"""Property-based fuzzing (hypothesis) of the parsers that see untrusted bytes: each must
answer with its own clean error, never crash, hang or exhaust the stack. `make test` runs a
small number of examples; `make chaos` (HYPOTHESIS_PROFILE=chaos) runs many more."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferflux.config.auth_settings import OidcSettings
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.frames import FrameReader, frame
from inferflux.engine.gguf_metadata import read_gguf_metadata
from inferflux.engine.grammar import ConstraintCompiler
from inferflux.errors import InferfluxError, ModelLoadError
from inferflux.security.oidc import OidcVerifier, TokenRejected
from tests.fakes.engine import FakeTokenizer
from tests.unit.engine.test_chat_template import SMOLLM_LIKE
from tests.unit.engine.test_gguf_metadata import _sample

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.register_profile(
    "chaos", max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

GGUF_HEAD = b"GGUF" + struct.pack("<I", 3)


def _parse_gguf(tmp: Path, data: bytes) -> None:
    path = tmp / "fuzz.gguf"
    path.write_bytes(data)
    with contextlib.suppress(ModelLoadError):
        read_gguf_metadata(path)


@given(st.binary(max_size=512))
def test_gguf_reader_on_random_bytes_after_the_magic(tmp_path_factory, tail: bytes) -> None:
    _parse_gguf(tmp_path_factory.mktemp("g"), GGUF_HEAD + tail)


@given(st.data())
def test_gguf_reader_on_a_mutated_real_header(tmp_path_factory, data) -> None:
    sample = bytearray(_sample())
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(sample) - 1))
        sample[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(sample)))
    _parse_gguf(tmp_path_factory.mktemp("g"), bytes(sample[:cut]))


def test_gguf_reader_refuses_arrays_nested_past_any_real_file(tmp_path) -> None:
    """An array of arrays of arrays ... 100,000 deep: a clean error, not RecursionError."""
    nested = struct.pack("<IQ", 9, 1) * 100_000 + struct.pack("<IQ", 4, 0)
    key = struct.pack("<Q", 1) + b"k" + struct.pack("<I", 9)
    data = GGUF_HEAD + struct.pack("<QQ", 0, 1) + key + nested
    with pytest.raises(ModelLoadError, match="nested"):
        read_gguf_metadata(_write(tmp_path, data))


def _write(tmp: Path, data: bytes) -> Path:
    path = tmp / "nested.gguf"
    path.write_bytes(data)
    return path


@given(st.lists(st.binary(max_size=64), max_size=8), st.lists(st.integers(1, 40), max_size=8))
def test_frames_arrive_whole_and_in_order_however_split(payloads, cuts) -> None:
    stream = b"".join(frame(p) for p in payloads)
    got: list[bytes] = []
    reader = FrameReader(got.append)
    at = 0
    for cut in [*cuts, len(stream)]:
        reader.data_received(stream[at : at + cut])
        at += cut
    reader.data_received(stream[at:])
    assert got == payloads


@given(st.binary(max_size=256))
def test_frames_reader_never_raises_on_random_bytes(data: bytes) -> None:
    class FakeTransport:
        def close(self) -> None:
            pass

    reader = FrameReader(lambda payload: None)
    reader._transport = FakeTransport()  # type: ignore[assignment]
    reader.data_received(data)


MESSAGE = st.fixed_dictionaries(
    {
        "role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool"]), st.text()),
        "content": st.one_of(st.text(), st.none(), st.lists(st.text(), max_size=3)),
    }
)


@given(st.lists(MESSAGE, max_size=6))
def test_chat_template_renders_or_refuses_any_messages(messages) -> None:
    template = ChatTemplate.from_model(SMOLLM_LIKE, "llama", "<s>", "</s>")
    with contextlib.suppress(InferfluxError):
        assert isinstance(template.render(messages), str)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)
SCHEMA_KEYS = st.sampled_from(
    ["type", "properties", "items", "required", "enum", "const", "anyOf", "allOf", "$ref",
     "minLength", "maxItems", "pattern", "additionalProperties", "$defs", "format"]
)  # fmt: skip


@given(st.dictionaries(SCHEMA_KEYS, JSON, max_size=5))
def test_schema_compiler_compiles_or_refuses_any_schema(schema) -> None:
    compiler = ConstraintCompiler(FakeTokenizer().constraint_error)
    try:
        assert compiler.json_schema(schema, param="response_format")
    except InferfluxError:
        pass
    except BaseException as exc:  # a Rust panic (pyo3's PanicException) is a BaseException
        if type(exc).__name__ == "PanicException":
            raise AssertionError(f"llguidance panicked: {exc}") from None
        raise


@given(st.text(max_size=400))
def test_grammar_compiler_compiles_or_refuses_any_text(text) -> None:
    compiler = ConstraintCompiler(FakeTokenizer().constraint_error)
    for kind in ("regex", "gbnf", "lark"):
        with contextlib.suppress(InferfluxError, AttributeError):
            getattr(compiler, kind)(text, param="grammar")


_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
_SETTINGS = OidcSettings(issuer="https://issuer.test", audience="inferflux")


class FakeJwks:
    """One RSA key, kid `k1` (the verifier's key lookup without an HTTPS JWKS server)."""

    def __init__(self) -> None:
        self._jwk = jwt.PyJWK.from_dict(
            json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(_KEY.public_key())) | {"kid": "k1"}
        )

    async def key(self, kid: str) -> jwt.PyJWK | None:
        return self._jwk if kid == "k1" else None


def _verify(token: str) -> None:
    verifier = OidcVerifier(_SETTINGS, FakeJwks())  # type: ignore[arg-type]
    with contextlib.suppress(TokenRejected):
        asyncio.run(verifier.verify(token))


@given(st.text(max_size=300))
def test_jwt_verifier_rejects_random_text_cleanly(token: str) -> None:
    _verify(token)


@given(
    st.dictionaries(st.text(max_size=6), JSON, max_size=5),
    st.dictionaries(st.text(max_size=6), JSON, max_size=6),
)
def test_jwt_verifier_rejects_forged_headers_and_claims_cleanly(header, claims) -> None:
    import base64

    def b64(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    _verify(f"{b64(header | {'alg': 'RS256', 'kid': 'k1'})}.{b64(claims)}.c2ln")
    _verify(f"{b64(header)}.{b64(claims)}.")


@given(
    st.dictionaries(
        st.sampled_from(["exp", "iss", "aud", "sub", "nbf", "iat", "scope", "tenant"]), JSON
    )
)
def test_jwt_verifier_on_signed_tokens_with_any_claims(claims) -> None:
    try:
        token = jwt.encode(claims, _KEY, algorithm="RS256", headers={"kid": "k1"})
    except (TypeError, ValueError):
        return
    _verify(token)


def test_a_schema_that_makes_llguidance_panic_is_a_400() -> None:
    """Found by the fuzzer: llguidance's error message for a `required` that is an object
    cut a 4-byte character in two, and the Rust panic escaped as a BaseException."""
    value = {
        "00": None,
        "0\x1f𐀀": None,
        "0\x1f\x1f\x1f": [{'""\x1f\x1f': None}],
        "𐀀𐀀": {"𐀀𐀀": None},
    }
    compiler = ConstraintCompiler(FakeTokenizer().constraint_error)
    with pytest.raises(InferfluxError, match="cannot be enforced"):
        compiler.json_schema({"required": value}, param="response_format")
