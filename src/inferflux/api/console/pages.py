"""The console's page and static files, with the security headers every answer carries.

The files are read from the package once, when the routes are made (a few tens of KB),
and served by name from that table: no path from the URL ever reaches the file system.
The page names `{path}/static/...` (its only variable part), so it works under any
`console.path`. CSP: everything from this origin only, no inline script or style, no
framing, no plugins.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from starlette.responses import Response

from inferflux.errors import NotFound

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cache-control": "no-cache",
}
_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".svg": "image/svg+xml",
}
_PAGE = "index.html"
_BASE = "__CONSOLE_PATH__"


def static_files() -> dict[str, tuple[bytes, str]]:
    """Every file of the package's `static/` folder: name → (bytes, content type)."""
    folder = resources.files(__package__ or "inferflux.api.console") / "static"
    files: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return files


def add_routes(router: APIRouter, path: str) -> None:
    """GET `path` (the page) and GET `path/static/{name}` on `router` (prefixed `path`)."""
    files = static_files()
    page = files.pop(_PAGE)[0].replace(_BASE.encode(), path.encode())

    async def console_page() -> Response:
        """The console's single page."""
        return Response(page, media_type=_TYPES[".html"], headers=SECURITY_HEADERS)

    async def console_file(name: str) -> Response:
        """One of the console's static files (scripts, styles)."""
        found = files.get(name)
        if found is None:
            raise NotFound(f"the console has no file '{name}'", param="name")
        return Response(found[0], media_type=found[1], headers=SECURITY_HEADERS)

    router.add_api_route("", console_page, methods=["GET"])
    router.add_api_route("/static/{name}", console_file, methods=["GET"])
