"""The admin API (`/v1/admin/*`, `admin` scope): `api_keys`, `tenants`, `limits`
(rate_limit and guardrails), `config` (live tuning), `workers` (runtime scaling), `usage`
(tokens and requests per key, tenant and model over a window); shared
plumbing in `changes`, bodies and views in `protocol`.
`router` bundles those routes; `api/app.py` includes it with `require_scope(Scope.ADMIN)`.
The model lifecycle has routers of its own, included beside it: `models` (`admin` scope)
and `adapters` (LoRA adapters, `adapter-manager` scope)."""

from fastapi import APIRouter

from inferflux.api.admin import api_keys, config, limits, tenants, usage, workers

router = APIRouter()
for _module in (api_keys, tenants, limits, config, workers, usage):
    router.include_router(_module.router)

__all__ = ["router"]
