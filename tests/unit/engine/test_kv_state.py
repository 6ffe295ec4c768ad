"""The KV blob format: its header round trip and every refusal (pure; the real
llama.cpp bytes are tested in tests/integration/test_kv_state.py)."""

from __future__ import annotations

import pytest

from inferflux.engine.kv_state import (
    BlobHeader,
    KvStateRefused,
    decode_blob,
    encode_blob,
    header_end,
    read_header,
)

LAYOUT = {"n_ctx_per_seq": 512, "type_k": 1, "swa_full": True}
HEADER = BlobHeader(model_id="a" * 64, layout=LAYOUT, namespace="m|tenant:t", token_ids=[1, 2, 3])


def test_round_trip_and_header_only_read() -> None:
    data = encode_blob(HEADER, b"payload")
    blob = decode_blob(data, model_id="a" * 64, layout=LAYOUT)
    assert blob.header == HEADER and blob.payload == b"payload" and blob.num_tokens == 3
    assert read_header(data[: header_end(data[:14])]) == HEADER


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d[:3], "truncated"),
        (lambda d: b"XXXX" + d[4:], "bad magic"),
        (lambda d: d[:4] + b"\x09\x00" + d[6:], "version 9"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "checksum"),
        (lambda d: d[:20], "truncated header|checksum"),
    ],
)
def test_corrupt_bytes_are_refused(mutate, message) -> None:
    blob = bytes(encode_blob(HEADER, b"payload"))  # a view of numpy's memory: edited as bytes
    with pytest.raises(KvStateRefused, match=message):
        decode_blob(mutate(blob), model_id="a" * 64, layout=LAYOUT)


def test_another_model_or_layout_is_refused_naming_the_difference() -> None:
    data = encode_blob(HEADER, b"payload")
    with pytest.raises(KvStateRefused, match="model"):
        decode_blob(data, model_id="b" * 64, layout=LAYOUT)
    with pytest.raises(KvStateRefused, match="swa_full"):
        decode_blob(data, model_id="a" * 64, layout={**LAYOUT, "swa_full": False})
    with pytest.raises(KvStateRefused, match="empty"):
        decode_blob(encode_blob(HEADER, b""), model_id="a" * 64, layout=LAYOUT)
