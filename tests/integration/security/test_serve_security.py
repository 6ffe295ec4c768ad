"""`inferflux serve` with TLS, CORS, API keys and an encrypted policy store: a real server
process on a loopback port, certificates from a CA made by the test (trustme)."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme
import yaml

from inferflux.security.policy import Policy
from inferflux.security.policy_store import PolicyStore
from tests.integration.server_process import INFERFLUX, ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

ADMIN_KEY = "sk-test-serve-admin-0123456789"
PASSPHRASE = "serve test passphrase"
ORIGIN = "https://app.example"


class TlsServer:
    def __init__(self, process: ServerProcess, ca: trustme.CA, log: Path, store: Path) -> None:
        self.process = process
        self.url = process.url.replace("http://", "https://")
        self.ca = ca
        self.log = log
        self.store = store

    def client(self, **headers: str) -> httpx.Client:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return httpx.Client(base_url=self.url, verify=context, headers=headers, timeout=30)


def write_config(folder: Path, ca: trustme.CA) -> Path:
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    config = {
        "server": {"cors_origins": [ORIGIN]},
        "auth": {"api_keys": [{"key": ADMIN_KEY, "id": "ops", "roles": ["admin"]}]},
    }
    path = folder / "inferflux.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def tls_env(folder: Path) -> dict[str, str]:
    return {
        "INFERFLUX_TLS_ENABLED": "true",
        "INFERFLUX_TLS_CERT_PATH": str(folder / "cert.pem"),
        "INFERFLUX_TLS_KEY_PATH": str(folder / "key.pem"),
        "INFERFLUX_POLICY_STORE": str(folder / "policy.store"),
        "INFERFLUX_POLICY_PASSPHRASE": PASSPHRASE,
        "INFERFLUX_LOG_FORMAT": "json",
    }


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory) -> Iterator[TlsServer]:
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    config = write_config(folder, ca)
    log = folder / "server.log"
    process = ServerProcess("--config", str(config), env=tls_env(folder), log_path=log)
    server = TlsServer(process, ca, log, folder / "policy.store")
    try:
        wait_ready(server)
        yield server
    finally:
        process.close()


def wait_ready(server: TlsServer, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    with server.client() as client:
        while time.monotonic() < deadline:
            if server.process.process.poll() is not None:
                raise RuntimeError(server.log.read_text(errors="replace")[-3000:])
            try:
                if client.get("/readyz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
    raise TimeoutError("the TLS server did not become ready")


def test_https_with_the_test_ca_verifies(tls_server: TlsServer):
    with tls_server.client(authorization=f"Bearer {ADMIN_KEY}") as client:
        assert client.get("/v1/models").status_code == 200
        done = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] >= 1
    with tls_server.client() as client:
        assert client.get("/v1/models").status_code == 401


def test_an_untrusted_certificate_and_plain_http_fail(tls_server: TlsServer):
    with pytest.raises(httpx.ConnectError), httpx.Client(timeout=10) as client:
        client.get(f"{tls_server.url}/readyz")  # system CAs do not know the test CA
    with pytest.raises(httpx.HTTPError), httpx.Client(timeout=10) as client:
        client.get(f"{tls_server.process.url}/readyz")  # http:// to the TLS port


def handshake(server: TlsServer, version: ssl.TLSVersion) -> tuple[str, str]:
    context = ssl.create_default_context()
    server.ca.configure_trust(context)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLSv1_1 is deprecated: good
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = version
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let the client offer the old protocol
    port = server.process.port
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        cipher = tls.cipher()
        return str(tls.version()), cipher[0] if cipher else ""


def test_tls_1_2_is_the_oldest_version_accepted(tls_server: TlsServer):
    version, cipher = handshake(tls_server, ssl.TLSVersion.TLSv1_2)
    assert version == "TLSv1.2" and ("GCM" in cipher or "CHACHA20" in cipher), cipher
    assert handshake(tls_server, ssl.TLSVersion.TLSv1_3)[0] == "TLSv1.3"
    # the server ends the handshake (an alert, or a close without one)
    with pytest.raises(ssl.SSLError, match="PROTOCOL_VERSION|UNSUPPORTED_PROTOCOL|EOF"):
        handshake(tls_server, ssl.TLSVersion.TLSv1_1)


def test_cors_for_configured_origins_only(tls_server: TlsServer):
    preflight = {"access-control-request-method": "POST"}
    with tls_server.client() as client:
        allowed = client.options("/v1/chat/completions", headers={"origin": ORIGIN, **preflight})
        other = client.options(
            "/v1/chat/completions", headers={"origin": "https://evil.example", **preflight}
        )
        refused = client.get("/v1/models", headers={"origin": ORIGIN})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    # a 401 still carries the CORS headers, so the browser app can read why
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in refused.headers["access-control-expose-headers"]


def test_a_key_in_the_url_is_refused_and_never_logged(tls_server: TlsServer):
    with tls_server.client() as client:
        response = client.get("/v1/models", params={"api_key": ADMIN_KEY})
    assert response.status_code == 401 and ADMIN_KEY not in response.text
    time.sleep(0.5)
    log = tls_server.log.read_text(errors="replace")
    assert "api_key=<redacted>" in log
    assert ADMIN_KEY not in log
    assert "AUTHENTICATION IS OFF" not in log and "https://127.0.0.1" in log


def test_admin_changes_land_in_the_encrypted_store(tls_server: TlsServer):
    with tls_server.client(authorization=f"Bearer {ADMIN_KEY}") as client:
        created = client.post("/v1/admin/api_keys", json={"name": "ci", "roles": ["user"]})
    assert created.status_code == 201
    stored = PolicyStore(tls_server.store, PASSPHRASE).load()
    assert [k.key_id for k in stored.keys] == [created.json()["id"]]
    assert oct(tls_server.store.stat().st_mode & 0o777) == "0o600"
    assert created.json()["key"].encode() not in tls_server.store.read_bytes()


def serve_exit(folder: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [INFERFLUX, "serve", "--port", "1", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_bad_store_or_certificate_stops_startup(tmp_path):
    ca = trustme.CA()
    config = write_config(tmp_path, ca)
    store = tmp_path / "policy.store"
    PolicyStore(store, PASSPHRASE, log2_n=14).save(Policy())
    env = {**tls_env(tmp_path), "INFERFLUX_POLICY_PASSPHRASE": "the wrong passphrase"}
    wrong = serve_exit(tmp_path, env, "--config", str(config))
    assert (
        wrong.returncode == 2
        and "passphrase (INFERFLUX_POLICY_PASSPHRASE) is wrong" in wrong.stderr
    )
    assert "the wrong passphrase" not in wrong.stderr + wrong.stdout
    data = bytearray(store.read_bytes())
    data[60] ^= 0xFF
    store.write_bytes(bytes(data))
    tampered = serve_exit(tmp_path, tls_env(tmp_path), "--config", str(config))
    assert tampered.returncode == 2 and "tampered with" in tampered.stderr
    no_key = {**tls_env(tmp_path), "INFERFLUX_TLS_KEY_PATH": str(tmp_path / "missing.pem")}
    missing = serve_exit(tmp_path, no_key, "--config", str(config))
    assert missing.returncode == 2 and "server.tls: cannot load" in missing.stderr


def test_without_auth_the_server_warns_loudly(server_url: str, server_log: Path):
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{server_url}/v1/models").status_code == 200
    assert "AUTHENTICATION IS OFF" in server_log.read_text(errors="replace")
