"""FakeBlobDisk: the disk tier's `BlobDisk` in memory, with a queue that holds writes
until `complete()` (so tests can fill it and see refusals). Pure-logic tests only."""

from __future__ import annotations


class FakeBlobDisk:
    def __init__(self, queue_depth: int = 1_000_000) -> None:
        self.queue_depth = queue_depth
        self.files: dict[str, bytes] = {}
        self.pending: dict[str, bytes] = {}

    def write(self, key: str, data: bytes, *, block: bool = False) -> bool:
        if len(self.pending) >= self.queue_depth:
            if not block:
                return False
            self.complete()
        self.pending[key] = data
        return True

    def complete(self) -> None:
        """Finish every write in flight."""
        self.files.update(self.pending)
        self.pending.clear()

    def read(self, key: str) -> bytes | None:
        return self.pending.get(key, self.files.get(key))

    def delete(self, key: str) -> None:
        self.pending.pop(key, None)
        self.files.pop(key, None)

    def written(self, key: str) -> bool:
        return key in self.files

    def total_bytes(self) -> int:
        return sum(map(len, self.files.values())) + sum(map(len, self.pending.values()))
