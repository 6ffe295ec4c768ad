"""Console sessions: idle and absolute timeouts, the LRU bound, sign-out, the cookie and
the CSRF check (pure logic: a hand-driven clock)."""

from __future__ import annotations

from inferflux.security.principal import Principal, Scope
from inferflux.security.sessions import (
    COOKIE_NAME,
    CookieSessions,
    SessionStore,
    csrf_ok,
)

ALICE = Principal("key_alice", "api_key", "acme", frozenset({Scope.GENERATE}))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_store(clock: Clock, *, idle_s: float = 60.0, absolute_s: float = 300.0, max_n: int = 10):
    return SessionStore(
        idle_timeout_s=idle_s, absolute_timeout_s=absolute_s, max_sessions=max_n, clock=clock
    )


def test_a_session_is_found_by_its_id_and_never_by_another():
    store = make_store(Clock())
    opened = store.open(ALICE)
    assert store.find(opened.session_id) is opened.session
    assert opened.session.principal is ALICE
    assert store.find(opened.session_id + "x") is None
    assert store.find("") is None
    assert store.find("a" * 1000) is None
    other = store.open(ALICE)
    assert other.session_id != opened.session_id
    assert other.session.csrf_token != opened.session.csrf_token
    assert len(opened.session_id) >= 40 and len(opened.session.csrf_token) >= 40


def test_idle_timeout_restarts_on_each_use():
    clock = Clock()
    store = make_store(clock, idle_s=60)
    opened = store.open(ALICE)
    for _ in range(4):  # used every 50 s: 200 s in all, past one idle period
        clock.now += 50
        assert store.find(opened.session_id) is not None
    clock.now += 60
    assert store.find(opened.session_id) is None
    assert len(store) == 0  # dropped once found expired


def test_touch_restarts_the_idle_timer_at_the_end_of_a_long_request():
    clock = Clock()
    store = make_store(clock, idle_s=60)
    opened = store.open(ALICE)
    session = store.find(opened.session_id)
    clock.now += 100  # a model swap that took longer than the idle timeout
    store.touch(session)
    clock.now += 59
    assert store.find(opened.session_id) is session


def test_absolute_timeout_ends_a_busy_session():
    clock = Clock()
    store = make_store(clock, idle_s=60, absolute_s=120)
    opened = store.open(ALICE)
    clock.now += 59
    assert store.find(opened.session_id) is not None
    clock.now += 59
    assert store.find(opened.session_id) is not None
    assert store.expires_in_s(opened.session) == 2.0
    clock.now += 2
    assert store.find(opened.session_id) is None


def test_a_token_lifetime_shortens_the_absolute_timeout():
    clock = Clock()
    store = make_store(clock, absolute_s=300)
    opened = store.open(ALICE, max_lifetime_s=30)
    clock.now += 30
    assert store.find(opened.session_id) is None
    expired_token = store.open(ALICE, max_lifetime_s=-5)
    assert store.find(expired_token.session_id) is None


def test_sign_out_and_prune():
    clock = Clock()
    store = make_store(clock, idle_s=60)
    first, second = store.open(ALICE), store.open(ALICE)
    assert store.close(first.session_id)
    assert not store.close(first.session_id)
    assert store.find(first.session_id) is None
    clock.now += 61
    third = store.open(ALICE)
    assert store.prune() == 1  # the second one timed out
    assert store.find(second.session_id) is None
    assert store.find(third.session_id) is not None


def test_the_least_recently_used_session_goes_first_past_the_bound():
    store = make_store(Clock(), max_n=2)
    a, b = store.open(ALICE), store.open(ALICE)
    store.find(a.session_id)  # a is now the most recently used
    c = store.open(ALICE)
    assert len(store) == 2
    assert store.find(b.session_id) is None
    assert store.find(a.session_id) is not None and store.find(c.session_id) is not None


def test_close_matching_drops_one_principals_sessions():
    store = make_store(Clock())
    bob = Principal("key_bob", "api_key", "acme", frozenset({Scope.READ}))
    mine, theirs = store.open(ALICE), store.open(bob)
    assert store.close_matching(lambda s: s.principal.subject == "key_alice") == 1
    assert store.find(mine.session_id) is None
    assert store.find(theirs.session_id) is not None


def test_public_paths_are_the_page_its_files_and_sign_in():
    cookies = CookieSessions(make_store(Clock()), "/ui")
    assert cookies.is_public("/ui", "GET")
    assert cookies.is_public("/ui/static/app.js", "GET")
    assert cookies.is_public("/ui/session", "POST")
    assert cookies.is_public("/ui/", "GET") and cookies.is_public("/ui/session/", "POST")
    assert not cookies.is_public("/ui/session", "GET")  # who am I: needs the cookie
    assert not cookies.is_public("/ui/session", "DELETE")
    assert not cookies.is_public("/ui", "POST")
    assert not cookies.is_public("/uix/static/app.js", "GET")
    assert not cookies.is_public("/v1/models", "GET")


def test_the_session_cookie_is_read_from_the_cookie_header():
    cookies = CookieSessions(make_store(Clock()), "/ui")
    header = f"theme=dark; {COOKIE_NAME}=abc123; other=1".encode()
    assert cookies.session_id([(b"cookie", header)]) == "abc123"
    assert cookies.session_id([(b"cookie", b"theme=dark")]) is None
    assert cookies.session_id([(b"cookie", f"{COOKIE_NAME}=".encode())]) is None
    assert cookies.session_id([(b"x-session", b"abc123")]) is None


def test_csrf_is_needed_for_every_method_that_may_change_state():
    session = make_store(Clock()).open(ALICE).session
    token = session.csrf_token.encode()
    for method in ("GET", "HEAD", "OPTIONS"):
        assert csrf_ok(session, method, [])
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert not csrf_ok(session, method, [])
        assert not csrf_ok(session, method, [(b"x-csrf-token", b"wrong")])
        assert not csrf_ok(session, method, [(b"x-csrf-token", token)] * 2)
        assert csrf_ok(session, method, [(b"x-csrf-token", token)])
