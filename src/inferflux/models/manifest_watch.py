"""`ManifestWatcher`: notices when the manifest file changes and reads the new version.

Polls (every `registry.poll_interval_ms`) the file's size, mtime and inode, which an
editor's save or an atomic rename both change, and re-reads it only then. A manifest that
does not parse is logged once per change and kept out: the registry keeps its last good
state until the file is fixed. Does not own: what a change means (models/lifecycle.py).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from inferflux.config.manifest import Manifest, read_manifest
from inferflux.errors import ConfigError

logger = logging.getLogger(__name__)

_Stamp = tuple[int, int, int]


def _stamp(path: Path) -> _Stamp | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


class ManifestWatcher:
    """The manifest at `path`, re-read when it changes. Blocking reads (small file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = _stamp(path)
        self.error: str | None = None  # why the current file was not applied

    def reread(self) -> None:
        """Read the file at the next poll even when it did not change since."""
        self._stamp = None

    def poll(self) -> Manifest | None:
        """The new manifest when the file changed since the last poll and parses; None
        when it did not change, or is invalid (then `error` says why)."""
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            manifest = read_manifest(self.path)
        except ConfigError as exc:
            self.error = exc.message
            logger.error("model manifest change ignored: %s", exc.message)
            return None
        self.error = None
        logger.info("model manifest %s changed: applying it", self.path)
        return manifest
