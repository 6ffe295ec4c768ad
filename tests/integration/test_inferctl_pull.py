"""`inferctl pull` against a fake Hugging Face Hub on a loopback port.

The real hub is unreachable from CI, so a small `http.server` implements the endpoints that
huggingface_hub calls for a download: the tree listing (`/api/models/{repo}/tree/{rev}`)
and HEAD/GET on `/{repo}/resolve/{rev}/{file}` with the hub's headers (`X-Repo-Commit`,
an `ETag` that is the file's LFS sha256, `Content-Length`). The served "GGUF" files are a
few KiB of fake content: `pull` only checks hashes, it never loads the model.
`.venv/bin/inferctl` runs as a subprocess because huggingface_hub reads HF_ENDPOINT at
import time.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

INFERCTL = str(Path(sys.executable).with_name("inferctl"))
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "acme/tiny-GGUF"


class FakeHub:
    """Repos as {repo: {filename: bytes}}; `lie_about_sha256` serves a wrong ETag."""

    def __init__(self, repos: dict[str, dict[str, bytes]]) -> None:
        self.repos = repos
        self.lie_about_sha256 = False

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
            status, body, headers = hub.respond(self.path.split("?")[0])
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


@pytest.fixture
def hub() -> Iterator[tuple[FakeHub, str]]:
    files = {"tiny-q8_0.gguf": b"GGUF" + os.urandom(64 * 1024), "README.md": b"# tiny\n"}
    fake = FakeHub({REPO: files, "acme/two-GGUF": {"a.gguf": b"GGUFa", "b.gguf": b"GGUFb"}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _pull(endpoint: str, tmp_path: Path, *args: str, **extra_env: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "INFERFLUX_"))}
    env |= {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HOME": str(tmp_path / "home"),
        **extra_env,
    }
    return subprocess.run(
        [INFERCTL, "pull", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_pull_downloads_verifies_and_records_the_file(hub, tmp_path: Path) -> None:
    fake, endpoint = hub
    dest = tmp_path / "models"
    done = _pull(endpoint, tmp_path, f"{REPO}:tiny-q8_0.gguf", "--dest", str(dest))
    assert done.returncode == 0, done.stderr
    path = dest / REPO / "tiny-q8_0.gguf"
    data = fake.repos[REPO]["tiny-q8_0.gguf"]
    assert path.read_bytes() == data
    assert f"inferflux serve --model {path}" in done.stdout
    assert "matches the hub" in done.stdout
    [entry] = yaml.safe_load((dest / "models.yaml").read_text())
    assert entry == {
        "id": "tiny-q8_0",
        "path": str(path),
        "sha256": hashlib.sha256(data).hexdigest(),
        "source": f"hf://{REPO}/tiny-q8_0.gguf@{COMMIT}",
    }


def test_pull_without_a_file_picks_the_only_gguf_and_reads_the_env_dir(hub, tmp_path) -> None:
    _, endpoint = hub
    dest = tmp_path / "env-models"
    done = _pull(endpoint, tmp_path, REPO, "--json", INFERFLUX_MODELS_DIR=str(dest))
    assert done.returncode == 0, done.stderr
    assert (dest / REPO / "tiny-q8_0.gguf").is_file()
    assert len(yaml.safe_load((dest / "models.yaml").read_text())) == 1
    reply = json.loads(done.stdout)
    assert reply["path"] == str(dest / REPO / "tiny-q8_0.gguf")
    assert reply["verification"] == "matches the hub"


def test_pull_with_several_ggufs_lists_them_and_exits_2(hub, tmp_path: Path) -> None:
    _, endpoint = hub
    done = _pull(endpoint, tmp_path, "acme/two-GGUF", "--dest", str(tmp_path / "m"))
    assert done.returncode == 2
    assert "acme/two-GGUF:a.gguf" in done.stderr and "acme/two-GGUF:b.gguf" in done.stderr


def test_a_sha256_mismatch_deletes_the_file_and_exits_1(hub, tmp_path: Path) -> None:
    fake, endpoint = hub
    fake.lie_about_sha256 = True
    dest = tmp_path / "models"
    done = _pull(endpoint, tmp_path, f"{REPO}:tiny-q8_0.gguf", "--dest", str(dest))
    assert done.returncode == 1
    assert "sha256 mismatch" in done.stderr
    assert not (dest / REPO / "tiny-q8_0.gguf").exists()
    assert not (dest / "models.yaml").exists()


def test_a_missing_file_exits_1_without_a_traceback(hub, tmp_path: Path) -> None:
    _, endpoint = hub
    done = _pull(endpoint, tmp_path, f"{REPO}:nope.gguf", "--dest", str(tmp_path / "m"))
    assert done.returncode == 1
    assert "cannot pull" in done.stderr and "Traceback" not in done.stderr
