"""`ManifestStore`: writes the admin API's model changes back into the manifest file.

Owns: adding or replacing one entry, removing one, and moving the `default` flag, each as
one atomic rewrite (a temporary file in the same folder, then `os.replace`) of the file
`registry.path` names. The file keeps its form (a bare list, or a mapping whose `models:`
holds it, with its other keys) and every untouched entry keeps its exact fields, so their
signatures still verify. Comments are not kept (YAML is re-emitted). Returns the manifest
as written, which the lifecycle records as applied: the manifest watch then reads back
what it already serves and changes nothing (no reload loop). Does not own: what the
entries mean (models/lifecycle.py) or reading and checking them (config/manifest.py).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import yaml

from inferflux.config.manifest import Manifest, ManifestEntry, parse_manifest, read_manifest
from inferflux.errors import ConfigError

logger = logging.getLogger(__name__)

_RawEntry = dict[str, object]


class ManifestStore:
    """The manifest at `path`, rewritten in place. Blocking file I/O (a small file)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def upsert(self, entry: ManifestEntry) -> Manifest:
        """Add `entry`, or replace the entry with its id (in place). With `entry.default`,
        the flag leaves every other entry."""
        raw = entry_fields(entry)
        document, entries = self._read()
        ids = [item.get("id") for item in entries]
        if entry.id in ids:
            old = entries[ids.index(entry.id)]
            if old.get("default") and "default" not in raw and not raw.get("signature"):
                raw["default"] = True  # a swap or re-create keeps the model the default
            entries[ids.index(entry.id)] = raw
        else:
            entries.append(raw)
        if entry.default:
            entries = [item if item is raw else _without_default(item) for item in entries]
            if any(item.get("default") for item in entries if item is not raw):
                logger.warning(
                    "model manifest %s: %s is written without its default flag: a signed "
                    "entry keeps it (re-sign that entry without the flag)",
                    self.path,
                    entry.id,
                )
                entries = [_without_default(item) if item is raw else item for item in entries]
        return self._write(document, entries)

    def remove(self, model_id: str) -> Manifest | None:
        """Drop the entry `model_id` (None when the file has no such entry)."""
        document, entries = self._read()
        kept = [item for item in entries if item.get("id") != model_id]
        if len(kept) == len(entries):
            return None
        return self._write(document, kept)

    def set_default(self, model_id: str) -> Manifest | None:
        """Mark `model_id` the default and unmark the others. None (nothing written) when
        it has no entry, or when an entry whose flag would change is signed: its
        signature covers the flag (a warning says so)."""
        document, entries = self._read()
        changed = [
            item for item in entries if bool(item.get("default")) != (item.get("id") == model_id)
        ]
        if not any(item.get("id") == model_id for item in entries):
            return None
        signed = [str(item.get("id")) for item in changed if item.get("signature")]
        if signed:
            logger.warning(
                "model manifest %s: the default is not written: the signed entries %s "
                "would change (re-sign them with the new default flag)",
                self.path,
                ", ".join(signed),
            )
            return None
        entries = [_with_default(item, item.get("id") == model_id) for item in entries]
        return self._write(document, entries)

    def read(self) -> Manifest:
        return read_manifest(self.path)

    def _read(self) -> tuple[dict[str, object] | None, list[_RawEntry]]:
        """The file's top-level mapping (None: the bare-list form) and its entries.
        Raises ConfigError when the file does not hold a valid manifest."""
        manifest_text = self.path.read_text(encoding="utf-8")
        parse_manifest(manifest_text, str(self.path))  # refuse to rewrite a broken file
        data = yaml.safe_load(manifest_text)
        if isinstance(data, list):
            return None, [dict(item) for item in data]
        if not isinstance(data, dict) or not isinstance(data.get("models"), list):
            raise ConfigError(f"model manifest {self.path} has no `models:` list")
        return data, [dict(item) for item in data["models"]]

    def _write(self, document: dict[str, object] | None, entries: list[_RawEntry]) -> Manifest:
        """Replace the file atomically with `entries` in the form it had."""
        data: object = entries if document is None else {**document, "models": entries}
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        manifest = parse_manifest(text, str(self.path))  # never write what cannot be read
        folder = self.path.parent
        handle, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=folder)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            _copy_mode(self.path, Path(temporary))
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        logger.info("model manifest %s written (%d entries)", self.path, len(entries))
        return manifest


def entry_fields(entry: ManifestEntry) -> _RawEntry:
    """The fields of `entry` as written (unset ones left out, as a signature covers)."""
    return entry.model_dump(mode="json", exclude_unset=True, exclude_none=True)


def _without_default(item: _RawEntry) -> _RawEntry:
    """`item` without the default flag, unless it is signed (the signature covers it)."""
    return item if item.get("signature") else _with_default(item, False)


def _with_default(item: _RawEntry, default: bool) -> _RawEntry:
    if bool(item.get("default")) == default:
        return item
    changed = {key: value for key, value in item.items() if key != "default"}
    if default:
        changed["default"] = True
    return changed


def _copy_mode(source: Path, target: Path) -> None:
    try:
        os.chmod(target, source.stat().st_mode & 0o777)
    except OSError:
        return
