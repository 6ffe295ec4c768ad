"""Settings of `inferflux router`: the `router` section of `Settings` (issue 19).

The router is a thin HTTP proxy in front of several `inferflux serve` replicas; it reads
only this section (and `observability` for its logs). Same conventions as
`config/settings.py`: every field has a description and bounds, env names are
`INFERFLUX_ROUTER__<KEY>` (`INFERFLUX_ROUTER__REPLICAS='["http://a:8080"]'`), and the
loader (`config/loader.py`) merges YAML < env < CLI flags. Secrets (`stats_api_key`, a
password inside `redis_url`) are `SecretStr` and never quoted in an error.
"""

from __future__ import annotations

from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from inferflux.config.env_lists import split_env_list

RouterStrategy = Literal["prefix_affinity", "least_loaded", "round_robin"]


class RouterSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    replicas: list[str] = Field(
        default_factory=list,
        description="Base URLs of the `inferflux serve` replicas behind the router, e.g. "
        '`["http://10.0.0.1:8080", "http://10.0.0.2:8080"]` (a JSON list in env). '
        "`inferflux router --replica URL` (repeatable) sets it on the command line.",
    )
    replica_dns: str | None = Field(
        None,
        description="`HOST:PORT` (or `http(s)://HOST:PORT`) whose DNS records are the "
        "replicas, re-resolved every replica_dns_interval_s: a Kubernetes headless Service "
        "(one record per ready pod), so replicas that come and go join and leave the "
        "rotation on their own. Adds to `replicas`.",
    )
    replica_dns_interval_s: float = Field(
        5.0, gt=0, le=3600, description="How often replica_dns is resolved again."
    )
    host: str = Field("127.0.0.1", description="Address the router binds. 0.0.0.0 exposes it.")
    port: int = Field(8090, ge=1, le=65535, description="TCP port of the router.")
    routing: RouterStrategy = Field(
        "prefix_affinity",
        description="How a replica is picked: `prefix_affinity` (the replica that was sent "
        "the longest matching prompt prefix, unless it is over the balance thresholds; then "
        "the least loaded), `least_loaded`, or `round_robin`.",
    )
    balance_abs_threshold: int = Field(
        4,
        ge=0,
        le=100_000,
        description="Prefix affinity yields to the least loaded replica only when the "
        "preferred replica's load exceeds the least loaded one's by more than this many "
        "requests AND by balance_rel_threshold (SGLang's router has the same pair).",
    )
    balance_rel_threshold: float = Field(
        1.5,
        ge=1.0,
        le=1000.0,
        description="... and when the preferred replica's load is more than this multiple "
        "of the least loaded one's. A replica's load: the requests this router has open there, "
        "or the queue depth plus running sequences the replica reports, whichever is larger.",
    )
    health_interval_s: float = Field(
        1.0, gt=0, le=300, description="How often each replica's /readyz and /metrics are read."
    )
    health_timeout_s: float = Field(
        2.0, gt=0, le=300, description="Deadline of one health or load read."
    )
    eject_after_failures: int = Field(
        2,
        ge=1,
        le=100,
        description="Consecutive failed health checks that take a replica out of rotation "
        "(a refused connection on a live request ejects it at once). One passing check "
        "re-admits it.",
    )
    max_attempts: int = Field(
        3,
        ge=1,
        le=20,
        description="Tries of one request on different replicas when a replica refuses "
        "it before answering (connection refused, 503). Never retried once response bytes "
        "reached the client.",
    )
    max_request_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        le=1024 * 1024 * 1024,
        description="Largest request body the router accepts (413 above it, before any "
        "replica sees it). The body is read once and replayed on a retry.",
    )
    affinity_block_chars: int = Field(
        128,
        ge=16,
        le=65_536,
        description="Prefix affinity hashes a prompt's text in chained blocks of this many "
        "characters (no tokenizer in the router); a match counts whole blocks.",
    )
    affinity_max_blocks: int = Field(
        200_000,
        ge=100,
        le=100_000_000,
        description="Block hashes remembered per replica (least recently routed dropped first).",
    )
    connect_timeout_s: float = Field(
        2.0, gt=0, le=300, description="Deadline to open a connection to a replica."
    )
    read_timeout_s: float = Field(
        600.0,
        gt=0,
        le=86_400,
        description="Longest silence from a replica while a request is open (a stream "
        "between two chunks included).",
    )
    shutdown_grace_s: float = Field(
        5.0,
        ge=0,
        le=3600,
        description="On SIGTERM (or Ctrl-C) the router stops accepting, and the streams it "
        "relays may go on this long before they are cut (match the replicas' "
        "server.shutdown_grace_s so a drain is not cut short by the router).",
    )
    stats_api_key: SecretStr | None = Field(
        None,
        description="API key sent as `Authorization: Bearer` when the router reads a "
        "replica's /metrics (needed only with `observability.metrics.public: false` on the "
        "replicas; a `read`-scoped key is enough). Never logged.",
    )
    redis_url: SecretStr | None = Field(
        None,
        description="Redis shared by several router instances for the prefix-affinity "
        "directory (which replica was sent which prompt blocks), so routers in front of "
        "the same replicas agree. Unset: each router keeps its own directory in memory.",
    )
    redis_ttl_s: float = Field(
        3600.0,
        ge=1,
        le=30 * 86_400,
        description="A block in the shared directory expires this long after it was last routed.",
    )
    redis_timeout_s: float = Field(
        0.05,
        gt=0,
        le=10,
        description="Deadline of one directory read or write; a slower or failed Redis is "
        "skipped for 2 s (the router then routes on its own index).",
    )

    @field_validator("replicas", mode="before")
    @classmethod
    def _replicas_from_text(cls, value: object) -> object:
        return split_env_list(value, "replicas")

    @field_validator("replicas")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        cleaned = []
        for url in value:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(
                    f"replica {url!r} is not an http(s) URL: give e.g. http://127.0.0.1:8080"
                )
            cleaned.append(url.rstrip("/"))
        return cleaned

    @field_validator("replica_dns")
    @classmethod
    def _dns_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value if "://" in value else f"http://{value}")
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
            raise ValueError(
                f"replica_dns {value!r} must be HOST:PORT, e.g. inferflux-replicas:8080"
            )
        return f"{parts.scheme}://{parts.hostname}:{parts.port}"

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        if len(set(self.replicas)) != len(self.replicas):
            raise ValueError("router.replicas lists a replica twice: give each URL once")
        return self
