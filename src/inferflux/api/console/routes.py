"""`console_router`: the console's page, static files and session routes under one path.

Public (the authentication middleware lets them through without a credential, see
`CookieSessions.is_public`): GET `{path}`, GET `{path}/static/{name}`, POST
`{path}/session`. GET and DELETE `{path}/session` need a credential like any API route.
"""

from __future__ import annotations

from fastapi import APIRouter

from inferflux.api.console import pages, session
from inferflux.config.settings import Settings


def console_router(settings: Settings) -> APIRouter | None:
    """The console's routes at `console.path`; None when the console is off."""
    console = settings.console
    if not console.enabled:
        return None
    router = APIRouter(prefix=console.path, tags=["console"], include_in_schema=False)
    pages.add_routes(router, console.path)
    session.add_routes(router, secure_cookie=settings.server.tls.enabled)
    return router
