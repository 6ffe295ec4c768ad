"""Command-line entry points: `inferflux serve` (this package's `serve.py`) and `inferctl`."""

__all__: list[str] = []
