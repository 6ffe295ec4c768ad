"""Every route declares the scope it needs; only the health probes (and /metrics when
public) and the web console's page, files and sign-in are public. A new route included
without a scope fails here."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from starlette.middleware import Middleware

from inferflux.api import create_app
from inferflux.config.settings import Settings
from inferflux.security.authn import AuthenticationMiddleware
from inferflux.security.principal import Scope
from inferflux.security.rbac import required_scope
from tests.fakes.engine import FakeEngineClient, FakeTokenizer, fake_model_info

HEALTH = {"/healthz", "/livez", "/readyz"}
# the console's routes take no scope: its page and sign-in are public (CookieSessions),
# GET/DELETE of the session need any valid credential (the middleware's 401)
CONSOLE = {"/ui", "/ui/static/{name}", "/ui/session"}
EXPECTED_PREFIXES = (
    ("/v1/admin/adapters", Scope.ADAPTER_MANAGER),
    ("/v1/admin/", Scope.ADMIN),
    ("/debug/", Scope.ADMIN),
    ("/v1/chat/", Scope.GENERATE),
    ("/v1/completions", Scope.GENERATE),
    ("/v1/responses", Scope.GENERATE),
    ("/v1/messages", Scope.GENERATE),
    ("/v1/embeddings", Scope.GENERATE),
    ("/api/generate", Scope.GENERATE),
    ("/api/chat", Scope.GENERATE),
    ("/api/embed", Scope.GENERATE),
    ("/api/pull", Scope.ADMIN),
    ("/tokenize", Scope.GENERATE),
    ("/detokenize", Scope.GENERATE),
    ("/generate", Scope.GENERATE),
    ("/chat", Scope.GENERATE),
    ("/embeddings", Scope.GENERATE),
    ("/v1/models", Scope.READ),
    ("/api/tags", Scope.READ),
    ("/api/show", Scope.READ),
    ("/server/stats", Scope.READ),
    ("/grpc/inferflux.v1.Inference/ListModels", Scope.READ),
    ("/grpc/inferflux.v1.Inference/", Scope.GENERATE),
)


def build(settings: Settings) -> FastAPI:
    return create_app(
        settings, engine=FakeEngineClient(), tokenizer=FakeTokenizer(), model_info=fake_model_info()
    )


def route_scopes(app: FastAPI) -> dict[str, Scope | None]:
    """path → the scope its dependencies require (None: none), for every route."""
    found: dict[str, Scope | None] = {}
    for route in iter_route_contexts(app.routes):
        dependant = getattr(route, "dependant", None)
        calls = [d.call for d in dependant.dependencies] if dependant is not None else []
        scopes = {s for s in map(required_scope, calls) if s is not None}
        assert len(scopes) <= 1, f"{route.path} requires several scopes: {scopes}"
        found[route.path] = next(iter(scopes), None)
    return found


def auth_options(app: FastAPI) -> dict:
    middleware: list[Middleware] = app.user_middleware
    return next(m.kwargs for m in middleware if m.cls is AuthenticationMiddleware)


def test_every_route_has_a_scope_or_is_explicitly_public():
    app = build(Settings())
    options = auth_options(app)
    public, doc_scopes = options["public_paths"], options["path_scopes"]
    assert public == HEALTH | {"/metrics"}
    scopes = route_scopes(app)
    assert len(scopes) > 30
    unscoped = {path for path, scope in scopes.items() if scope is None}
    # FastAPI's own pages cannot take dependencies: the middleware checks them
    assert set(doc_scopes) == {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
    assert set(doc_scopes.values()) == {Scope.READ}
    assert unscoped - set(doc_scopes) == public | CONSOLE
    assert options["sessions"].path == "/ui"


def test_scopes_follow_the_table():
    scopes = route_scopes(build(Settings()))
    for path, scope in scopes.items():
        for prefix, expected in EXPECTED_PREFIXES:
            if path.startswith(prefix):
                assert scope == expected, f"{path} needs {scope}, expected {expected}"
                break
    assert scopes["/"] == scopes["/api/version"] == scopes["/api/ps"] == Scope.READ


def test_private_metrics_need_read():
    settings = Settings.model_validate({"observability": {"metrics": {"public": False}}})
    app = build(settings)
    assert auth_options(app)["public_paths"] == HEALTH
    assert route_scopes(app)["/metrics"] == Scope.READ
