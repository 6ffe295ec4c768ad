"""A real HTTP server on 127.0.0.1 for the image-fetch tests: an image, redirects, a
slow answer, a slow body, a too-big body."""

from __future__ import annotations

import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image


def png_bytes(size: tuple[int, int] = (16, 16)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (10, 120, 200)).save(out, format="PNG")
    return out.getvalue()


class _Handler(BaseHTTPRequestHandler):
    server: ImageServer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.seen_hosts.append(self.headers.get("Host", ""))
        path = self.path
        if path == "/cat.png":
            self._send(200, self.server.image, {"Content-Type": "text/plain"})
        elif path == "/same-host":
            self._send(302, headers={"Location": "/cat.png"})
        elif path == "/other-host":
            self._send(302, headers={"Location": f"http://localhost:{self.server.port}/cat.png"})
        elif path == "/loop":
            self._send(302, headers={"Location": "/loop"})
        elif path == "/slow":
            time.sleep(3)
            self._send(200, self.server.image)
        elif path == "/drip":
            self._drip()
        elif path == "/big":
            self._send(200, b"\x89PNG\r\n\x1a\n" + bytes(300_000))
        elif path == "/big-unsized":
            self._unsized(b"\x89PNG\r\n\x1a\n" + bytes(300_000))
        elif path == "/text":
            self._send(200, b"<html>not an image</html>", {"Content-Type": "image/png"})
        else:
            self._send(404, b"no")

    def _drip(self) -> None:
        """Headers at once, then a byte every 0.2 s: only a total time limit stops it."""
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        try:
            for _ in range(1000):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    def _unsized(self, body: bytes) -> None:
        """No Content-Length: the body ends when the connection closes."""
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for start in range(0, len(body), 16_384):
                self.wfile.write(body[start : start + 16_384])
        except OSError:
            pass
        self.close_connection = True


class ImageServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.port = self.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.image = png_bytes()
        self.seen_hosts: list[str] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that left early (timeouts, size limits): expected here

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(5)
