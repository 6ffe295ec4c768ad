"""Command-line entry points: `inferflux serve` (this package's `serve.py`), `inferflux
router` (`router.py`, dispatched by `main.py` without the server stack) and `inferctl`."""

__all__: list[str] = []
