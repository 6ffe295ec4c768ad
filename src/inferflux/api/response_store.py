"""`ResponseStore`: the responses kept server-side for `GET /v1/responses/{id}` and for
`previous_response_id` (api/responses), per owner, bounded and expiring.

Owns `StoredResponse` (the response object as GET returns it, this request's input items,
and the whole conversation a follow-up continues: history, input and output, as JSON
items in the Responses API's input shape; the dialect validates them again when a
follow-up uses them, so this module knows no dialect) and the
store: an LRU over (owner, id) holding at most `max_responses` entries and `max_bytes` of
their JSON, each dropped `ttl_s` after it was stored. An owner is the caller's tenant (a
key without one: its subject), so a response is invisible to every other owner (404, as if
it did not exist). In memory, one per API process; a WebSocket connection has a small one
of its own, so a chain continues on the socket with `store: false` too.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from inferflux.security.principal import Principal


def owner_of(principal: Principal) -> str:
    """The namespace of `principal`'s responses: its tenant, else its subject."""
    return f"tenant:{principal.tenant}" if principal.tenant else f"subject:{principal.subject}"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    body: dict[str, object]
    input_items: tuple[dict[str, object], ...]
    conversation: tuple[dict[str, object], ...]  # history + input + output
    num_bytes: int


class ResponseStore:
    """Responses by (owner, id): LRU under `max_responses` and `max_bytes`, each expiring
    `ttl_s` after it was put (None: never). One event loop; no locks."""

    def __init__(
        self,
        *,
        max_responses: int,
        max_bytes: int,
        ttl_s: float | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[StoredResponse, float]] = OrderedDict()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, owner: str, response: StoredResponse) -> None:
        """Keep `response` (replacing one of the same id), then drop the expired and the
        least recently used until the bounds hold. A response larger than `max_bytes`
        is not kept."""
        self._drop((owner, response.id))
        if response.num_bytes > self.max_bytes:
            return
        expires = self._clock() + self.ttl_s if self.ttl_s is not None else float("inf")
        self._entries[(owner, response.id)] = (response, expires)
        self.num_bytes += response.num_bytes
        self._evict()

    def get(self, owner: str, response_id: str) -> StoredResponse | None:
        """The response, None when `owner` has none of that id or it expired."""
        key = (owner, response_id)
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def delete(self, owner: str, response_id: str) -> bool:
        """Forget the response; False when `owner` had none of that id."""
        return self.get(owner, response_id) is not None and self._drop((owner, response_id))

    def _drop(self, key: tuple[str, str]) -> bool:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.num_bytes -= entry[0].num_bytes
        return entry is not None

    def _evict(self) -> None:
        now = self._clock()
        for key in [k for k, (_, expires) in self._entries.items() if expires <= now]:
            self._drop(key)
        while self._entries and (
            len(self._entries) > self.max_responses or self.num_bytes > self.max_bytes
        ):
            self._drop(next(iter(self._entries)))
