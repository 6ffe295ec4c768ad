"""`inferctl`: a thin HTTP client of an InferFlux server (no server internals imported).

Modules: `app` (the Typer app and the request/response commands), `client` (target, auth,
JSON and SSE over httpx), `chat_repl` (`chat --interactive`), `pull` (GGUF download from
the Hugging Face Hub into a models manifest), and the admin commands: `admin` (models,
adapters), `admin_keys` (api-keys, tenants), `admin_policy` (rate-limit, guardrails),
`admin_config` (config). Exit codes: 0 ok, 1 server or API error, 2 usage error.
"""

from __future__ import annotations

from inferflux.cli.inferctl.app import app, main

__all__ = ["app", "main"]
