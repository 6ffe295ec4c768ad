"""Ollama's `POST /api/pull`: `ollama pull NAME` downloads a GGUF and registers it.

ADMIN-ONLY: `_ROUTERS` in api/app.py gives this router `Scope.ADMIN`. Owns: mapping an
Ollama name to a source, the progress lines in Ollama's format, and registering the
model through the same lifecycle path as `POST /v1/admin/models {"action": "load"}`, so
`/api/tags` lists it. The download is models/download.py (atomic, SHA-256 checked against
the hub's LFS hash), into the models folder (`registry.models_dir`).

Names: `hf.co/ORG/REPO` (the repo's only .gguf), `hf.co/ORG/REPO:FILE.gguf`, or
`hf.co/ORG/REPO:LABEL` (the one .gguf with LABEL, e.g. `Q4_K_M`, in its name), like
Ollama's own hf.co support; the model is registered as `hf.co/ORG/REPO` (ids cannot hold
a `:`). A name of `registry.pull_sources` maps to its hf:// URL and keeps its name. Any
other name answers 404 `pull model manifest: file does not exist`, Ollama's text.

Stream (default): NDJSON lines `{"status": "pulling manifest"}`, `{"status": "pulling
<sha12>", "digest": "sha256:…", "total": N, "completed": M}` while bytes arrive,
`{"status": "verifying sha256 digest"}`, `{"status": "writing manifest"}`,
`{"status": "success"}`; a failure after the first line is a last `{"error": "…"}` line.
`"stream": false`: one `{"status": "success"}`. A missing repo or file is found before
the first line, so it is an HTTP 404. `insecure` is accepted and ignored. A client that
disconnects stops the download (nothing partial is kept).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from inferflux.api.deps import json_body
from inferflux.api.ollama.render import NdjsonResponse, json_response, ndjson_line
from inferflux.api.openapi import OLLAMA_ERROR, error_doc
from inferflux.api.state import StateDep
from inferflux.config.manifest import MODEL_NAME_PATTERN, ManifestEntry
from inferflux.errors import InferfluxError, InvalidRequest, ModelFileNotFound, ModelLoadError
from inferflux.models.download import (
    Downloaded,
    HubRef,
    RemoteFile,
    download_hub_file,
    hub_ref,
    parse_hf_url,
    resolve_hub_file,
)
from inferflux.models.hub import ModelHub

router = APIRouter(tags=["ollama"])

_HUB_PREFIXES = ("hf.co/", "huggingface.co/")
NOT_FOUND = "pull model manifest: file does not exist"


class OllamaPullRequest(BaseModel):
    """Body of POST /api/pull (`name` is Ollama's deprecated spelling of `model`)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    model: str | None = Field(None, max_length=512)
    name: str | None = Field(None, max_length=512)
    insecure: bool | None = None
    stream: bool = True


PullBody = Annotated[OllamaPullRequest, Depends(json_body(OllamaPullRequest))]


@dataclass(frozen=True, slots=True)
class PullSource:
    """Where a name comes from and the id it is registered as."""

    model_id: str
    ref: HubRef
    label: str | None = None  # a tag that picks the file by name (`Q4_K_M`)


def pull_source(name: str, sources: dict[str, str]) -> PullSource:
    """The source of an Ollama name (see the module doc). Raises ModelFileNotFound (an
    unknown name: Ollama's text), InvalidRequest (a malformed hf.co name)."""
    bare = name.removesuffix(":latest")
    if bare in sources:
        return PullSource(bare, parse_hf_url(sources[bare]))
    prefix = next((p for p in _HUB_PREFIXES if bare.startswith(p)), None)
    if prefix is None:
        raise ModelFileNotFound(NOT_FOUND, param="model")
    repo, _, tag = bare.removeprefix(prefix).partition(":")
    model_id = f"hf.co/{repo}"
    if not _valid_id(model_id):
        raise InvalidRequest(f"{name!r}: expected hf.co/ORG/REPO[:FILE|:LABEL]", param="model")
    if tag.endswith(".gguf"):
        return PullSource(model_id, hub_ref(repo, tag))
    return PullSource(model_id, hub_ref(repo, None), label=tag or None)


def _valid_id(model_id: str) -> bool:
    return re.fullmatch(MODEL_NAME_PATTERN, model_id) is not None


@router.post(
    "/api/pull",
    responses={
        404: error_doc("No such model: not hf.co/…, not in registry.pull_sources", OLLAMA_ERROR)
    },
)
async def pull(state: StateDep, body: PullBody) -> Response:
    """Download a model (hf.co/ORG/REPO[:FILE|:LABEL] or a registry.pull_sources name),
    verify it and register it; streams Ollama's progress lines unless `stream` is false."""
    name = body.model or body.name
    if not name:
        raise InvalidRequest("model is required", param="model")
    source = pull_source(name, state.settings.registry.pull_sources)
    remote = await asyncio.to_thread(resolve_hub_file, source.ref, source.label)
    hub = state.models
    if not body.stream:
        downloaded = await asyncio.to_thread(download_hub_file, remote, hub.models_dir)
        await _register(hub, source, downloaded)
        return json_response({"status": "success"})
    return NdjsonResponse(_progress_lines(hub, source, remote))


async def _progress_lines(
    hub: ModelHub, source: PullSource, remote: RemoteFile
) -> AsyncGenerator[bytes, None]:
    yield ndjson_line({"status": "pulling manifest"})
    try:
        downloaded = None
        async for item in _download(hub, remote):
            if isinstance(item, Downloaded):
                downloaded = item
            else:
                yield ndjson_line(_progress(remote, *item))
        assert downloaded is not None  # NOTE: _download ends with the file
        yield ndjson_line({"status": "verifying sha256 digest"})
        yield ndjson_line({"status": "writing manifest"})
        await _register(hub, source, downloaded)
    except InferfluxError as exc:
        yield ndjson_line({"error": exc.message})
        return
    yield ndjson_line({"status": "success"})


def _progress(remote: RemoteFile, completed: int, total: int | None) -> dict[str, object]:
    line: dict[str, object] = {"status": f"pulling {remote.ref.filename}"}
    if remote.sha256:
        line = {"status": f"pulling {remote.sha256[:12]}", "digest": f"sha256:{remote.sha256}"}
    size = total or remote.size
    return {**line, "total": size, "completed": completed} if size else line


async def _download(
    hub: ModelHub, remote: RemoteFile
) -> AsyncGenerator[tuple[int, int | None] | Downloaded, None]:
    """The download on a thread: (completed, total) items as bytes arrive, then the file.
    Closing the generator (client gone) stops the thread at its next block."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, int | None]] = asyncio.Queue()
    stop = threading.Event()

    def progress(completed: int, total: int | None) -> None:
        if stop.is_set():
            raise ModelLoadError("pull cancelled: the client went away")
        loop.call_soon_threadsafe(queue.put_nowait, (completed, total))

    task = asyncio.ensure_future(
        asyncio.to_thread(download_hub_file, remote, hub.models_dir, None, progress)
    )
    try:
        while not task.done() or not queue.empty():
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
        yield task.result()
    finally:
        stop.set()
        task.add_done_callback(lambda done: done.cancelled() or done.exception())


async def _register(hub: ModelHub, source: PullSource, downloaded: Downloaded) -> None:
    """Register and load the file, as an admin-API load does (/api/tags lists it then)."""
    entry = ManifestEntry.model_validate(
        {
            "id": source.model_id,
            "path": str(downloaded.path),
            "sha256": downloaded.sha256,
            "source": downloaded.source,
        }
    )
    await asyncio.shield(hub.load(entry))
