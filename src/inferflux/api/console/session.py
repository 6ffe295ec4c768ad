"""`{path}/session`: sign in (POST), who am I (GET), sign out (DELETE).

Sign-in takes `{"api_key": ...}` or `{"token": ...}` (an OIDC JWT) and authenticates it
with the app's own `Authenticator`, exactly as a request's header would be; on success a
server-side session is opened (security/sessions.py) and its id set as an HttpOnly,
SameSite=Strict cookie (Secure under TLS). The answer carries the session's CSRF token
and what the principal may do (its scopes): the console shows only the pages those allow,
and the API enforces them anyway. The key or token is never stored nor echoed. With
authentication off there is nothing to sign in to: every caller is the anonymous admin,
and no cookie is set.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.responses import JSONResponse

from inferflux.api.console.pages import SECURITY_HEADERS
from inferflux.api.deps import json_body
from inferflux.api.state import ContextDep, SecurityDep
from inferflux.errors import InvalidRequest
from inferflux.security.api_keys import MAX_KEY_CHARS, Credentials
from inferflux.security.principal import ANONYMOUS, Principal
from inferflux.security.sessions import COOKIE_NAME, Session, SessionStore

logger = logging.getLogger(__name__)

_NO_STORE = {**SECURITY_HEADERS, "cache-control": "no-store"}


class SignInBody(BaseModel):
    """One credential: an API key, or an OIDC token (a JWT)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_key: str | None = Field(None, min_length=1, max_length=MAX_KEY_CHARS)
    token: str | None = Field(None, min_length=1, max_length=16384)

    @model_validator(mode="after")
    def _one(self) -> SignInBody:
        if (self.api_key is None) == (self.token is None):
            raise ValueError("send one of api_key or token")
        return self


def principal_view(principal: Principal, auth_enabled: bool) -> dict[str, object]:
    """What the console shows of the signed-in principal (never a secret)."""
    return {
        "auth_enabled": auth_enabled,
        "subject": principal.subject,
        "kind": principal.kind,
        "tenant": principal.tenant,
        "scopes": sorted(principal.scopes),
        "allowed_models": None
        if principal.allowed_models is None
        else sorted(principal.allowed_models),
    }


def _session_view(store: SessionStore, session: Session | None) -> dict[str, object]:
    if session is None:
        return {"csrf_token": None, "expires_in_s": None, "idle_timeout_s": None}
    return {
        "csrf_token": session.csrf_token,
        "expires_in_s": round(store.expires_in_s(session), 1),
        "idle_timeout_s": store.idle_timeout_s,
    }


def token_lifetime_s(token: str) -> float | None:
    """Seconds until a (verified) JWT's `exp`; None when it has none. Only called after
    the token verified, so its payload is trusted."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) - time.time() if isinstance(exp, int | float) else None


SignIn = Depends(json_body(SignInBody))


def add_routes(router: APIRouter, *, secure_cookie: bool) -> None:
    """POST, GET and DELETE `/session` on `router` (prefixed with the console's path)."""

    async def sign_in(security: SecurityDep, body: SignInBody = SignIn) -> JSONResponse:
        """Sign in with an API key or OIDC token: a session cookie and its CSRF token."""
        authenticator, sessions = security.authenticator, security.sessions
        if sessions is None:  # the console is off: its router is not included
            raise InvalidRequest("the console is off (console.enabled)")
        if not authenticator.enabled:
            return JSONResponse(_anonymous(), headers=_NO_STORE)
        credentials = Credentials(api_key=body.api_key, bearer=body.token)
        principal = await authenticator.authenticate(credentials)
        lifetime_s = None
        if principal.kind == "oidc" and body.token is not None:
            lifetime_s = token_lifetime_s(body.token)
        sessions.store.prune()
        opened = sessions.store.open(principal, max_lifetime_s=lifetime_s)
        logger.info("console sign-in: %s (%s)", principal.subject, principal.kind)
        view = {
            **principal_view(principal, True),
            **_session_view(sessions.store, opened.session),
        }
        response = JSONResponse(view, headers=_NO_STORE)
        response.set_cookie(
            COOKIE_NAME,
            opened.session_id,
            max_age=int(sessions.store.absolute_timeout_s),
            path="/",
            secure=secure_cookie,
            httponly=True,
            samesite="strict",
        )
        return response

    async def who_am_i(
        request: Request, security: SecurityDep, context: ContextDep
    ) -> JSONResponse:
        """The caller's principal, and its session's CSRF token when it sent the cookie."""
        if not security.authenticator.enabled:
            return JSONResponse(_anonymous(), headers=_NO_STORE)
        sessions = security.sessions
        session = None
        if sessions is not None and (session_id := request.cookies.get(COOKIE_NAME)):
            session = sessions.store.find(session_id)
        store = sessions.store if sessions is not None else None
        view = principal_view(context.caller, True)
        if store is not None:
            view |= _session_view(store, session)
        return JSONResponse(view, headers=_NO_STORE)

    async def sign_out(request: Request, security: SecurityDep) -> JSONResponse:
        """End the caller's console session (its cookie is cleared)."""
        session_id = request.cookies.get(COOKIE_NAME)
        closed = bool(
            session_id and security.sessions and security.sessions.store.close(session_id)
        )
        response = JSONResponse({"signed_out": closed}, headers=_NO_STORE)
        response.delete_cookie(
            COOKIE_NAME, path="/", secure=secure_cookie, httponly=True, samesite="strict"
        )
        return response

    router.add_api_route("/session", sign_in, methods=["POST"])
    router.add_api_route("/session", who_am_i, methods=["GET"])
    router.add_api_route("/session", sign_out, methods=["DELETE"])


def _anonymous() -> dict[str, object]:
    return {
        **principal_view(ANONYMOUS, False),
        "csrf_token": None,
        "expires_in_s": None,
        "idle_timeout_s": None,
    }
