"""Fetching an image by URL without opening a server-side request hole (SSRF).

Owns `fetch_image`: http(s) only, no credentials in the URL; the host is resolved once
and every address it resolves to must be public (not private, loopback, link-local,
multicast, reserved, shared, nor an IPv4-mapped IPv6 form of those) unless
`multimodal.url_allowlist` names the host or a network holding the address; the
connection goes to the very address that was checked (the URL's host rides in the Host
header and TLS SNI), so a second DNS answer cannot swap in another (DNS rebinding); a
redirect is followed only to the same host or an allow-listed one, and is checked again;
the body is read as a stream and reading stops past `max_image_bytes`; the whole fetch,
DNS included, has one time limit. No proxy from the environment is used (it would
connect elsewhere than the checked address). Every refusal is an InvalidRequest (400)
naming the request field. Does not own sniffing or probing what came back (resolve.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import anyio
import httpx

from inferflux.config.multimodal_settings import MultimodalSettings
from inferflux.errors import InvalidRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _refused(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


@dataclass(frozen=True, slots=True)
class _Target:
    """One URL checked and pinned: where to connect and what to tell the server."""

    url: str  # the URL with the checked address in place of the host
    host: str  # the URL's host name, for the Host header and TLS SNI
    host_header: str


class FetchPolicy:
    """Which hosts and addresses may be fetched (`MultimodalSettings.url_allowlist`)."""

    def __init__(self, settings: MultimodalSettings) -> None:
        self.hosts = frozenset(e for e in settings.url_allowlist if not _is_network(e))
        self.networks = tuple(
            ipaddress.ip_network(e, strict=False) for e in settings.url_allowlist if _is_network(e)
        )

    def allows_host(self, host: str) -> bool:
        return host.lower() in self.hosts

    def allows_address(self, host: str, address: IPAddress) -> bool:
        """True for a public address, or any address of an allow-listed host or network."""
        if self.allows_host(host) or any(address in net for net in self.networks):
            return True
        return _is_public(address)


def _is_network(entry: str) -> bool:
    if "/" in entry:
        return True
    try:
        ipaddress.ip_address(entry.strip("[]"))
    except ValueError:
        return False
    return True


def _is_public(address: IPAddress) -> bool:
    """A global unicast address: not private, loopback, link-local, multicast, reserved,
    shared (100.64/10), unspecified, nor the IPv4-mapped / NAT64 form of one."""
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            return _is_public(mapped)
        if address in ipaddress.ip_network("64:ff9b::/96"):
            return _is_public(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return address.is_global and not address.is_multicast


def _why_not_public(address: IPAddress) -> str:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return f"an IPv4-mapped form of {_why_not_public(address.ipv4_mapped)}"
    for name in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):
        if getattr(address, f"is_{name}"):
            return f"a {name.replace('_', '-')} address ({address})"
    return f"not a public address ({address})"


async def _resolve(host: str, port: int, param: str) -> list[IPAddress]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise _refused(f"the image URL's host '{host}' does not resolve", param) from None
    addresses: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


async def _pin(url: str, policy: FetchPolicy, param: str) -> _Target:
    """`url` checked (scheme, credentials, every address of its host) and pinned to the
    first of its addresses. Raises InvalidRequest naming what is refused and why."""
    try:
        parts = urlsplit(url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
    except ValueError:
        raise _refused("the image URL is malformed", param) from None
    if parts.scheme not in _DEFAULT_PORTS:
        raise _refused(f"image URLs must be http or https, not '{parts.scheme}'", param)
    host = parts.hostname or ""
    if not host:
        raise _refused("the image URL has no host", param)
    try:
        host = host.encode("idna").decode("ascii")  # a Host header and SNI are ASCII
    except UnicodeError:
        raise _refused("the image URL's host is not a valid host name", param) from None
    if parts.username is not None or parts.password is not None:
        raise _refused("the image URL must not carry credentials (user:password@)", param)
    addresses = await _resolve(host, port, param)
    for address in addresses:
        if not policy.allows_address(host, address):
            raise _refused(
                f"the image URL's host '{host}' resolves to {_why_not_public(address)}; "
                "such hosts are fetched only when multimodal.url_allowlist names them",
                param,
            )
    if not addresses:
        raise _refused(f"the image URL's host '{host}' does not resolve", param)
    pinned = addresses[0]
    netloc = f"[{pinned}]" if pinned.version == 6 else str(pinned)
    netloc += f":{port}"
    host_header = host if parts.port is None else f"{host}:{parts.port}"
    if ":" in host:
        host_header = f"[{host}]" if parts.port is None else f"[{host}]:{parts.port}"
    target = parts._replace(netloc=netloc, fragment="").geturl()
    return _Target(target, host, host_header)


async def _read_capped(response: httpx.Response, max_bytes: int, param: str) -> bytes:
    too_big = _refused(
        f"the image at the URL is larger than {max_bytes} bytes (multimodal.max_image_bytes)",
        param,
    )
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_bytes:
        raise too_big
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise too_big
    return bytes(body)


async def _fetch(
    url: str, settings: MultimodalSettings, param: str, verify: ssl.SSLContext | bool
) -> bytes:
    policy = FetchPolicy(settings)
    first_host = ""
    timeout = httpx.Timeout(settings.fetch_timeout_s)
    async with httpx.AsyncClient(
        timeout=timeout, trust_env=False, follow_redirects=False, verify=verify
    ) as http:
        for _ in range(settings.max_redirects + 1):
            target = await _pin(url, policy, param)
            if first_host and target.host != first_host and not policy.allows_host(target.host):
                raise _refused(
                    f"the image URL redirects to another host ('{target.host}'); only "
                    "same-host redirects are followed unless multimodal.url_allowlist "
                    "names the host",
                    param,
                )
            first_host = first_host or target.host
            headers = {"Host": target.host_header, "Accept-Encoding": "identity"}
            extensions = {"sni_hostname": target.host}
            request = http.build_request("GET", target.url, headers=headers, extensions=extensions)
            response = await http.send(request, stream=True)
            try:
                if response.status_code in _REDIRECTS and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                if response.status_code != 200:
                    raise _refused(
                        f"fetching the image URL answered HTTP {response.status_code}", param
                    )
                return await _read_capped(response, settings.max_image_bytes, param)
            finally:
                await response.aclose()
    raise _refused(
        f"the image URL redirects more than {settings.max_redirects} times "
        "(multimodal.max_redirects)",
        param,
    )


async def fetch_image(
    url: str, settings: MultimodalSettings, param: str, *, verify: ssl.SSLContext | bool = True
) -> bytes:
    """The body at `url`, fetched under the module's rules within
    `settings.fetch_timeout_s` in all. `verify`: the TLS trust (True: httpx's default CA
    bundle; the certificate must name the URL's host). Raises InvalidRequest (param
    `param`) for every refusal and failure: scheme, credentials, address, redirect, size,
    status, timeout, a connection or TLS handshake that fails."""
    try:
        with anyio.fail_after(settings.fetch_timeout_s):
            return await _fetch(url, settings, param, verify)
    except TimeoutError:
        raise _refused(
            f"fetching the image URL took longer than {settings.fetch_timeout_s:g} s "
            "(multimodal.fetch_timeout_s)",
            param,
        ) from None
    except httpx.TimeoutException:
        raise _refused(
            f"fetching the image URL took longer than {settings.fetch_timeout_s:g} s "
            "(multimodal.fetch_timeout_s)",
            param,
        ) from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise _refused(f"fetching the image URL failed ({type(exc).__name__})", param) from None
