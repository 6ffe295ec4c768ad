"""The local file behind a model path that is a URL, or a model with a `quantization`.

Owns: `local_model` (URL → downloaded file, then → quantized file, each once, each with
its SHA-256), its uses (`entry_file` and `entry_mmproj` for a manifest or admin-API
entry, `prepare_settings` for the `model` section), and the default cache folder of a server
without `registry.models_dir`. Fetching (network, quantizing) happens only with
`fetch=True`: at startup, and on a thread when the hub gets a new entry (models/hub.py).
Without it, a file that is not there yet is a ModelLoadError, so the event loop never
waits for a download. Does not own: downloading (download.py), quantizing (quantize.py),
verifying (engine/model_verify.py: the load hashes the file against the SHA-256 returned).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inferflux.config.manifest import ManifestEntry, is_model_url
from inferflux.config.settings import Settings
from inferflux.engine.model_verify import as_mmproj_error, resolve_in_folder
from inferflux.errors import ModelLoadError
from inferflux.models.download import Progress, download, downloaded
from inferflux.models.quantize import find_quantized, quantize, source_type

# Where URL models and quantized files go when registry.models_dir is unset (`model` section).
DEFAULT_CACHE_DIR = Path("~/.cache/inferflux/models")


@dataclass(frozen=True, slots=True)
class LocalModel:
    """The file to load and its SHA-256 (None: the `model` section's unchecked file)."""

    path: Path
    sha256: str | None


def needs_preparation(path: str | None, quantization: str | None) -> bool:
    """True when `path` is a URL or a quantization is asked for."""
    return path is not None and (is_model_url(path) or quantization is not None)


def local_model(
    path: str,
    sha256: str | None,
    quantization: str | None,
    folder: Path,
    resolve: Callable[[str], Path],
    *,
    fetch: bool,
    progress: Progress | None = None,
) -> LocalModel:
    """The local file for `path` (a URL or a local path, given to `resolve`) at
    `quantization`. `fetch` False: only what earlier fetches left (ModelLoadError
    otherwise). Raises what download.py and quantize.py raise."""
    if is_model_url(path):
        found = (
            download(path, folder, sha256, progress) if fetch else downloaded(path, folder, sha256)
        )
        if found is None:  # NOTE: fetch=False comes after a fetch: it failed (logged)
            raise ModelLoadError(
                f"{path} is not downloaded: its download failed (the log says why)", param="path"
            )
        local = LocalModel(found.path, found.sha256)
    else:
        local = LocalModel(resolve(path), sha256)
    if quantization is None:
        return local
    if fetch:
        done = quantize(local.path, local.sha256, quantization, folder)
        return LocalModel(done.path, done.sha256)
    cached = (
        find_quantized(local.path, local.sha256, quantization, folder) if local.sha256 else None
    )
    if cached is not None:
        return LocalModel(cached.path, cached.sha256)
    if source_type(local.path) == quantization:  # served as it is
        return local
    raise ModelLoadError(
        f"{path} is not quantized to {quantization}: quantizing failed (the log says why)",
        param="quantization",
    )


def entry_file(entry: ManifestEntry, folder: Path, *, fetch: bool) -> LocalModel:
    """The local file of a manifest or admin-API entry (paths resolve inside `folder`)."""
    return local_model(
        entry.path,
        entry.sha256,
        entry.quantization,
        folder,
        lambda path: resolve_in_folder(folder, path),
        fetch=fetch,
    )


def entry_mmproj(entry: ManifestEntry, folder: Path, *, fetch: bool) -> LocalModel | None:
    """The local mmproj of an entry (None without one): a URL's download, else its path
    inside `folder` (ModelVerificationFailed, param `mmproj`, outside it)."""
    if entry.mmproj is None:
        return None
    return local_mmproj(
        entry.mmproj,
        entry.mmproj_sha256,
        folder,
        lambda path: resolve_in_folder(folder, path, param="mmproj"),
        fetch=fetch,
    )


def local_mmproj(
    path: str, sha256: str | None, folder: Path, resolve: Callable[[str], Path], *, fetch: bool
) -> LocalModel:
    """`local_model` for an mmproj (never quantized); errors name the mmproj's fields."""
    try:
        return local_model(path, sha256, None, folder, resolve, fetch=fetch)
    except ModelLoadError as exc:
        raise as_mmproj_error(exc) from None


def entry_needs_preparation(entry: ManifestEntry) -> bool:
    """True when the entry's file or mmproj is a URL, or it asks for a quantization."""
    mmproj_url = entry.mmproj is not None and is_model_url(entry.mmproj)
    return mmproj_url or needs_preparation(entry.path, entry.quantization)


def fetch_entry(entry: ManifestEntry, folder: Path) -> None:
    """Download (and quantize) what the entry names, once. Blocking."""
    entry_file(entry, folder, fetch=True)
    entry_mmproj(entry, folder, fetch=True)


def settings_folder(settings: Settings) -> Path:
    """registry.models_dir, else DEFAULT_CACHE_DIR (expanded)."""
    folder = settings.registry.models_dir
    return (Path(folder) if folder else DEFAULT_CACHE_DIR).expanduser()


def prepare_settings(settings: Settings, resolve: Callable[[str], Path]) -> Settings:
    """`settings` with model.path a local file: a URL downloaded and/or the file (the
    default model's too) quantized; model.sha256 is then the served file's. The same for
    a model.mmproj URL (downloaded; model.mmproj_sha256 the file's). Unchanged when none
    is asked for. `resolve` finds a local model.path. Blocking."""
    return _prepare_mmproj(_prepare_model(settings, resolve))


def _prepare_mmproj(settings: Settings) -> Settings:
    model = settings.model
    if model.mmproj is None or not is_model_url(model.mmproj):
        return settings
    folder = settings_folder(settings)
    local = local_mmproj(model.mmproj, model.mmproj_sha256, folder, Path, fetch=True)
    update = {"mmproj": str(local.path), "mmproj_sha256": local.sha256}
    return settings.model_copy(update={"model": model.model_copy(update=update)})


def _prepare_model(settings: Settings, resolve: Callable[[str], Path]) -> Settings:
    model = settings.model
    path = model.path
    if model.quantization is None and (path is None or not is_model_url(path)):
        return settings
    local = local_model(
        path or str(resolve("")),
        model.sha256,
        model.quantization,
        settings_folder(settings),
        resolve,
        fetch=True,
    )
    update = {"path": str(local.path), "sha256": local.sha256, "quantization": None}
    return settings.model_copy(update={"model": model.model_copy(update=update)})
