"""Ollama's blob routes: `HEAD /api/blobs/<digest>` and `POST /api/blobs/<digest>` (admin).

ADMIN-ONLY (the manage router's scope). What `ollama create` with `files` sends first:
the GGUF's bytes under their digest, stored by `BlobStore` (models/blobs.py) in the
models folder once their SHA-256 matches. The body is streamed to disk, bounded by
`registry.max_blob_bytes` instead of `server.max_request_bytes` (the body-size
middleware leaves this path to the route). HEAD: 200 when the blob is stored, else 404;
POST: 201 once stored, 400 for a digest mismatch or a file that is not a GGUF, 413 past
the limit.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from inferflux.api.admin.changes import record_change
from inferflux.api.ollama.manage import blob_store
from inferflux.api.state import LifecycleDep, StateDep
from inferflux.errors import RequestTooLarge
from inferflux.models.blobs import digest_hex

BLOBS_PREFIX = "/api/blobs/"

router = APIRouter(tags=["ollama"])


@router.head("/api/blobs/{digest}")
async def blob_exists(digest: str, lifecycle: LifecycleDep, state: StateDep) -> Response:
    """200 when the blob is stored, 404 when it is not (the client then uploads it)."""
    found = blob_store(lifecycle, state).exists(digest_hex(digest))
    return Response(status_code=200 if found else 404)


@router.post("/api/blobs/{digest}", status_code=201)
async def upload_blob(
    digest: str, request: Request, lifecycle: LifecycleDep, state: StateDep
) -> Response:
    """Store the body as the blob `digest` (a GGUF whose SHA-256 it is)."""
    sha256 = digest_hex(digest)
    blobs = blob_store(lifecycle, state)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > blobs.max_bytes:
        raise RequestTooLarge(
            f"the blob ({declared} bytes) is larger than the server's limit of "
            f"{blobs.max_bytes} bytes (registry.max_blob_bytes)"
        )
    await blobs.write(sha256, request.stream())  # again when stored: the body is read
    record_change(request, f"model.blob_upload:sha256:{sha256}", {})
    return Response(status_code=201)
