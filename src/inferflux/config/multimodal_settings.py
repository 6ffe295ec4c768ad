"""The `multimodal` settings section: images in (issue 28, docs/api.md "Images").

Owns the limits the API holds every image to (bytes, pixels, images per request) and the
URL-fetching policy (off by default; when on, http(s) only, public addresses only unless
`url_allowlist` names a host or network, a time limit, redirects only to the same host).
"""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferflux.config.env_lists import split_env_list

MIB = 1024 * 1024


class MultimodalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    allow_urls: bool = Field(
        False,
        description="Fetch images that a request names by http(s) URL. Off: only data URIs "
        "and base64 are taken, and a URL gets 400. URL fetching is a server-side request "
        "surface (SSRF): when on, only public addresses are fetched unless url_allowlist "
        "names them.",
    )
    url_allowlist: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Hosts (`images.example.com`) and networks (`10.0.0.0/8`, `::1/128`, "
        "`127.0.0.1`) whose images may be fetched even when the address is private, "
        "loopback, link-local or otherwise not public, and that a redirect may go to "
        "(comma-separated in env). Empty: public addresses only.",
    )
    max_image_bytes: int = Field(
        20 * MIB,
        ge=1024,
        le=512 * MIB,
        description="Largest image file taken (bytes, after base64 decoding); a fetch stops "
        "reading past it. Larger: 400. Inline images also count toward "
        "server.max_request_bytes (base64 is 4/3 of the file): raise that too.",
    )
    max_pixels: int = Field(
        33_177_600,
        ge=64,
        le=178_000_000,
        description="Most pixels (width x height) an image may have, read from its header "
        "before any pixel is decoded: the decompression-bomb limit. The default is one 8K "
        "frame (7680x4320), whose RGB pixels take 100 MB; vision encoders downscale to "
        "well under 1 MP anyway. More: 400. At most 178 M (Pillow refuses more on its own).",
    )
    max_images_per_request: int = Field(
        16,
        ge=1,
        le=1024,
        description="Most images one request may carry (all messages together). More: 400.",
    )
    fetch_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="Seconds one image URL may take in all (connect, redirects, the whole "
        "body); past it the request gets 400.",
    )
    max_redirects: int = Field(
        3,
        ge=0,
        le=20,
        description="Redirects followed per image URL; each must stay on the same host "
        "(or go to one url_allowlist names) and passes the address checks again.",
    )

    @field_validator("url_allowlist", mode="before")
    @classmethod
    def _split_env(cls, value: object) -> object:
        return split_env_list(value, "url_allowlist")

    @field_validator("url_allowlist")
    @classmethod
    def _check_allowlist(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            if not entry or any(c.isspace() for c in entry):
                raise ValueError(
                    f"multimodal.url_allowlist entry {entry!r} is neither a host name nor "
                    "an address or network: write images.example.com or 10.0.0.0/8"
                )
            if "/" in entry:
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(
                        f"multimodal.url_allowlist entry {entry!r} is not a network: "
                        "write it as 10.0.0.0/8 or fd00::/8"
                    ) from None
        return [entry.lower() for entry in entries]
