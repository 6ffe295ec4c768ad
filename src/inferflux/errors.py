"""The one exception tree of InferFlux.

Every error raised on purpose derives from `InferfluxError`. Each class carries the
HTTP status and the OpenAI error `type`/`code` it maps to, so `api/errors.py` can render
any of them as `{"error": {"message", "type", "param", "code"}}` without guessing.

    InferfluxError                      500 server_error
    ├── InvalidRequest                  400 invalid_request_error
    │   ├── ContextLengthExceeded       400 context_length_exceeded
    │   ├── ConstraintFailed            400 constraint_failed (a grammar exceeded engine limits)
    │   └── RequestTooLarge             413 request_too_large
    │   └── ContentFiltered             400 content_filter (a guardrail blocked the request)
    ├── Unauthorized                    401 invalid_api_key (no or bad credentials)
    │   └── InvalidToken                401 invalid_token (a bearer JWT that does not verify)
    ├── PermissionDenied                403 insufficient_scope (authenticated, not allowed)
    │   ├── PolicyDenied                403 content_filter (the OPA content policy said no)
    │   └── CsrfRejected                403 csrf_token_invalid (a console session's write
    │                                       without its X-CSRF-Token header)
    ├── RateLimited                     429 rate_limit_exceeded (Retry-After, x-ratelimit-*)
    ├── ModelNotFound                   404 model_not_found
    ├── NotFound                        404 not_found (an unknown /debug request id, ...)
    ├── Conflict                        409 conflict (an admin change that clashes, ...)
    │   └── RestartRequired             409 restart_required (a setting only a restart changes)
    ├── Unprocessable                   422 unprocessable (well-formed admin input that names
    │                                   something unknown or unusable: a tenant, a tier, ...)
    ├── ServiceUnavailable              503 service_unavailable
    │   ├── NoWorkerReady               503 no_worker_ready
    │   ├── QueueFull                   503 queue_full (backpressure: above the high watermark)
    │   ├── PolicyUnavailable           503 policy_unavailable (OPA unreachable, store write)
    │   └── ShuttingDown                503 shutting_down (SIGTERM: draining, or a stream cut)
    ├── QueueTimeout                    408 queue_timeout (waited past scheduler.queue_timeout_s)
    ├── EngineError                     500 engine_error (a request failed inside the engine)
    │   ├── KvCacheFull                 503 kv_cache_full (no KV room, even alone in a step)
    │   └── EngineDeadError             500 worker_died (its worker process died)
    ├── ModelLoadError                  500 model_load_error: model file missing, unreadable,
    │   │                               refused by llama.cpp (startup: exit non-zero)
    │   ├── ModelFileNotFound           404 model_file_not_found (no such regular file)
    │   ├── ModelVerificationFailed     422 model_verification_failed (SHA-256, signature, path)
    │   └── QuantizationRefused         422 quantization_refused (not a higher-precision file)
    └── ConfigError                     invalid configuration (startup: exit non-zero)
        └── PolicyStoreError            the policy store cannot be read (startup: exit non-zero)
"""

from __future__ import annotations


class InferfluxError(Exception):
    """Base of every InferFlux error."""

    http_status: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def headers(self) -> dict[str, str]:
        """Extra response headers for this error (Retry-After, WWW-Authenticate, ...)."""
        return {}

    def to_body(self) -> dict[str, dict[str, str | None]]:
        """The OpenAI error envelope for this error."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(InferfluxError):
    """The request is malformed or asks for something impossible."""

    http_status = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class ConstraintFailed(InvalidRequest):
    """The request's output constraint could not be enforced at some token: its grammar
    exceeded the engine's per-step limits after the API's first-step check passed."""

    code = "constraint_failed"


class ContextLengthExceeded(InvalidRequest):
    """Prompt plus max_tokens does not fit the model context."""

    code = "context_length_exceeded"


class RequestTooLarge(InvalidRequest):
    """The request body is larger than `server.max_request_bytes`."""

    http_status = 413
    code = "request_too_large"


class ContentFiltered(InvalidRequest):
    """A guardrail blocked the request (input) or its output."""

    code = "content_filter"


class Unauthorized(InferfluxError):
    """No credentials, or credentials that do not verify. The message never echoes them."""

    http_status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"

    def headers(self) -> dict[str, str]:
        return {"www-authenticate": "Bearer"}


class InvalidToken(Unauthorized):
    """A bearer JWT that does not verify (expired, wrong audience, bad signature, ...)."""

    code = "invalid_token"

    def headers(self) -> dict[str, str]:
        return {"www-authenticate": 'Bearer error="invalid_token"'}


class PermissionDenied(InferfluxError):
    """Authenticated, but the principal lacks the scope (or tenant/model right) it needs."""

    http_status = 403
    error_type = "permission_error"
    code = "insufficient_scope"


class CsrfRejected(PermissionDenied):
    """A console session's state-changing request without its X-CSRF-Token header."""

    code = "csrf_token_invalid"


class PolicyDenied(PermissionDenied):
    """The external content policy (OPA) denied the request."""

    code = "content_filter"


class RateLimited(InferfluxError):
    """A rate limit (requests, tokens or concurrency per key or tenant) was hit.

    `limit_headers` are OpenAI's `x-ratelimit-*` headers for the limit that tripped."""

    http_status = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float,
        limit_headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s
        self.limit_headers = dict(limit_headers or {})

    def headers(self) -> dict[str, str]:
        seconds = max(1, int(-(-self.retry_after_s // 1)))  # ceil, at least 1
        return {"retry-after": str(seconds), **self.limit_headers}


class ModelNotFound(InferfluxError):
    """The request names a model this server does not serve."""

    http_status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class NotFound(InferfluxError):
    """The URL names something this server does not have (a request id /debug no longer
    keeps, a feature that is turned off)."""

    http_status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class Unprocessable(InferfluxError):
    """Well-formed input the server cannot use: an admin change that names a tenant or a
    rate-limit tier that does not exist, a model name that cannot be one, a pattern the
    guardrails' regex engine (RE2) cannot run. Nothing changes; `param` names the field."""

    http_status = 422
    error_type = "invalid_request_error"
    code = "unprocessable"


class Conflict(InferfluxError):
    """The request clashes with the current state (a tenant that exists, a key defined in
    the config file that the admin API cannot change, unloading the default model, ...)."""

    http_status = 409
    error_type = "invalid_request_error"
    code = "conflict"


class RestartRequired(Conflict):
    """PATCH /v1/admin/config named a setting that only takes effect at startup."""

    code = "restart_required"


class ServiceUnavailable(InferfluxError):
    """The server cannot take the request now; the client may retry."""

    http_status = 503
    error_type = "service_unavailable"
    code = "service_unavailable"
    retry_after_s: int = 1


class NoWorkerReady(ServiceUnavailable):
    """No engine worker is ready (still loading, or restarting after a crash)."""

    code = "no_worker_ready"


class QueueFull(ServiceUnavailable):
    """Backpressure: the queue is above its high watermark; retry after a while."""

    code = "queue_full"
    retry_after_s = 2


class PolicyUnavailable(ServiceUnavailable):
    """A policy decision point (OPA) could not be reached or answered nonsense: fail closed."""

    code = "policy_unavailable"


class ShuttingDown(ServiceUnavailable):
    """The server is stopping: a new request is refused, or an open stream was still
    running when `server.shutdown_grace_s` ran out. Another replica can take it."""

    code = "shutting_down"


class QueueTimeout(InferfluxError):
    """The request waited in the queue longer than `scheduler.queue_timeout_s` and never ran."""

    http_status = 408
    error_type = "timeout_error"
    code = "queue_timeout"
    retry_after_s: int = 1


class EngineError(InferfluxError):
    """A request failed inside the engine; other requests in the batch go on."""

    code = "engine_error"


class KvCacheFull(EngineError):
    """llama_decode found no KV room for a request even alone in a step (after the prefix
    cache was evicted and the batch split): the worker is short of memory; retry later."""

    http_status = 503
    error_type = "service_unavailable"
    code = "kv_cache_full"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "2"}


class EngineDeadError(EngineError):
    """The worker process serving the request died."""

    code = "worker_died"


class ModelLoadError(InferfluxError):
    """The model file is missing, unreadable, or llama.cpp refused it."""

    code = "model_load_error"


class ModelFileNotFound(ModelLoadError):
    """The model (or adapter) file a registry entry names does not exist, or is not a
    regular file."""

    http_status = 404
    error_type = "invalid_request_error"
    code = "model_file_not_found"


class ModelVerificationFailed(ModelLoadError):
    """The model file does not match its registry entry: SHA-256 mismatch (a modified or
    truncated file), a bad or missing signature, or a path escaping the models folder."""

    http_status = 422
    error_type = "invalid_request_error"
    code = "model_verification_failed"


class QuantizationRefused(ModelLoadError):
    """A model cannot be quantized to the level asked: the file is not of higher precision
    (only F32, F16, BF16 and Q8_0 files are quantized down)."""

    http_status = 422
    error_type = "invalid_request_error"
    code = "quantization_refused"


class ConfigError(InferfluxError):
    """The configuration is invalid; the message names the key, the value and the fix."""

    code = "config_error"


class PolicyStoreError(ConfigError):
    """The encrypted policy store is missing its passphrase, tampered with, truncated, from
    another store, or cannot be written. Never answered by falling back to an open policy."""

    code = "policy_store_error"
