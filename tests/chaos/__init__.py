"""The chaos and soak suite (`make chaos`, docs/reliability.md): faults injected into real
`inferflux serve` processes under load, reported per fault in RELIABILITY.md. A fast subset
runs in `make test` (tests/integration/test_chaos.py)."""
