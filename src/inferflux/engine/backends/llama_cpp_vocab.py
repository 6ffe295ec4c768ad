"""A model's vocabulary through llama.cpp: token bytes, and llguidance's tokenizer over it.

Owns: one token's bytes (`token_piece`), the llguidance tokenizer that grammars and JSON
schemas are compiled against (`grammar_tokenizer`), and its build on a thread of its own
(`BackgroundGrammarTokenizer`). Used by the API process's `LlamaTokenizer` (it validates
constraints) and by the worker's `LlamaCppBackend` (it enforces them); both in
llama_cpp.py. Thread rule: these only read the vocabulary, which must outlive them.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import llama_cpp as ll  # isort: split

from llguidance import LLTokenizer

from inferflux.errors import EngineError


def grammar_tokenizer(vocab: Any, *, masks: bool = True) -> LLTokenizer:  # Any: vocab*
    """An llguidance tokenizer over `vocab`: every token's bytes, special ones marked with
    a 0xFF prefix (llguidance's convention) so grammars never produce them as text, and
    llama.cpp's own tokenize function. Its end-of-sequence set is every EOG token, so
    whichever one the model emits ends a complete grammar.

    `masks=False` leaves out llguidance's default slices: precomputed token subsets that
    only speed up computing masks. A tokenizer that only validates grammars (the API
    process's) needs none of them, and without them it takes half the memory and build
    time (Gemma 3's 262k tokens: 54 instead of 113 MB, 0.8 instead of 1.8 s).

    (llguidance.llamacpp builds the same, through a deprecated llama.cpp call.)
    """
    n_vocab = ll.llama_vocab_n_tokens(vocab)
    special = ll.LLAMA_TOKEN_ATTR_CONTROL
    pieces: list[bytes] = []
    for token in range(n_vocab):
        piece = token_piece(vocab, token, special=True)
        attr = ll.llama_vocab_get_attr(vocab, token)
        looks_special = piece.startswith(b"<") and piece.endswith(b">")
        if attr & special or (attr & ll.LLAMA_TOKEN_ATTR_USER_DEFINED and looks_special):
            piece = b"\xff" + piece
        pieces.append(piece)
    eog = [t for t in range(n_vocab) if ll.llama_vocab_is_eog(vocab, t)]
    tokenize_fn = ctypes.cast(ll.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    return LLTokenizer.from_llamacpp(  # type: ignore[attr-defined,no-any-return]
        tokens=pieces,
        vocab_ptr=vocab,
        tokenize_fptr=tokenize_fn,
        eos_token=eog or ll.llama_vocab_eos(vocab),
        slices=None if masks else [],
    )


class BackgroundGrammarTokenizer:
    """`grammar_tokenizer(vocab)`, built on a daemon thread from construction on (about
    0.3 s for SmolLM2's 49k tokens, 1.8 s for Gemma's 262k: bench/grammar_index.py), so
    the first constrained request does not stall every running sequence. `get` waits for
    it. The vocabulary
    must outlive the build: call `wait` before freeing the model."""

    def __init__(self, vocab: Any, *, masks: bool = True) -> None:  # Any: vocab*
        self._tokenizer: LLTokenizer | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._build, args=(vocab, masks), name="grammar-tokenizer", daemon=True
        )
        self._thread.start()

    def _build(self, vocab: Any, masks: bool) -> None:  # Any: vocab*
        try:
            self._tokenizer = grammar_tokenizer(vocab, masks=masks)
        except Exception as exc:  # NOTE: re-raised by get() on the caller's thread
            self._error = exc

    def wait(self) -> None:
        self._thread.join()

    def done(self, wait_s: float = 0.0) -> bool:
        """True once `get` returns without waiting (waits up to `wait_s` for that)."""
        self._thread.join(wait_s)
        return not self._thread.is_alive()

    def get(self) -> LLTokenizer:
        """The tokenizer; raises EngineError if it could not be built."""
        self._thread.join()
        if self._tokenizer is None:
            raise EngineError(f"could not index the vocabulary for grammars: {self._error}")
        return self._tokenizer


def token_piece(vocab: Any, token: int, *, special: bool = False) -> bytes:  # Any: vocab*
    """The bytes of one token; special tokens render as empty unless `special`."""
    buf = ctypes.create_string_buffer(64)
    n = ll.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = ll.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    return buf.raw[:n]
