"""A header-only stand-in for an mmproj GGUF, for the listing and verification tests.

It carries the keys InferFlux reads from a multimodal projector's header
(`general.architecture` clip, `clip.has_vision_encoder`, `clip.projector_type`) and no
tensors: nothing in those tests hands it to libmtmd, so its weights do not matter. It is
not a vision model and proves nothing about images; the tests that encode images use the
real demo mmproj (models/demo_vision.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gguf


def write_projector_header(path: Path, *, has_vision: bool = True) -> Path:
    """Write the stand-in to `path`; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", has_vision)
    writer.add_string("clip.projector_type", "idefics3")
    writer.add_uint32("clip.vision.image_size", 64)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def sha256_hex(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def serve_file(data: bytes, path: str) -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server answering `path` with `data` (404 otherwise): yields its URL
    and the paths of every GET, for mmproj URL downloads."""
    gets: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # quiet test output
            pass

        def do_GET(self):
            gets.append(self.path)
            found = self.path == path
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", str(len(data) if found else 0))
            self.end_headers()
            if found:
                self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}{path}", gets
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
