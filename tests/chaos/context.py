"""`ChaosRun`: what every fault is given (where logs go, how long to load)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChaosRun:
    """`log_dir`: servers' logs and scratch files. `quick`: the short version `make test`
    runs (fewer seconds of load before and after a fault). `streams`: concurrent clients.
    `soak_requests`: requests the soak sends."""

    log_dir: Path
    quick: bool = False
    streams: int = 16
    soak_requests: int = 10_000

    def seconds(self, full_s: float) -> float:
        """A phase's length: `full_s`, or a third of it when quick."""
        return full_s / 3 if self.quick else full_s
