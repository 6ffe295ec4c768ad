"""A fake Hugging Face Hub on a loopback port, for `inferctl pull`, hf:// model URLs and
Ollama's `/api/pull`.

The real hub is unreachable from CI, so a small `http.server` implements the endpoints that
huggingface_hub and models/download.py call: the tree listing
(`/api/models/{repo}/tree/{rev}`) and HEAD/GET on `/{repo}/resolve/{rev}/{file}` with the
hub's headers (`X-Repo-Commit`, an `ETag` that is the file's LFS sha256,
`Content-Length`). `hub_env` gives a subprocess (inferctl, a server) that endpoint:
huggingface_hub reads HF_ENDPOINT at import time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Repos as {repo: {filename: bytes}}; `lie_about_sha256` serves a wrong ETag."""

    def __init__(self, repos: dict[str, dict[str, bytes]]) -> None:
        self.repos = repos
        self.lie_about_sha256 = False
        self.downloads: list[str] = []  # the paths of every GET of a file

    def respond(self, path: str) -> tuple[int, bytes, dict[str, str]]:
        """Status, body and headers for a GET (a HEAD sends the same without the body)."""
        for repo, files in self.repos.items():
            if path.startswith(f"/api/models/{repo}/tree/"):
                tree = [
                    {"type": "file", "path": n, "oid": "0" * 40, "size": len(b)}
                    for n, b in files.items()
                ]
                return 200, json.dumps(tree).encode(), {"Content-Type": "application/json"}
            if path.startswith(f"/{repo}/resolve/"):
                return self._resolve(files, path.split("/", 5)[-1])
        return 404, b"no such repo", {"X-Error-Code": "RepoNotFound"}

    def _resolve(self, files: dict[str, bytes], name: str) -> tuple[int, bytes, dict[str, str]]:
        if name not in files:
            return 404, b"not found", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}
        data = files[name]
        sha256 = hashlib.sha256(b"lie" if self.lie_about_sha256 else data).hexdigest()
        return 200, data, {"X-Repo-Commit": COMMIT, "ETag": f'"{sha256}"'}


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # quiet test output
            pass

        def _reply(self, head: bool) -> None:
            path = self.path.split("?")[0]
            status, body, headers = hub.respond(path)
            if not head and "/resolve/" in path:
                hub.downloads.append(path)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def do_HEAD(self):
            self._reply(head=True)

        def do_GET(self):
            self._reply(head=False)

    return Handler


@contextlib.contextmanager
def serve_hub(fake: FakeHub) -> Iterator[str]:
    """Serve `fake` on 127.0.0.1; yields its endpoint URL, shut down on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def hub_env(endpoint: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without HF_*/INFERFLUX_* settings, pointed at `endpoint`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "INFERFLUX_"))}
    return env | {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HOME": str(tmp_path / "home"),
        **extra,
    }
