"""api/images/fetch.py against a real loopback HTTP server: every SSRF refusal is a 400
naming the field and saying why, allow-listed fetches work, limits hold."""

from __future__ import annotations

import dataclasses
import socket
import ssl
import time

import pytest
import trustme

from inferflux.api.images import ImageRef, fetch_image, resolve_images
from inferflux.config.multimodal_settings import MultimodalSettings
from inferflux.errors import InvalidRequest
from tests.fakes.engine import fake_model_info

from .loopback_server import ImageServer

PARAM = "messages[0].content[1].image_url"


@pytest.fixture(scope="module")
def server():
    server = ImageServer()
    yield server
    server.close()


def settings(**fields) -> MultimodalSettings:
    return MultimodalSettings(allow_urls=True, **fields)


def loopback(**fields) -> MultimodalSettings:
    return settings(url_allowlist=["127.0.0.1"], **fields)


async def refused(url: str, config: MultimodalSettings) -> str:
    with pytest.raises(InvalidRequest) as caught:
        await fetch_image(url, config, PARAM)
    assert caught.value.param == PARAM
    assert caught.value.http_status == 400
    return caught.value.message


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:{port}/cat.png", "a loopback address (127.0.0.1)"),
        ("http://localhost:{port}/cat.png", "loopback address"),
        ("http://10.1.2.3/cat.png", "a private address (10.1.2.3)"),
        ("http://192.168.1.1/cat.png", "a private address"),
        ("http://169.254.169.254/latest/meta-data/", "a link-local address (169.254.169.254)"),
        ("http://[::1]:{port}/cat.png", "a loopback address (::1)"),
        ("http://[::ffff:127.0.0.1]:{port}/", "an IPv4-mapped form of a loopback address"),
        ("http://[::ffff:a9fe:a9fe]/", "an IPv4-mapped form of a link-local address"),
        ("http://0.0.0.0:{port}/", "address (0.0.0.0)"),
        ("http://2130706433:{port}/cat.png", "a loopback address (127.0.0.1)"),
        ("http://224.0.0.1/", "a multicast address"),
        ("http://100.64.0.1/", "not a public address (100.64.0.1)"),
    ],
)
async def test_non_public_addresses_are_refused(server, url, why):
    message = await refused(url.format(port=server.port), settings())
    assert why in message
    assert "multimodal.url_allowlist" in message


@pytest.mark.parametrize(
    "url", ["ftp://example.com/cat.png", "file:///etc/passwd", "gopher://127.0.0.1:70/"]
)
async def test_only_http_and_https(url):
    assert "image URLs must be http or https" in await refused(url, settings())


async def test_international_and_invalid_host_names():
    message = await refused("http://bücher.invalid/cat.png", settings())
    assert "host 'xn--bcher-kva.invalid' does not resolve" in message
    message = await refused(f"http://{'a' * 70}.com/cat.png", settings())
    assert "not a valid host name" in message


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1",
        "http://127.0.0.1:99999/",
        "http://exa mple.com/",
        "http:///path",
        "http://127.0.0.1:{port}/\x00",
        "http://127.0.0.1:{port}/ü ?q=\r\nX: y",
        "https://",
    ],
)
async def test_odd_urls_are_400s_never_crashes(server, url):
    await refused(url.replace("{port}", str(server.port)), loopback())


async def test_credentials_in_the_url_are_refused(server):
    message = await refused(f"http://user:pw@127.0.0.1:{server.port}/cat.png", loopback())
    assert "credentials" in message


async def test_an_allow_listed_address_is_fetched_with_its_host_header(server):
    data = await fetch_image(f"{server.url}/cat.png", loopback(), PARAM)
    assert data == server.image
    assert server.seen_hosts[-1] == f"127.0.0.1:{server.port}"


async def test_an_allow_listed_network_or_host_name(server):
    net = settings(url_allowlist=["127.0.0.0/8"])
    assert await fetch_image(f"{server.url}/cat.png", net, PARAM) == server.image
    named = settings(url_allowlist=["LOCALHOST"])
    url = f"http://localhost:{server.port}/cat.png"
    assert await fetch_image(url, named, PARAM) == server.image
    assert server.seen_hosts[-1] == f"localhost:{server.port}"


async def test_same_host_redirects_are_followed(server):
    assert await fetch_image(f"{server.url}/same-host", loopback(), PARAM) == server.image


async def test_a_redirect_to_another_host_is_refused(server):
    message = await refused(f"{server.url}/other-host", loopback())
    assert "redirects to another host ('localhost')" in message


async def test_a_redirect_to_an_allow_listed_host_is_followed(server):
    both = settings(url_allowlist=["127.0.0.1", "localhost"])
    assert await fetch_image(f"{server.url}/other-host", both, PARAM) == server.image


async def test_redirect_loops_end(server):
    message = await refused(f"{server.url}/loop", loopback(max_redirects=2))
    assert "redirects more than 2 times" in message


async def test_a_slow_server_past_the_timeout(server):
    started = time.monotonic()
    message = await refused(f"{server.url}/slow", loopback(fetch_timeout_s=0.5))
    assert "took longer than 0.5 s" in message
    assert time.monotonic() - started < 2.5


async def test_a_slow_body_hits_the_total_time_limit(server):
    """Bytes keep coming (each read is fast): only the total limit can end it."""
    started = time.monotonic()
    message = await refused(f"{server.url}/drip", loopback(fetch_timeout_s=1.0))
    assert "took longer than 1 s" in message
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("path", ["/big", "/big-unsized"])
async def test_a_too_big_body_stops_reading(server, path):
    message = await refused(f"{server.url}{path}", loopback(max_image_bytes=100_000))
    assert "larger than 100000 bytes (multimodal.max_image_bytes)" in message


async def test_error_status_and_unresolvable_host(server):
    assert "HTTP 404" in await refused(f"{server.url}/missing", loopback())
    message = await refused("http://no-such-host.invalid/cat.png", settings())
    assert "does not resolve" in message


async def test_a_closed_port_fails_cleanly():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    message = await refused(f"http://127.0.0.1:{port}/cat.png", loopback())
    assert "fetching the image URL failed (ConnectError)" in message


@pytest.fixture(scope="module")
def tls_server():
    """The loopback server behind TLS with a certificate for `localhost` from a test CA."""
    ca = trustme.CA()
    server = ImageServer()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    yield server, client_context
    server.close()


async def test_https_is_pinned_to_the_checked_address_and_verifies_the_host(tls_server):
    """The connection goes to the checked IP, yet TLS SNI and the certificate check use the
    URL's host name: a certificate for another name fails."""
    server, trust = tls_server
    allowed = settings(url_allowlist=["localhost", "127.0.0.1"])
    url = f"https://localhost:{server.port}/cat.png"
    assert await fetch_image(url, allowed, PARAM, verify=trust) == server.image
    # the same server by IP: the certificate names localhost, not 127.0.0.1
    message = await refused_with(f"https://127.0.0.1:{server.port}/cat.png", allowed, trust)
    assert "fetching the image URL failed (ConnectError)" in message
    # an untrusted certificate
    message = await refused_with(url, allowed, True)
    assert "fetching the image URL failed" in message


async def refused_with(url: str, config: MultimodalSettings, verify) -> str:
    with pytest.raises(InvalidRequest) as caught:
        await fetch_image(url, config, PARAM, verify=verify)
    return caught.value.message


async def test_a_request_fetches_its_urls_together(server):
    """Three slow URLs under a 1 s limit: refused after about one limit, not three."""
    info = dataclasses.replace(fake_model_info(), mmproj="/m/mmproj.gguf")
    refs = [ImageRef(f"images[{i}]", url=f"{server.url}/slow") for i in range(3)]
    started = time.monotonic()
    with pytest.raises(InvalidRequest, match="took longer than 1 s"):
        await resolve_images(refs, loopback(fetch_timeout_s=1.0), info)
    assert time.monotonic() - started < 2.5
    refs = [ImageRef(f"images[{i}]", url=f"{server.url}/cat.png") for i in range(3)]
    images = await resolve_images(refs, loopback(), info)
    assert [image.data for image in images] == [server.image] * 3
