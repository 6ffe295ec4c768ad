"""Images in (issue 28), the API side: what a request names (`refs.py`), fetching a URL
safely (`fetch.py`) and the checks before an image reaches the engine (`resolve.py`).
Every dialect parses its image fields with `url_ref` / `base64_ref` into an `ImageSet`;
the generation planner resolves it. Decoding pixels is `engine.images`' (the worker's).
"""

from inferflux.api.images.fetch import FetchPolicy, fetch_image
from inferflux.api.images.refs import (
    ImageRef,
    ImageSet,
    base64_ref,
    decode_base64,
    parse_data_uri,
    take_image,
    url_ref,
)
from inferflux.api.images.resolve import (
    ResolvedImage,
    check_image_refs,
    resolve_image,
    resolve_images,
)

__all__ = [
    "FetchPolicy",
    "ImageRef",
    "ImageSet",
    "ResolvedImage",
    "base64_ref",
    "check_image_refs",
    "decode_base64",
    "fetch_image",
    "parse_data_uri",
    "resolve_image",
    "resolve_images",
    "take_image",
    "url_ref",
]
