"""Console sessions: a signed-in browser's credential, held server-side in memory.

Owns: `SessionStore` (opaque random session ids → `Session`, with idle and absolute
timeouts and a bound on how many are held) and `CookieSessions` (how the authentication
middleware finds a request's session: the cookie, the paths that need none, the CSRF
check). Does not own: sign-in (`api/console/session.py` authenticates the key or token
with the same `Authenticator` as every request, then calls `SessionStore.open`), nor how a
session's principal is refreshed under the current policy (`authn.Authenticator.refresh`).

The model. The browser holds only the session id, in an HttpOnly SameSite=Strict cookie
(Secure under TLS): script cannot read it and no other site's page sends it. The store
keys sessions by the SHA-256 of the id, so the dict's hashing never runs on the secret
itself. Each session has a CSRF token, returned by sign-in (and by GET of the session)
and required as the `X-CSRF-Token` header of every cookie-authenticated request that may
change state (any method but GET, HEAD and OPTIONS), compared in constant time. The API
key or OIDC token itself is never stored: the session keeps the principal it produced
(and, for a key, re-reads that key's record on each request, so a revoked key's sessions
end at once).

One asyncio event loop uses a store; nothing here blocks or locks.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from inferflux.security.principal import Principal

COOKIE_NAME = "inferflux_session"
CSRF_HEADER = b"x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_ID_BYTES = 32


@dataclass(slots=True)
class Session:
    """One signed-in browser. `principal` is what sign-in produced; `ends_at` the
    absolute end (monotonic), `last_used_at` the idle timer's start."""

    principal: Principal
    csrf_token: str
    created_at: float
    last_used_at: float
    ends_at: float


@dataclass(frozen=True, slots=True)
class OpenedSession:
    """What sign-in hands back: the cookie's value (never stored) and the session."""

    session_id: str
    session: Session


class SessionStore:
    """Session id → `Session`, in memory. At most `max_sessions`: opening one more drops
    the least recently used. `clock` is `time.monotonic` (tests pass their own)."""

    def __init__(
        self,
        *,
        idle_timeout_s: float,
        absolute_timeout_s: float,
        max_sessions: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.absolute_timeout_s = absolute_timeout_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # LRU order, oldest first

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, principal: Principal, *, max_lifetime_s: float | None = None) -> OpenedSession:
        """A new session for `principal`; `max_lifetime_s` shortens its absolute timeout
        (an OIDC token's remaining life). Mutates the store (may drop the LRU session)."""
        now = self._clock()
        lifetime_s = self.absolute_timeout_s
        if max_lifetime_s is not None:
            lifetime_s = max(0.0, min(lifetime_s, max_lifetime_s))
        session_id = secrets.token_urlsafe(_ID_BYTES)
        session = Session(
            principal=principal,
            csrf_token=secrets.token_urlsafe(_ID_BYTES),
            created_at=now,
            last_used_at=now,
            ends_at=now + lifetime_s,
        )
        self._sessions[_key(session_id)] = session
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return OpenedSession(session_id, session)

    def find(self, session_id: str) -> Session | None:
        """The live session of `session_id`, its idle timer restarted; None when unknown,
        signed out or timed out (a timed-out session is dropped)."""
        if not session_id or len(session_id) > 256:
            return None
        key = _key(session_id)
        session = self._sessions.get(key)
        if session is None:
            return None
        now = self._clock()
        if self._expired(session, now):
            del self._sessions[key]
            return None
        session.last_used_at = now
        self._sessions.move_to_end(key)
        return session

    def touch(self, session: Session) -> None:
        """Restart `session`'s idle timer (a request made with it just ended). Harmless on
        a session already closed: it is no longer in the store."""
        session.last_used_at = self._clock()

    def close(self, session_id: str) -> bool:
        """Sign out: drop the session. False when there was none."""
        return self._sessions.pop(_key(session_id), None) is not None

    def close_matching(self, predicate: Callable[[Session], bool]) -> int:
        """Drop every session `predicate` accepts (a revoked key's); how many."""
        doomed = [key for key, session in self._sessions.items() if predicate(session)]
        for key in doomed:
            del self._sessions[key]
        return len(doomed)

    def prune(self) -> int:
        """Drop every timed-out session; how many (sign-in calls it: memory stays bounded
        by the live sessions, not by the ones nobody came back to)."""
        now = self._clock()
        return self.close_matching(lambda session: self._expired(session, now))

    def expires_in_s(self, session: Session) -> float:
        """Seconds until `session` ends, idle or absolute, whichever is first."""
        now = self._clock()
        return max(0.0, min(session.ends_at, session.last_used_at + self.idle_timeout_s) - now)

    def _expired(self, session: Session, now: float) -> bool:
        return now >= session.ends_at or now - session.last_used_at >= self.idle_timeout_s


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()


@dataclass(frozen=True, slots=True)
class CookieSessions:
    """What the authentication middleware needs of the console: the store, the console's
    path (its page and static files are public, as is sign-in: POST `{path}/session`)."""

    store: SessionStore
    path: str

    def is_public(self, path: str, method: str) -> bool:
        """The console's page, its static files, and sign-in: served without a session
        (with or without a trailing slash, which the app strips later)."""
        path = path.rstrip("/") or "/"
        if path == self.path or path.startswith(self.path + "/static/"):
            return method in SAFE_METHODS
        return path == self.path + "/session" and method == "POST"

    def session_id(self, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The session cookie's value, or None when the request sent none."""
        for name, value in headers:
            if name != b"cookie":
                continue
            for part in value.decode("latin-1").split(";"):
                key, _, cookie = part.strip().partition("=")
                if key == COOKIE_NAME and cookie:
                    return cookie
        return None


def csrf_ok(session: Session, method: str, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """True when `method` is safe, or the request carries the session's CSRF token."""
    if method in SAFE_METHODS:
        return True
    sent = [value for name, value in headers if name == CSRF_HEADER]
    if len(sent) != 1:
        return False
    return hmac.compare_digest(sent[0], session.csrf_token.encode("ascii"))
