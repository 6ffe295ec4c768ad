"""`TextDigester`: keyed digests (HMAC-SHA-256) that stand for prompts and outputs in the
audit log and in OPA's input, so text can be correlated ("the same prompt again") but not
read back, and short prompts cannot be guessed from an unkeyed hash.

The key comes from `audit.hmac_key` (env `INFERFLUX_AUDIT_HMAC_KEY`). Without it each
process draws a random key at start: digests then match only within that process's
lifetime (not across restarts or replicas).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets


class TextDigester:
    def __init__(self, key: bytes | None, *, raw: bool = False) -> None:
        """`raw`: debug mode, `render` returns the text itself."""
        self.random_key = key is None
        self._key = key if key is not None else secrets.token_bytes(32)
        self.raw = raw

    def digest(self, text: str) -> str:
        """`hmac-sha256:<64 hex>` of the UTF-8 text."""
        data = text.encode("utf-8", errors="surrogatepass")
        return "hmac-sha256:" + hmac.new(self._key, data, hashlib.sha256).hexdigest()

    def render(self, text: str | None) -> str | None:
        """What a log may hold of `text`: its digest, or the text in debug mode."""
        if text is None:
            return None
        return text if self.raw else self.digest(text)
