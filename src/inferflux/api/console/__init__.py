"""The web console (`console.path`, /ui by default): a chat playground and admin pages,
served from the package's static files (plain ES modules and CSS: no build step, no CDN).

`pages` serves the page and its files with a strict CSP; `session` signs a browser in
with an API key or OIDC token and out again (security/sessions.py holds the sessions;
security/authn.py accepts their cookie). Every console action is a call to the same API
any client uses (docs/console.md). `console_router(settings)` bundles the routes; it is
None when `console.enabled` is off."""

from inferflux.api.console.routes import console_router

__all__ = ["console_router"]
